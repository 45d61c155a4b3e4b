"""Weight-only linear (cutlass_ops.weight_only) on a GPU: every strategy against the float64
reference, on odd shapes, with outputs poisoned (NaN) before the launch so unwritten elements fail.

Tolerance (per output element), derived from the format:
  * dequantization in the activation type (tensor-core paths): each w = q s + o is rounded once
    and its (s, o) once more, |dw| <= 2u (|q s| + |o|) with u the type's unit roundoff; the errors
    are independent, so the sum over K has standard deviation <= 2u sqrt(sum_k x_k^2 (|q s| + |o|)^2)
    / sqrt(3) = 2u S / sqrt(3); we allow 6 * 2u S (over 5 sigma for the ~10^6 outputs checked);
  * fp32 accumulation: 6 * 2^-24 sqrt(K) S;
  * output rounding: u |ref|, plus half the float16 subnormal spacing.
A wrong group scale or a dropped chunk moves outputs by O(|ref|), far outside this.
"""
from __future__ import annotations

import copy
import functools
import math
import pickle
from dataclasses import replace

import pytest
import torch

from cutlass_ops.formats import QuantizedWeight, quantize_weight
from cutlass_ops import plan_cache
from cutlass_ops import weight_only as wo
from cutlass_ops.reference import linear_reference
from cutlass_ops.weight_only import variants as v

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
N_MAIN, K_MAIN = 4097, 4160


def _dtype_id(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=None)
def _weight(N: int, K: int, bits: int, block_size: int | None, symmetric: bool) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(N * 31 + K * 7 + bits + (block_size or 0))
    # Scaled so that outputs are O(1): relu6 then clips only some of them.
    w = torch.randn(N, K, generator=gen) * (1.0 / math.sqrt(K))
    return quantize_weight(w.cuda(), bits=bits, block_size=block_size, symmetric=symmetric)


_ABS_WEIGHT_SQ: dict[int, tuple[QuantizedWeight, torch.Tensor]] = {}


def _abs_weight_sq(qw: QuantizedWeight) -> torch.Tensor:
    """(|q s| + |o|)^2 per element, float64 [N, K] (the magnitude the dequantization error scales with)."""
    hit = _ABS_WEIGHT_SQ.get(id(qw))
    if hit is not None and hit[0] is qw:
        return hit[1]
    q = qw.int_values().to(torch.float64).reshape(qw.N, qw.num_groups, qw.block_size)
    mag = (q * qw.scale.to(torch.float64)[..., None]).abs() + qw.offset.to(torch.float64).abs()[..., None]
    sq = mag.reshape(qw.N, qw.K) ** 2
    _ABS_WEIGHT_SQ[id(qw)] = (qw, sq)
    return sq


def _inputs(M: int, K: int, N: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + M)
    x = torch.randn(M, K, generator=gen).to(dtype).cuda()
    bias = (torch.randn(N, generator=gen) * 0.5).to(dtype).cuda()
    return x, bias


def _tolerance(x: torch.Tensor, qw: QuantizedWeight, ref: torch.Tensor, dtype) -> torch.Tensor:
    u = UNIT_ROUNDOFF[dtype]
    S = ((x.to(torch.float64) ** 2) @ _abs_weight_sq(qw).T).sqrt()
    return 1.01 * u * ref.abs() + 12 * u * S + 6 * 2.0 ** -24 * math.sqrt(qw.K) * S + 2.0 ** -25


