"""Block-scaled symmetric W8A8 in the PyTorch layer, on the CPU: the custom op
``torch.ops.cutlass_ops.linear_w8a8_block_scaled`` (its CPU kernel is the float64 reference rounded to x's
dtype), ``QuantLinear(mode="w8a8_block_scaled")``, ``W8A8BlockScaledConfig`` with ``quantize_`` and the
safetensors round trip, gradients, torch.compile, and the public function's checks before any GPU work.

The Hopper kernel behind the same op and module is checked in tests/gpu/test_w8a8_block_scaled_module_gpu.py.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_ops
from cutlass_ops import quantize_model
from cutlass_ops.nn import LINEAR_MODES, QuantLinear
from cutlass_ops.quantize_model import W8A8BlockScaledConfig, config_from_dict
from cutlass_ops.w8a8.block_scaled import BlockScaledWeight, linear_block_scaled_reference
from cutlass_ops.w8a8.tiles import BLOCK_SCALED_SIZES

ops = torch.ops.cutlass_ops


def _weight(N: int, K: int, bs: int, seed: int = 0) -> BlockScaledWeight:
    return cutlass_ops.quantize_weight_block_scaled(torch.randn(N, K, generator=torch.Generator().manual_seed(seed)),
                                                    bs)


def _args(lead=(2, 3), N=200, K=256, bs=64, dtype=torch.float32, bias=True, act=1, seed=0):
    """The op's arguments (x, qweight, scale, bias, act, block_size): N not a multiple of bs (a short last
    N block), x with leading dims."""
    g = torch.Generator().manual_seed(seed + 1)
    w = _weight(N, K, bs, seed)
    x = torch.randn(*lead, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x, w.qweight, w.scale, b, act, bs


# --------------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_op_cpu_is_the_float64_reference(dtype, act, bias):
    x, q, s, b, act, bs = _args(dtype=dtype, bias=bias, act=act, seed=act)
    y = ops.linear_w8a8_block_scaled(x, q, s, b, act, bs)
    want = linear_block_scaled_reference(x, BlockScaledWeight(q, s, bs), b, act).to(dtype)
    assert y.shape == (2, 3, 200) and y.dtype == dtype
    assert torch.equal(y, want)


def test_op_takes_zero_rows():
    x, q, s, b, act, bs = _args(lead=(0,))
    y = ops.linear_w8a8_block_scaled(x, q, s, b, act, bs)
    assert y.shape == (0, 200) and y.dtype == x.dtype


OPCHECK_CASES = {
    "bias_relu": _args(),
    "no_bias_relu6_2d": _args(lead=(5,), N=37, K=128, bs=128, bias=False, act=2),
    "grad": (_args()[0].requires_grad_(True), *_args()[1:3], _args()[3].requires_grad_(True), 0, 64),
}


@pytest.mark.parametrize("name", list(OPCHECK_CASES))
def test_opcheck_cpu(name):
    torch.library.opcheck(ops.linear_w8a8_block_scaled, OPCHECK_CASES[name])


def test_fake_kernel_gives_the_real_shape_and_dtype():
    args = _args(dtype=torch.bfloat16)
    real = ops.linear_w8a8_block_scaled(*args)
    with FakeTensorMode() as mode:
        fake = ops.linear_w8a8_block_scaled(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                              for a in args))
    assert (fake.shape, fake.dtype, fake.stride()) == (real.shape, real.dtype, real.stride())


def test_op_checks_the_weight_again_after_an_in_place_change():
    x, q, s, b, act, bs = _args()
    ops.linear_w8a8_block_scaled(x, q, s, b, act, bs)
    s[0, 0] = float("nan")
    with pytest.raises(ValueError, match="BlockScaledWeight.scale holds NaN or Inf"):
        ops.linear_w8a8_block_scaled(x, q, s, b, act, bs)


# --------------------------------------------------------------------------------------------
# QuantLinear
# --------------------------------------------------------------------------------------------

def _linear(K=256, N=200, bias=True, bs=128, seed=0) -> tuple[nn.Linear, QuantLinear]:
    torch.manual_seed(seed)
    lin = nn.Linear(K, N, bias=bias)
    return lin, QuantLinear.from_float(lin, W8A8BlockScaledConfig(block_size=bs))


def test_from_float_holds_the_block_scaled_weight():
    lin, q = _linear()
    assert "w8a8_block_scaled" in LINEAR_MODES
    assert (q.mode, q.block_size, q.offset) == ("w8a8_block_scaled", 128, None)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (200, 256)
    assert q.scale.dtype == torch.float32 and q.scale.shape == (2, 2)  # ceil(200 / 128) x 256 / 128
    w = q.weight()
    assert isinstance(w, BlockScaledWeight) and w.qweight is q.qweight and w.scale is q.scale
    assert q.weight() is w  # the view is cached
    want = cutlass_ops.quantize_weight_block_scaled(lin.weight.detach(), 128)
    assert torch.equal(q.qweight, want.qweight) and torch.equal(q.scale, want.scale)
    assert torch.equal(q.bias, lin.bias.detach())
    torch.testing.assert_close(q.dequantize(), lin.weight.detach(), atol=0.5 * float(q.scale.max()), rtol=0)


def test_forward_is_the_reference_and_close_to_float():
    lin, q = _linear()
    x = torch.randn(4, 3, 256)
    y = q(x)
    assert torch.equal(y, linear_block_scaled_reference(x, q.weight(), q.bias).float())
    torch.testing.assert_close(y, lin(x).detach(), atol=0.03, rtol=0.03)


def test_extra_repr():
    _, q = _linear()
    assert ("in_features=256, out_features=200, bias=True, W8A8 block-scaled symmetric (Hopper), block_size=128"
            in repr(q))
    _, q = _linear(K=128)  # one K block: still per tile, not "per channel"
    assert "block_size=128" in repr(q) and "per channel" not in repr(q)


def test_state_dict_load_deepcopy_pickle_torch_save():
    _, q = _linear()
    x = torch.randn(5, 256)
    expected = q(x)
    assert set(q.state_dict()) == {"qweight", "scale", "bias"}  # no offset
    fresh = QuantLinear(256, 200, mode="w8a8_block_scaled", bits=8, block_size=128)
    assert not torch.equal(fresh(x), expected)
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh(x), expected)
    for clone in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert clone.offset is None and torch.equal(clone(x), expected)
    buffer = io.BytesIO()
    torch.save(q, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(x), expected)


def test_dtype_casts_keep_the_format():
    _, q = _linear()
    view = q.weight()
    q.half()
    assert q.scale.dtype == torch.float32 and q.qweight.dtype == torch.int8 and q.bias.dtype == torch.float16
    assert q.offset is None
    assert q.weight() is not view and q.weight().scale is q.scale  # rebuilt after the buffers were replaced
    assert q(torch.randn(3, 256, dtype=torch.float16)).dtype == torch.float16


def test_module_errors_name_the_argument():
    with pytest.raises(ValueError, match="mode='w8a8_block_scaled' takes a symmetric weight"):
        QuantLinear(256, 64, mode="w8a8_block_scaled", bits=8, block_size=None)
    with pytest.raises(ValueError, match="mode='w8a8_block_scaled' takes a symmetric weight"):
        QuantLinear(256, 64, mode="w8a8_block_scaled", bits=8, block_size=128, symmetric=False)
    with pytest.raises(ValueError, match="needs bits=8"):
        QuantLinear(256, 64, mode="w8a8_block_scaled", block_size=128)
    with pytest.raises(ValueError, match="block_size=96 does not divide K=256"):
        QuantLinear(256, 64, mode="w8a8_block_scaled", bits=8, block_size=96)
    q = QuantLinear(256, 64, mode="w8a8_block_scaled", bits=8, block_size=128)
    with pytest.raises(TypeError, match="qw must be a BlockScaledWeight"):
        q.set_weight(cutlass_ops.quantize_weight(torch.randn(64, 256), bits=8, block_size=128))
    with pytest.raises(ValueError, match=r"qw \(N=64, K=256, block_size=64\) does not match"):
        q.set_weight(_weight(64, 256, 64))
    with pytest.raises(TypeError, match="qw must be a QuantizedWeight"):
        QuantLinear(256, 64, mode="w8a8_block", bits=8, block_size=128).set_weight(_weight(64, 256, 128))
    with pytest.raises(ValueError, match=r"x must have shape \[..., K\] with K=256"):
        q(torch.randn(2, 255))


# --------------------------------------------------------------------------------------------
# quantize_, configs, safetensors
# --------------------------------------------------------------------------------------------

class TinyNet(nn.Module):
    """fc1 and fc3 take block 128 (fc3: N = 37, a short last N block); fc2's in_features = 200 does not."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(256, 200)
        self.fc2 = nn.Linear(200, 128)
        self.fc3 = nn.Linear(128, 37, bias=False)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _net(seed=0):
    torch.manual_seed(seed)
    return TinyNet()


