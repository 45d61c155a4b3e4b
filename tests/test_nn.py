"""cutlass_ops.nn modules, quantize_ and safetensors round trips - on the CPU (the ops' reference kernels).

On CPU tensors the modules run ``torch.ops.cutlass_ops.*``'s CPU kernels (float64 references rounded to
the input dtype), so everything here needs no GPU; tests/gpu/test_torch_integration_gpu.py repeats the
round trips on the GPU kernels.
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import cutlass_ops
from cutlass_ops import reference
from cutlass_ops.nn import QuantConv2d, QuantLinear
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8ChannelConfig, WeightOnlyConfig, config_from_dict

CONFIGS = {
    "w4": WeightOnlyConfig(bits=4, block_size=32),
    "w8": WeightOnlyConfig(bits=8, block_size=None),
    "w8a8_block": W8A8BlockConfig(block_size=32, path="fused"),
    "w8a8_channel": W8A8ChannelConfig(),
}


class TinyNet(nn.Module):
    """A conv stem, a linear that every mode takes and one the W8A8 per-channel GEMM cannot (N = 10)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 8, 3, padding=1)
        self.norm = nn.LayerNorm(64)
        self.fc1 = nn.Linear(64, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, img, x):
        c = torch.relu(self.conv(img)).mean()
        return self.fc2(torch.relu(self.fc1(self.norm(x)))) + c


def _net(seed=0):
    torch.manual_seed(seed)
    return TinyNet()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 32, 5, 6, generator=g), torch.randn(3, 5, 64, generator=g)


def _quantized(name):
    net = _net()
    summary = cutlass_ops.quantize_(net, CONFIGS[name])
    return net, summary


@pytest.mark.parametrize("name", list(CONFIGS))
def test_quantize_summary(name):
    net, summary = _quantized(name)
    if name in ("w8a8_channel", "w8a8_block"):  # fc2's out_features = 10: any N for both
        assert summary.converted == ["fc1", "fc2"] and "no conv2d kernel" in summary.skipped["conv"]
    else:
        assert summary.converted == ["conv", "fc1", "fc2"] and not summary.skipped
    assert summary.bytes_after < summary.bytes_before
    assert isinstance(net.fc1, QuantLinear) and isinstance(net.norm, nn.LayerNorm)
    assert "converted" in str(summary)


def test_filter_fn_and_type_errors():
    net = _net()
    summary = cutlass_ops.quantize_(net, CONFIGS["w4"], filter_fn=lambda m, fqn: fqn != "fc2")
    assert summary.converted == ["conv", "fc1"] and isinstance(net.fc2, nn.Linear)
    with pytest.raises(TypeError, match="config must be one of"):
        cutlass_ops.quantize_(_net(), {"bits": 4})
    with pytest.raises(ValueError, match="model is itself a Linear"):
        cutlass_ops.quantize_(nn.Linear(64, 32), CONFIGS["w4"])


def test_linear_forward_is_the_reference():
    torch.manual_seed(0)
    lin = nn.Linear(64, 24)
    q = QuantLinear.from_float(lin, CONFIGS["w4"])
    x = torch.randn(2, 3, 64)
    expected = reference.linear_reference(x, q.weight(), q.bias).float()
    assert torch.equal(q(x), expected)
    # the quantized layer stays close to the float one (int4, block 32)
    torch.testing.assert_close(q(x), lin(x), atol=0.15, rtol=0.1)


@pytest.mark.parametrize("K, N", [(64, 32), (60, 10)])  # (60, 10): the GEMM pads K to 64 and N to 16 on a GPU
def test_w8a8_channel_matches_float(K, N):
    torch.manual_seed(0)
    lin = nn.Linear(K, N)
    q = QuantLinear.from_float(lin, CONFIGS["w8a8_channel"])
    assert q.scale.shape == (N, 1) and q.qweight.dtype == torch.int8
    x = torch.randn(4, K)
    torch.testing.assert_close(q(x), lin(x), atol=0.03, rtol=0.03)


def test_conv_forward_is_the_reference():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 8, 3, stride=2, padding="valid")
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=8, block_size=8))
    x = torch.randn(2, 16, 9, 9).to(memory_format=torch.channels_last)
    y = q(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    expected = reference.conv2d_reference(x, q.weight(), q.bias, 2, 0).float()
    assert torch.equal(y, expected)
    torch.testing.assert_close(y, conv(x), atol=0.02, rtol=0.02)


def test_extra_repr():
    net, _ = _quantized("w4")
    assert "in_features=64, out_features=32, bias=True, W4A16, block_size=32" in repr(net)
    assert "QuantConv2d(32, 8, kernel_size=(3, 3)" in repr(net) and "padding=(1, 1)" in repr(net)
    net, _ = _quantized("w8a8_block")
    assert "W8A8 per K block, path=fused, block_size=32, asymmetric" in repr(net.fc1)
    assert "W8A8 per channel x per token, per channel" in repr(QuantLinear(64, 32, mode="w8a8_channel", bits=8,
                                                                           block_size=None))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_deepcopy_pickle(name):
    net, _ = _quantized(name)
    img, x = _inputs()
    expected = net(img, x)
    clone = copy.deepcopy(net)
    assert torch.equal(clone(img, x), expected)
    assert torch.equal(pickle.loads(pickle.dumps(net))(img, x), expected)
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=False)(img, x), expected)
    # a fresh quantized model (other random weights) takes the state dict and reproduces the outputs
    fresh = _net(seed=5)
    cutlass_ops.quantize_(fresh, CONFIGS[name])
    assert not torch.equal(fresh(img, x), expected)
    fresh.load_state_dict(net.state_dict())
    assert torch.equal(fresh(img, x), expected)
    assert set(net.fc1.state_dict()) == {"qweight", "scale", "offset", "bias"}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_safetensors_round_trip(tmp_path, name):
    net, _ = _quantized(name)
    img, x = _inputs()
    expected = net(img, x)
    path = tmp_path / "model.safetensors"
    cutlass_ops.save_quantized(net, path, metadata={"note": "tiny"})
    fresh = _net(seed=7)  # the float model, freshly built: other weights
    cutlass_ops.load_quantized_state(fresh, path)
    assert type(fresh.fc1) is type(net.fc1) and type(fresh.conv) is type(net.conv)
    assert fresh.fc1.quant_config == CONFIGS[name]
    assert torch.equal(fresh(img, x), expected)