def _check(x, qw, bias, act, strategy, *, ref=None, config=None, tolerance=_tolerance):
    """``strategy`` into a NaN-poisoned output, every element within ``tolerance(x, qw, ref, dtype)``."""
    M, N = x.shape[0], qw.N
    out = torch.full((M, N), float("nan"), dtype=x.dtype, device="cuda")
    result = wo.linear_weight_only(x, qw, bias, act, strategy=strategy, out=out, config=config)
    torch.cuda.synchronize()
    assert result is out
    if ref is None:
        ref = linear_reference(x, qw, bias, act)
    tol = tolerance(x, qw, ref, x.dtype)
    err = (out.to(torch.float64) - ref).abs()
    bad = ~(err <= tol)  # NaN (unwritten or poisoned) counts as bad
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        m, n = divmod(i, N)
        pytest.fail(f"strategy={strategy} config={config} M={M} N={N} K={qw.K} bits={qw.bits} "
                    f"block_size={qw.block_size} {x.dtype}: {int(bad.sum())} of {bad.numel()} outputs off; first at "
                    f"[{m}, {n}]: got {out[m, n].item()}, ref {ref[m, n].item()}, tol {tol[m, n].item():.3g}")
    return out


def _main_cases():
    """(dtype, bits, M, strategy) for every strategy that applies (cc >= 80 assumed for mma)."""
    cases = []
    for dtype in DTYPES:
        for bits in (4, 8):
            for M in (1, 3, 17, 127, 512):
                strategies = [None, "gemm_simt"]
                if M <= 8:
                    strategies.append("gemv_simt")
                    if bits == 8:
                        strategies.append("gemv_dp4a")
                if dtype != torch.float32:
                    strategies.append("gemm_mma")
                    if M <= 64:
                        strategies.append("gemv_mma")
                cases += [(dtype, bits, M, s) for s in strategies]
    return cases


def _case_id(case) -> str:
    dtype, bits, M, strategy = case
    return f"{_dtype_id(dtype)}-int{bits}-M{M}-{strategy or 'default'}"