def test_quantize_converts_and_skips_with_the_reason():
    net = _net()
    summary = cutlass_ops.quantize_(net, W8A8BlockScaledConfig())
    assert summary.converted == ["fc1", "fc3"]
    assert summary.skipped == {"fc2": "block_size=128 does not divide in_features=200"}
    assert isinstance(net.fc1, QuantLinear) and net.fc1.mode == "w8a8_block_scaled"
    assert isinstance(net.fc2, nn.Linear)
    assert net.fc1.quant_config == W8A8BlockScaledConfig()
    assert summary.bytes_after < summary.bytes_before
    x = torch.randn(3, 256)
    torch.testing.assert_close(net(x), _net()(x), atol=0.03, rtol=0.03)


def test_config_checks_and_dict_round_trip():
    assert quantize_model.BLOCK_SCALED_SIZES == BLOCK_SCALED_SIZES  # its copy of the kernel's sizes
    for bs in BLOCK_SCALED_SIZES:
        config = W8A8BlockScaledConfig(block_size=bs)
        assert config.to_dict() == {"type": "W8A8BlockScaledConfig", "block_size": bs}
        assert config_from_dict(config.to_dict()) == config
    assert W8A8BlockScaledConfig().block_size == 128
    assert cutlass_ops.W8A8BlockScaledConfig is W8A8BlockScaledConfig
    with pytest.raises(ValueError, match=r"block_size must be one of \(64, 128, 256\)"):
        W8A8BlockScaledConfig(block_size=32)
    with pytest.raises(TypeError, match="block_size must be an int"):
        W8A8BlockScaledConfig(block_size=128.0)
    config = W8A8BlockScaledConfig(block_size=64)
    assert config.linear_problem(37, 192) is None  # any N; K a multiple of the block
    assert config.linear_problem(64, 200) == "block_size=64 does not divide in_features=200"
    assert "no conv2d kernel" in config.conv_problem(nn.Conv2d(8, 8, 3))