def test_load_errors(tmp_path):
    net, _ = _quantized("w4")
    path = tmp_path / "m.safetensors"
    cutlass_ops.save_quantized(net, path)
    with pytest.raises(ValueError, match="quantizes layer 'conv', which the model does not have"):
        cutlass_ops.load_quantized_state(nn.Sequential(nn.Linear(64, 32)), path)
    with pytest.raises(ValueError, match="has no QuantLinear"):
        cutlass_ops.save_quantized(_net(), path)
    with pytest.raises(ValueError, match="reserved"):
        cutlass_ops.save_quantized(net, path, metadata={"cutlass_ops.x": "1"})


def test_dtype_casts_keep_the_format_and_the_view_is_cached():
    q = QuantLinear.from_float(nn.Linear(64, 32), CONFIGS["w4"])
    view = q.weight()
    assert q.weight() is view  # built once
    q.half()
    assert q.scale.dtype == torch.float32 and q.offset.dtype == torch.float32 and q.bias.dtype == torch.float16
    assert q.qweight.dtype == torch.uint8
    assert q.weight() is not view and q.weight().scale is q.scale  # rebuilt after a buffer was replaced
    x = torch.randn(3, 64, dtype=torch.float16)
    assert q(x).dtype == torch.float16


def test_gradients_flow_to_input_and_bias():
    torch.manual_seed(0)
    q = QuantLinear.from_float(nn.Linear(64, 24), CONFIGS["w4"])
    q.bias.requires_grad_(True)
    x = torch.randn(5, 64, requires_grad=True)
    q(x).square().sum().backward()
    W = q.weight().dequantize(torch.float32)
    x2 = x.detach().clone().requires_grad_(True)
    b2 = q.bias.detach().clone().requires_grad_(True)
    torch.nn.functional.linear(x2, W, b2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q.bias.grad, b2.grad, rtol=1e-4, atol=1e-4)

    conv = QuantConv2d.from_float(nn.Conv2d(16, 8, 3, padding=1), WeightOnlyConfig(bits=4, block_size=8,))
    img = torch.randn(2, 16, 5, 5, requires_grad=True)
    conv(img).sum().backward()
    img2 = img.detach().clone().requires_grad_(True)
    torch.nn.functional.conv2d(img2, conv.dequantize(torch.float32), conv.bias, padding=1).sum().backward()
    torch.testing.assert_close(img.grad, img2.grad, rtol=1e-4, atol=1e-4)


def test_weight_gradient_raises():
    q = QuantLinear.from_float(nn.Linear(64, 32), CONFIGS["w4"])
    q.scale.requires_grad_(True)
    with pytest.raises(RuntimeError, match="scale requires grad, but the weight is not differentiable"):
        q(torch.randn(2, 64))


def test_input_errors_name_the_argument():
    q = QuantLinear.from_float(nn.Linear(64, 32), CONFIGS["w4"])
    with pytest.raises(ValueError, match=r"x must have shape \[..., K\] with K=64"):
        q(torch.randn(2, 63))
    with pytest.raises(TypeError, match="x must have dtype float16, bfloat16 or float32"):
        q(torch.ones(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="mode='w8a8_channel' takes a symmetric per-channel weight"):
        QuantLinear(64, 32, mode="w8a8_channel", bits=8, block_size=32)


def test_config_dicts_and_method():
    for config in CONFIGS.values():
        assert config_from_dict(config.to_dict()) == config
    q = QuantLinear.from_float(nn.Linear(64, 32), WeightOnlyConfig(bits=4, block_size=32, method="mse"))
    assert q.qweight.shape == (32, 32)


@pytest.mark.parametrize("name", ["w4", "w8a8_block", "w8a8_channel"])
def test_compile_fullgraph_cpu(name):
    """No graph break through the modules (aot_eager: traces forward and backward, no C++ compiler)."""
    net, _ = _quantized(name)
    img, x = _inputs()
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(img, x), net(img, x))
    xg = x.clone().requires_grad_(True)
    compiled(img, xg).sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0