def _dp4a_reference(x, qw, bias, act):
    """What gemv_dp4a computes, in float64: activations quantized per 32-block exactly as the kernel
    does (fp32: d = amax / 127, q = rint(x / d)), the scale term on d q, the offset term on x."""
    M, K = x.shape
    xb = x.float().reshape(M, K // 32, 32)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    d = amax / torch.full_like(amax, 127.0)  # tensor / tensor: an IEEE division like the kernel's
    q = torch.where(d == 0, torch.zeros_like(xb), torch.round(xb / d))
    xq = (q * d).reshape(M, K).to(torch.float64)
    qv = qw.int_values().to(torch.float64).reshape(qw.N, qw.num_groups, qw.block_size)
    w_scale = (qv * qw.scale.to(torch.float64)[..., None]).reshape(qw.N, K)
    w_offset = qw.offset.to(torch.float64).repeat_interleave(qw.block_size, dim=1)
    y = xq @ w_scale.T + x.to(torch.float64) @ w_offset.T + bias.to(torch.float64)
    return y.clamp(0, 6) if act == 2 else (y.clamp_min(0) if act == 1 else y)


@pytest.mark.parametrize("case", _main_cases(), ids=_case_id)
def test_strategy_matches_reference_block64(case):
    dtype, bits, M, strategy = case
    qw = _weight(N_MAIN, K_MAIN, bits, 64, False)  # asymmetric: exercises the offsets
    x, bias = _inputs(M, K_MAIN, N_MAIN, dtype)
    act = 2 if M % 2 else 0
    ref = _dp4a_reference(x, qw, bias, act) if strategy == "gemv_dp4a" else None
    _check(x, qw, bias, act, strategy, ref=ref)


def _block_cases():
    cases = []
    for block_size in (32, 128, None):
        for bits in (4, 8):
            for dtype in (torch.float16, torch.bfloat16):
                for M, strategy in ((1, "gemv_mma"), (17, "gemv_mma"), (1, "gemv_simt"), (17, "gemm_mma"),
                                    (127, "gemm_mma"), (17, "gemm_simt"), (3, None)):
                    cases.append((block_size, bits, dtype, M, strategy))
                if bits == 8:
                    cases.append((block_size, bits, dtype, 3, "gemv_dp4a"))
        cases.append((block_size, 4, torch.float32, 3, "gemv_simt"))
        cases.append((block_size, 8, torch.float32, 17, "gemm_simt"))
    return cases


@pytest.mark.parametrize("case", _block_cases(),
                         ids=lambda c: f"bs{c[0]}-int{c[1]}-{_dtype_id(c[2])}-M{c[3]}-{c[4] or 'default'}")
def test_block_sizes_and_per_channel(case):
    block_size, bits, dtype, M, strategy = case
    K = 4224 if block_size == 128 else K_MAIN  # block_size must divide K
    qw = _weight(N_MAIN, K, bits, block_size, True)
    x, bias = _inputs(M, K, N_MAIN, dtype, seed=1)
    ref = _dp4a_reference(x, qw, bias, 2) if strategy == "gemv_dp4a" else None
    _check(x, qw, bias, 2, strategy, ref=ref)


@pytest.mark.parametrize("strategy", wo.STRATEGIES + (None,))
@pytest.mark.parametrize("M", [1, 5, 70])
@pytest.mark.parametrize("bits", [4, 8])
def test_ragged_tails(strategy, M, bits):
    """N = 77 (no tile multiple), K = 1056 (not a multiple of the 64-wide GEMM K tile)."""
    N, K = 77, 1056
    qw = _weight(N, K, bits, 32, False)
    dtype = torch.float16
    problem = wo.strategy_problem(strategy, M, dtype, qw, 90) if strategy else None
    if problem is not None:
        with pytest.raises(ValueError, match=strategy):
            wo.linear_weight_only(torch.zeros(M, K, dtype=dtype, device="cuda"), qw, strategy=strategy)
        return
    x, bias = _inputs(M, K, N, dtype, seed=2)
    ref = _dp4a_reference(x, qw, bias, 1) if strategy == "gemv_dp4a" else None
    _check(x, qw, bias, 1, strategy, ref=ref)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("M", [1, 9])
def test_gemv_split_k_is_exact_and_deterministic(bits, M):
    """Small N forces the cross-block split-K path (fp32 workspace + splitk_reduce)."""
    N, K = 256, 8192
    qw = _weight(N, K, bits, 128, False)
    x, bias = _inputs(M, K, N, torch.float16, seed=3)
    first = _check(x, qw, bias, 0, "gemv_mma")
    second = wo.linear_weight_only(x, qw, bias, 0, strategy="gemv_mma")
    assert torch.equal(first, second)


@pytest.mark.parametrize("M", [8, 9, 16, 33, 64])
@pytest.mark.parametrize("bits, dtype", [(4, torch.float16), (8, torch.bfloat16)])
def test_gemv_mma_every_m_tile_count(bits, dtype, M):
    """kMTiles = 1, 2, 4, 8 at their boundaries."""
    qw = _weight(N_MAIN, K_MAIN, bits, 64, False)
    x, bias = _inputs(M, K_MAIN, N_MAIN, dtype, seed=8)
    _check(x, qw, bias, 2, "gemv_mma")


@pytest.mark.parametrize("M", [5, 9, 16])
@pytest.mark.parametrize("bits, dtype", [(4, torch.float16), (4, torch.bfloat16), (8, torch.float16)])
@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
def test_default_gemv_mma_rule_from_m5(bits, dtype, M, wide):
    """The rule's modules at M = 5..16 through the default dispatch, K whole: a weight just wide enough for one
    64-row block per SM takes four row tiles at M = 9..16 for int4, one just under a 32-row block per two SMs one
    row tile (both ragged in N)."""
    from custom_kernels.device import sm_count

    sms = sm_count(0)
    N, K = (64 * sms + 7 if wide else 16 * sms - 40), 2112  # > 64 chunks: not the short-K branch
    qw = _weight(N, K, bits, 64, False)
    config = wo.default_gemv_mma_config(M, bits, N, K, sms)
    expected = (v.M16_WIDE_GEMV_MMA if bits == 4 and M > 8 else wo.default_gemv_mma_configs(M, bits)[0]) if wide \
        else v.NARROW_GEMV_MMA
    assert config.defines() == expected.defines() and config.splits == 1
    major, minor = torch.cuda.get_device_capability(0)
    assert wo.choose_strategy(M, dtype, qw, 10 * major + minor) == "gemv_mma"
    x, bias = _inputs(M, K, N, dtype, seed=11)
    _check(x, qw, bias, 1, None)


# The modules of the rule's branches by the names the case lists below use (tests/test_gpu_rule_cases.py checks on the
# CPU, for several SM counts, that each case's shape takes its module through the default dispatch).
RULE_MODULES = {
    "narrow_chains": v.NARROW_CHAINS_GEMV_MMA, "narrow": v.NARROW_GEMV_MMA, "narrow_w4": v.NARROW_4W_GEMV_MMA,
    "long_k_chains": v.LONG_K_CHAINS_GEMV_MMA, "short_k": v.SHORT_K_GEMV_MMA, "full": v.SMALL_M_FULL_GEMV_MMA,
    "chains": v.SMALL_M_CHAINS_GEMV_MMA, "mid": v.MID_M_GEMV_MMA, "plain": v.SMALL_M_GEMV_MMA,
    "default": v.GemvMmaConfig(), "r2u2": v.M16_INT8_GEMV_MMA, "r4u2": v.M32_INT8_GEMV_MMA,
}


def rule_case_N(per_sm: float, extra: int, sms: int) -> int:
    """A case's N: per_sm 16-row tiles per SM plus `extra` tiles, 5 rows short of the last (ragged)."""
    return 16 * (int(per_sm * sms) + extra) - 5


# (bits, 16-row tiles as a multiple of the SMs and an offset, K, the module the M <= 4 rule picks): every branch
SMALL_M_CASES = [
    (4, 0.5, -3, 1088, "narrow_chains"), (4, 0.5, -3, 4224, "long_k_chains"), (8, 0.5, -3, 1024, "short_k"),
    (8, 0.5, -3, 1088, "long_k_chains"), (4, 1, -3, 1088, "narrow"), (4, 1, 1, 1088, "short_k"),
    (4, 1, 1, 6208, "full"), (8, 1, 1, 1088, "narrow_chains"), (8, 1, 1, 3136, "full"),
    (4, 2, 2, 3584, "chains"), (4, 2, 2, 8192, "mid"), (4, 2, 2, 3072, "plain"), (4, 2, 2, 2048, "short_k"),
    (8, 2, 2, 3072, "short_k"), (8, 2, 2, 16384, "default"),
]


@pytest.mark.parametrize("bits, per_sm, extra, K, module", SMALL_M_CASES,
                         ids=[f"w{c[0]}-{c[4]}-K{c[3]}" for c in SMALL_M_CASES])
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_default_gemv_mma_small_m_rule(dtype, M, bits, per_sm, extra, K, module):
    """The M <= 4 rule's modules through the default dispatch, each on a weight of its branch (N ragged: a few
    rows past a whole tile)."""
    from custom_kernels.device import sm_count

    sms = sm_count(0)
    N = rule_case_N(per_sm, extra, sms)
    qw = _weight(N, K, bits, 64, False)
    config = wo.default_gemv_mma_config(M, bits, N, K, sms)
    assert config == replace(RULE_MODULES[module], splits=1)
    major, minor = torch.cuda.get_device_capability(0)
    assert wo.choose_strategy(M, dtype, qw, 10 * major + minor) == "gemv_mma"
    x, bias = _inputs(M, K, N, dtype, seed=12)
    _check(x, qw, bias, 1, None)


# (M, bits, 16-row tiles as a multiple of the SMs and an offset, K, the module) of the rule's branches at M = 5..32
# that the M <= 4 cases above do not reach
MID_M_CASES = [
    (6, 4, 1, 1, 1088, "short_k"), (12, 4, 1, 1, 1088, "r2u2"), (6, 8, 2, 2, 2112, "short_k"),
    (8, 8, 1, 1, 2048, "narrow_chains"), (7, 8, 1, 1, 3136, "full"), (12, 8, 1, 1, 1024, "narrow_w4"),
    # int8 at M = 17..32 (gemv_mma also on sm_90 there, but for mid-width, mid-K weights: dispatch.GEMM_WGMMA_INT8_KEEP_N /
    # _K, which K = 4160 leaves)
    (20, 8, 2, 2, 4160, "r4u2"), (32, 8, 1, 1, 2112, "narrow_w4"), (24, 8, 1, 1, 6208, "mid"),
    (17, 8, 0.5, -3, 1024, "narrow_w4"), (32, 8, 0.5, -3, 2112, "narrow"),
]


@pytest.mark.parametrize("M, bits, per_sm, extra, K, module", MID_M_CASES,
                         ids=[f"m{c[0]}-w{c[1]}-{c[5]}" for c in MID_M_CASES])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_default_gemv_mma_mid_m_rule(dtype, M, bits, per_sm, extra, K, module):
    """The rule's short-K and int8 branches at M = 5..32 through the default dispatch (N ragged)."""
    from custom_kernels.device import sm_count

    sms = sm_count(0)
    N = rule_case_N(per_sm, extra, sms)
    qw = _weight(N, K, bits, 64, False)
    assert wo.default_gemv_mma_config(M, bits, N, K, sms) == replace(RULE_MODULES[module], splits=1)
    major, minor = torch.cuda.get_device_capability(0)
    assert wo.choose_strategy(M, dtype, qw, 10 * major + minor) == "gemv_mma"
    x, bias = _inputs(M, K, N, dtype, seed=13)
    _check(x, qw, bias, 1, None)


@pytest.mark.parametrize("config", wo.GEMM_CONFIGS, ids=lambda c: f"m_tile{c.m_tile}")
@pytest.mark.parametrize("bits, dtype, M, block_size", [(4, torch.float16, 17, 64), (8, torch.float16, 200, 64),
                                                        (4, torch.bfloat16, 129, 32), (8, torch.bfloat16, 64, None),
                                                        (4, torch.float16, 300, 128)])
def test_every_gemm_variant(config, bits, dtype, M, block_size):
    K = 4224 if block_size == 128 else K_MAIN
    qw = _weight(N_MAIN, K, bits, block_size, block_size == 64)
    x, bias = _inputs(M, K, N_MAIN, dtype, seed=9)
    _check(x, qw, bias, 2, "gemm_mma", config=config)


def test_gemm_odd_block_size_uses_the_division_path():
    """block_size 48 (a multiple of 16, not a power of two): group_of divides."""
    N, K = 300, 1056 - 96  # 960 = 20 * 48
    qw = _weight(N, K, 8, 48, False)
    x, bias = _inputs(70, K, N, torch.float16, seed=10)
    for config in wo.GEMM_CONFIGS:
        _check(x, qw, bias, 0, "gemm_mma", config=config)
    _check(x, qw, bias, 0, "gemm_simt")


def test_bias_none_and_other_dtype():
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    x, bias = _inputs(2, K_MAIN, N_MAIN, torch.float16, seed=4)
    _check(x, qw, None, 0, None)
    out = wo.linear_weight_only(x, qw, bias.float(), 0)
    assert torch.equal(out, wo.linear_weight_only(x, qw, bias, 0))


def test_plan_follows_in_place_scale_change():
    qw = _weight(256, 1024, 4, 64, True)
    qw = QuantizedWeight(qw.qweight.clone(), qw.scale.clone(), qw.offset.clone(), 4, 64, 256, 1024)
    x, _ = _inputs(1, 1024, 256, torch.float16, seed=5)
    before = wo.linear_weight_only(x, qw)
    qw.scale.mul_(2)
    after = wo.linear_weight_only(x, qw)
    torch.testing.assert_close(after.float(), 2 * before.float(), rtol=2e-3, atol=1e-3)


def _check_graph_replay(x, call):
    """call(x) captured in a CUDA graph replays to call's eager result, and follows x changed in place."""
    expected = call(x)  # also builds the plan outside the capture
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            static_out = call(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, expected)
    static_x.mul_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, call(-x))