def test_safetensors_round_trip(tmp_path):
    net = _net()
    cutlass_ops.quantize_(net, W8A8BlockScaledConfig())
    x = torch.randn(2, 4, 256)
    expected = net(x)
    path = tmp_path / "block_scaled.safetensors"
    cutlass_ops.save_quantized(net, path)
    fresh = _net(seed=7)  # the float model, freshly built: other weights
    assert not torch.equal(fresh(x), expected)
    cutlass_ops.load_quantized_state(fresh, path)
    assert isinstance(fresh.fc1, QuantLinear) and fresh.fc1.mode == "w8a8_block_scaled" and fresh.fc1.offset is None
    assert isinstance(fresh.fc2, nn.Linear)
    assert fresh.fc1.quant_config == W8A8BlockScaledConfig()
    for name in ("fc1", "fc3"):
        a, b = getattr(net, name), getattr(fresh, name)
        assert torch.equal(a.qweight, b.qweight) and torch.equal(a.scale, b.scale)
    assert torch.equal(fresh(x), expected)


# --------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", [None, "relu6"])
def test_gradients_flow_to_input_and_bias(act):
    """Straight-through for the activation quantization: grad_x = act'(y) * g @ W_deq, grad_bias = sum of
    act'(y) * g, against autograd through x @ W_deq^T + bias in float64."""
    _, q = _linear()
    q.act = 0 if act is None else 2
    q.bias.requires_grad_(True)
    x = torch.randn(2, 5, 256, requires_grad=True)
    y = q(x)
    g = torch.randn_like(y)
    y.backward(g)
    mask = torch.ones_like(y, dtype=torch.bool) if act is None else (y > 0) & (y < 6)
    x64 = x.detach().double().requires_grad_(True)
    b64 = q.bias.detach().double().requires_grad_(True)
    (x64 @ q.weight().dequantize(torch.float64).T + b64).backward(g.double() * mask)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q.bias.grad.double(), b64.grad, rtol=1e-5, atol=1e-5)
    assert q.qweight.grad is None and q.scale.grad is None


