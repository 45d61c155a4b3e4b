"""The C++ replay of recorded launches (custom_kernels.recipe, cutlass_ops.recipes) behind QuantLinear's
"weight_only" (GEMV plans), "w8a8_block" (fused path) and "w8a8_block_scaled" modes: after a problem's first
(Python) call it takes the later plain calls, bit for bit the Python path's output, inside CUDA graphs too;
anything else goes back to Python."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from custom_kernels import host_ext
from cutlass_ops import api, recipes, weight_only
from cutlass_ops._validate import parse_activation
from cutlass_ops.nn import QuantLinear
from cutlass_ops.plan_cache import float32_copy
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8BlockScaledConfig, WeightOnlyConfig
from cutlass_ops.weight_only.splitk import SplitKGemvPlan

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


MODES = ["w4", "w8", "w8a8_block", pytest.param("w8a8_block_scaled", marks=pytest.mark.skipif(
    not _hopper(), reason="the block-scaled kernel is Hopper's (sm_90a)"))]


@pytest.fixture(autouse=True)
def _extension():
    if host_ext.load() is None:
        pytest.skip("the C++ extension is unavailable here (no shipped build, no compiler)")


def _layer(mode: str, N: int, K: int, dtype: torch.dtype, bias: bool, act=None, block_size: int = 128) -> QuantLinear:
    torch.manual_seed(N + 7 * K)
    lin = nn.Linear(K, N, bias=bias).to("cuda", dtype)
    if mode in ("w4", "w8"):
        config = WeightOnlyConfig(bits=int(mode[1]), block_size=block_size)
    elif mode == "w8a8_block":
        config = W8A8BlockConfig(block_size=block_size)
    else:
        config = W8A8BlockScaledConfig(block_size)
    q = QuantLinear.from_float(lin, config)
    q.act = parse_activation(act)
    return q


def _python_path(q: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    if q.mode == "weight_only":
        return api.linear(x, q.weight(), q.bias, q.act)
    if q.mode == "w8a8_block":
        return api.linear_w8a8(x, q.weight(), q.bias, q.act, path="fused")
    return api.linear_w8a8_block_scaled(x, q.weight(), q.bias, q.act)


def _replay_bias(q: QuantLinear):
    """The bias as the mode's kernels read it: weight-only in x's dtype (the layer's), W8A8 as float32."""
    bias = q.bias
    return None if bias is None else bias if q.mode == "weight_only" else float32_copy(bias)


def _run(q: QuantLinear, x: torch.Tensor, bias, act: int) -> torch.Tensor | None:
    return recipes.run(x, q.qweight, q.scale, q.offset, bias, act)


def _replay(q: QuantLinear, x: torch.Tensor) -> torch.Tensor | None:
    return _run(q, x, _replay_bias(q), q.act)


def _recordable(q: QuantLinear, x: torch.Tensor) -> bool:
    """Weight-only: only the split-K GEMV plans (M <= 64) have recipes; W8A8 modes: every M."""
    if q.mode != "weight_only":
        return True
    M = x.numel() // x.shape[-1]
    return isinstance(weight_only.get_plan(q.weight(), M, x.dtype, x.device.index), SplitKGemvPlan)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M", [1, 3, 64, 130, 300])
@pytest.mark.parametrize("bias, act", [(False, None), (True, "relu")])
def test_replay_is_the_python_path_bit_for_bit(mode, dtype, M, bias, act):
    N, K = 320, 512
    q = _layer(mode, N, K, dtype, bias, act)
    x = torch.randn(M, K, dtype=dtype, device="cuda")
    with torch.no_grad():
        want = _python_path(q, x)
        first = q(x)  # the Python path, then recorded
        assert torch.equal(first, want)
        replayed = _replay(q, x)
        if not _recordable(q, x):
            assert replayed is None
            return
        assert replayed is not None, "the recorded problem was not replayed"
        assert replayed.dtype == dtype and replayed.shape == (M, N)
        assert torch.equal(replayed, want)
        assert torch.equal(q(x), want)  # the module's forward takes the replay


@pytest.mark.parametrize("mode", MODES)
def test_leading_dims_and_block_size_64(mode):
    q = _layer(mode, 256, 384, torch.float16, True, block_size=64)
    x = torch.randn(2, 5, 384, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        want = _python_path(q, x)
        q(x)
        out = _replay(q, x)
    assert out is not None and out.shape == (2, 5, 256) and torch.equal(out, want)


@pytest.mark.parametrize("mode", MODES)
def test_what_was_not_recorded_goes_to_python(mode):
    q = _layer(mode, 256, 512, torch.float16, True)
    x = torch.randn(4, 512, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        q(x)
        assert _replay(q, x) is not None
        assert _replay(q, x[:3]) is None                                # another M
        assert _replay(q, x.to(torch.bfloat16)) is None                 # another dtype
        assert _run(q, x, None, q.act) is None                          # without the bias
        assert _run(q, x, _replay_bias(q), 1) is None                   # another activation
        wide = torch.randn(4, 1024, dtype=torch.float16, device="cuda")
        assert _replay(q, wide[:, :512]) is None                        # not contiguous
        flat = torch.randn(4 * 512 + 1, dtype=torch.float16, device="cuda")
        assert _replay(q, flat[1:].view(4, 512)) is None                # not 16-byte aligned
    xg = x.clone().requires_grad_()
    assert _replay(q, xg) is None                                       # a gradient is wanted
    q.scale.requires_grad_(True)
    assert _replay(q, x) is None                                        # ... of the weight: autograd raises
    q.scale.requires_grad_(False)
    with torch.no_grad():
        assert _replay(q, x) is not None


@pytest.mark.parametrize("bits", [4, 8])
def test_functional_linear_replays_too(bits):
    """cutlass_ops.linear on a QuantizedWeight: its second eager call of a problem is the replay, and a
    QuantizedWeight made afresh over the same tensors finds the same recipe."""
    import cutlass_ops
    from cutlass_ops.formats import QuantizedWeight

    torch.manual_seed(bits)
    qw = cutlass_ops.quantize_weight(torch.randn(320, 512, device="cuda"), bits=bits, block_size=128)
    bias = torch.randn(320, dtype=torch.float16, device="cuda")
    x = torch.randn(3, 512, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        first = cutlass_ops.linear(x, qw, bias, "relu")
        out = recipes.run(x, qw.qweight, qw.scale, qw.offset, bias, 1)
        assert out is not None and torch.equal(out, first)
        again = QuantizedWeight(qw.qweight, qw.scale, qw.offset, qw.bits, qw.block_size, qw.N, qw.K)
        assert torch.equal(cutlass_ops.linear(x, again, bias, "relu"), first)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("change", ["in place", "replaced"])
def test_a_changed_scale_goes_back_to_python(mode, change):
    """The scales changed in place (the replay's prepared weight data would be stale), or the scale buffer
    replaced by another tensor while the old one stays alive (the recipe recorded with it must not run)."""
    q = _layer(mode, 256, 512, torch.float16, False)
    x = torch.randn(2, 512, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        q(x)
        before = _replay(q, x)
        assert before is not None
        old = q.scale
        if change == "in place":
            q.scale.mul_(2)
        else:
            q._buffers["scale"] = old * 2
        assert _replay(q, x) is None
        after = q(x)  # Python: plans rebuilt, then recorded again
        assert torch.equal(after, _python_path(q, x)) and not torch.equal(after, before)
        assert torch.equal(_replay(q, x), after)
        assert old.abs().sum() > 0  # the old scale tensor is alive to the end


@pytest.mark.parametrize("mode", MODES)
def test_recipes_of_a_dropped_layer_are_released(mode):
    ext = host_ext.load()
    x = torch.randn(2, 512, dtype=torch.float16, device="cuda")
    q = _layer(mode, 256, 512, torch.float16, False)
    with torch.no_grad():
        q(x)
    assert _replay(q, x) is not None
    count = ext.recipe_count()
    del q
    gc.collect()
    q2 = _layer(mode, 256, 512, torch.float16, False)  # registering drops the dead layer's recipes
    with torch.no_grad():
        q2(x)
    assert ext.recipe_count() <= count


@pytest.mark.parametrize("mode", MODES)
def test_replay_inside_a_cuda_graph(mode):
    q = _layer(mode, 256, 512, torch.bfloat16, True)
    x = torch.randn(3, 512, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        want = _python_path(q, x)
        q(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            q(x)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = q(x)
        x.copy_(torch.randn_like(x))
        want = _python_path(q, x)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.skipif(not _hopper(), reason="gemm_wgmma is Hopper's (sm_90a)")
@pytest.mark.parametrize("splits", [2, 5])
def test_cluster_sum_plan_replays(monkeypatch, splits):
    """A weight whose dispatch names gemm_wgmma with its K splits summed in a cluster (GemmWgmmaConfig.cluster, as
    some tuned entries do): one launch with the cluster attribute, recorded and replayed from C++ bit for bit."""
    from cutlass_ops.weight_only.variants import GemmWgmmaConfig

    config = GemmWgmmaConfig(stages=3, min_blocks=2, cluster=1, splits=splits)
    monkeypatch.setattr(weight_only, "tuned_for", lambda *args: ("gemm_wgmma", config))
    q = _layer("w4", 1040, 4096, torch.float16, True, "relu")
    x = torch.randn(24, 4096, dtype=torch.float16, device="cuda")
    plan = weight_only.get_plan(q.weight(), 24, torch.float16, x.device.index)
    assert plan.strategy == "gemm_wgmma" and plan.reduce is None and plan.gemv.shape.cluster == (1, splits, 1)
    with torch.no_grad():
        want = _python_path(q, x)
        assert torch.equal(q(x), want)  # the Python path, then recorded
        replayed = _replay(q, x)
        assert replayed is not None, "the recorded problem was not replayed"
        assert torch.equal(replayed, want)
    ref = x.double() @ q.weight().dequantize(torch.float64).t() + q.bias.double()
    assert (want.double() - ref.relu()).abs().max() <= 2e-2 * ref.abs().max()