def test_cuda_graph_capture_and_replay():
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    x, bias = _inputs(1, K_MAIN, N_MAIN, torch.float16, seed=6)
    _check_graph_replay(x, lambda x: wo.linear_weight_only(x, qw, bias, 0))


def test_public_linear_routes_here():
    import cutlass_ops

    qw = _weight(N_MAIN, K_MAIN, 8, 64, False)
    x, bias = _inputs(6, K_MAIN, N_MAIN, torch.bfloat16, seed=7)
    out = cutlass_ops.linear(x.reshape(2, 3, K_MAIN), qw, bias, "relu")
    assert out.shape == (2, 3, N_MAIN)
    assert torch.equal(out.reshape(6, N_MAIN), wo.linear_weight_only(x, qw, bias, 1))


def test_forced_strategy_that_cannot_run_is_refused():
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    x = torch.zeros(1, K_MAIN, dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match="float32"):
        wo.linear_weight_only(x, qw, strategy="gemv_mma")
    with pytest.raises(ValueError, match="int8"):
        wo.linear_weight_only(x, qw, strategy="gemv_dp4a")


def test_plans_live_in_the_plan_cache_not_on_the_weight():
    """Nothing is stored on the QuantizedWeight (a used weight pickles and deep-copies as plain data);
    the default dispatch and the forced strategy share one plan, and the plans of one weight share its
    packed (scale, offset) words."""
    cached = _weight(256, 1024, 4, 64, False)
    qw = QuantizedWeight(cached.qweight.clone(), cached.scale.clone(), cached.offset.clone(), 4, 64, 256, 1024,
                         symmetric=False)
    fields = set(qw.__dict__)
    x, bias = _inputs(2, 1024, 256, torch.float16, seed=11)
    first = wo.linear_weight_only(x, qw, bias, 0, strategy="gemv_mma")
    wo.linear_weight_only(x[:1], qw, bias, 0, strategy="gemv_mma")
    wo.linear_weight_only(x, qw, bias, 0)
    assert set(qw.__dict__) == fields
    clone = pickle.loads(pickle.dumps(qw))
    assert torch.equal(wo.linear_weight_only(x, clone, bias, 0, strategy="gemv_mma"), first)
    copy.deepcopy(qw)
    dev = x.device.index
    p2 = wo.get_plan(qw, 2, torch.float16, dev, "gemv_mma")
    assert wo.get_plan(qw, 2, torch.float16, dev) is p2  # default dispatch (gemv_mma at M = 2 on sm_80+)
    assert wo.get_plan(qw, 1, torch.float16, dev, "gemv_mma")._keep[0] is p2._keep[0]
    assert plan_cache.entry(qw).plans


def test_plan_cache_forgets_a_freed_weight():
    cached = _weight(256, 1024, 8, 64, False)
    qw = QuantizedWeight(cached.qweight.clone(), cached.scale.clone(), cached.offset.clone(), 8, 64, 256, 1024,
                         symmetric=False)
    x, _ = _inputs(1, 1024, 256, torch.float16, seed=12)
    before = plan_cache.stats()["weights"]
    for strategy in ("gemv_mma", "gemv_stream", "dequant_cublas", "gemm_simt"):
        wo.linear_weight_only(x, qw, strategy=strategy)
    assert plan_cache.stats()["weights"] == before + 1
    del qw
    assert plan_cache.stats()["weights"] == before  # the plans held no reference to the weight's tensors