def test_weight_gradient_raises():
    _, q = _linear()
    q.scale.requires_grad_(True)
    with pytest.raises(RuntimeError, match="scale requires grad, but the weight is not differentiable"):
        q(torch.randn(2, 256))


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_cpu(backend):
    """No graph break through the module (aot_eager also traces the backward; no C++ compiler needed)."""
    torch._dynamo.reset()
    net = _net()
    cutlass_ops.quantize_(net, W8A8BlockScaledConfig())
    x = torch.randn(3, 256)
    compiled = torch.compile(net, fullgraph=True, backend=backend)
    assert torch.equal(compiled(x), net(x))
    xg = x.clone().requires_grad_(True)
    compiled(xg).sum().backward()
    xe = x.clone().requires_grad_(True)
    net(xe).sum().backward()
    torch.testing.assert_close(xg.grad, xe.grad, rtol=1e-6, atol=1e-6)
    assert xg.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# the public function: exports and the checks made before any GPU work
# --------------------------------------------------------------------------------------------

def test_exports():
    for name in ("linear_w8a8_block_scaled", "BlockScaledWeight", "quantize_weight_block_scaled",
                 "W8A8BlockScaledConfig"):
        assert name in cutlass_ops.__all__ and name in dir(cutlass_ops) and hasattr(cutlass_ops, name)
    assert cutlass_ops.BlockScaledWeight is BlockScaledWeight
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        cutlass_ops.no_such_name  # noqa: B018


def test_public_function_checks_its_arguments_then_needs_a_gpu():
    w = _weight(64, 256, 128)
    x = torch.randn(3, 256)
    f = cutlass_ops.linear_w8a8_block_scaled
    with pytest.raises(TypeError, match="qw must be a BlockScaledWeight"):
        f(x, cutlass_ops.quantize_weight(torch.randn(64, 256), bits=8, block_size=128))
    with pytest.raises(ValueError, match=r"needs qw.block_size in \(64, 128, 256\), got 32"):
        f(x, _weight(64, 256, 32))
    with pytest.raises(TypeError, match="x must have dtype float16, bfloat16 or float32"):
        f(x.double(), w)
    with pytest.raises(ValueError, match=r"x must have shape \[..., K\] with K=256"):
        f(torch.randn(3, 128), w)
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        f(x, w, torch.randn(63))
    with pytest.raises(ValueError, match="activation"):
        f(x, w, None, "gelu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"linear_w8a8_block_scaled\(\) needs an NVIDIA GPU"):
            f(x, w)
