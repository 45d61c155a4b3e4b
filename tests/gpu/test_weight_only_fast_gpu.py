"""The bandwidth strategies of cutlass_ops.weight_only on a GPU: "gemv_stream" (CUDA-core GEMV,
M <= 8) and "dequant_cublas" (dense dequantization + cuBLAS), against float64 references, with
outputs poisoned (NaN) before every launch so that unwritten elements fail.

Tolerances, derived from each format (u = unit roundoff of the activation type, S as in
test_weight_only_gpu: S^2 = sum_k x_k^2 (|q s| + |o|)^2 per output):
  * dequantize_weight: w = fma(q, s, o) in fp32, rounded once to T: |dw| <= (u + 2^-24) |w| (fp32
    rounding, then T's), plus half T's smallest subnormal spacing.
  * gemv_stream: a lane sums L = 16 (int4) / 8 (int8) products x q per chunk in T, each fma rounded
    (|err| <= u |partial sum|); with zero-mean products the partial sums grow like sqrt(j), so the
    variance over K is u^2 (L + 1) / 6 * sum (x q s)^2; s and o rounded to T add u^2 S^2 * 2/3.
    We allow 6.5 standard deviations, plus fp32 accumulation and output rounding as the other file.
  * dequant_cublas: w rounded once (u |w|), fp32 accumulation in cuBLAS: the other file's
    tensor-core tolerance (12 u S + ...) applies unchanged.
A wrong group scale, a dropped chunk or a permuted activation vector moves outputs by O(S / sqrt(K / 32))
or more, far outside these.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from custom_kernels.device import capability, sm_count, smem_limits
from cutlass_ops import weight_only as wo
from cutlass_ops.reference import linear_reference

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_weight_only_gpu import (  # noqa: E402  (helpers shared with the main weight-only GPU tests)
    K_MAIN, N_MAIN, UNIT_ROUNDOFF, _abs_weight_sq, _check, _dtype_id, _inputs, _tolerance, _weight,
)

pytestmark = pytest.mark.gpu

HALF_TYPES = [torch.float16, torch.bfloat16]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------

def _dev() -> int:
    return torch.cuda.current_device()


def _stream_tolerance(x: torch.Tensor, qw, ref: torch.Tensor, dtype) -> torch.Tensor:
    u = UNIT_ROUNDOFF[dtype]
    lane_products = 16 if qw.bits == 4 else 8
    S = ((x.to(torch.float64) ** 2) @ _abs_weight_sq(qw).T).sqrt()
    sigma = u * S * math.sqrt((lane_products + 1) / 6 + 2 / 3)
    return 1.01 * u * ref.abs() + 6.5 * sigma + 6 * 2.0 ** -24 * math.sqrt(qw.K) * S + 2.0 ** -25


def _check_stream(x, qw, bias, act, *, ref=None):
    """gemv_stream into a NaN-poisoned output, every element within _stream_tolerance."""
    return _check(x, qw, bias, act, "gemv_stream", ref=ref, tolerance=_stream_tolerance)


# --------------------------------------------------------------------------------------------
# dequantize_weight (the dequant_cublas kernel on its own)
# --------------------------------------------------------------------------------------------

DEQUANT_CASES = [
    # (N, K, bits, block_size): full tiles only / ragged tail / per-word groups / division path
    (N_MAIN, K_MAIN, 4, 64),
    (N_MAIN, K_MAIN, 8, 64),
    (77, 1056, 4, 32),     # 40656 bytes: 79 full 512-byte tiles + a 52-word tail
    (77, 1056, 8, 32),
    (300, 1064, 4, None),  # per-channel, K % 32 != 0: chunks straddle rows, one group per word
    (300, 1060, 8, None),  # int8 per-channel, K % 16 != 0
    (129, 960, 4, 48),     # non-power-of-two block: integer division, per-word groups
    (129, 960, 8, 48),     # 48 % 16 == 0: one group per chunk, division
    (64, 512, 4, 8),       # the smallest int4 block: per-word groups with a shift
    (64, 512, 8, 4),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=_dtype_id)
@pytest.mark.parametrize("case", DEQUANT_CASES, ids=lambda c: f"N{c[0]}-K{c[1]}-int{c[2]}-bs{c[3]}")
def test_dequantize_weight_matches_fma_reference(case, dtype):
    N, K, bits, block_size = case
    qw = _weight(N, K, bits, block_size, False)
    out = torch.full((N, K), float("nan"), dtype=dtype, device="cuda")
    w = wo.dequantize_weight(qw, dtype, out=out)
    torch.cuda.synchronize()
    assert w is out
    q = qw.int_values().to(torch.float64).reshape(N, qw.num_groups, qw.block_size)
    ref = (q * qw.scale.double()[..., None] + qw.offset.double()[..., None]).reshape(N, K)
    u = UNIT_ROUNDOFF[dtype]
    tol = (u + (2.0 ** -24 if dtype != torch.float32 else 0.0)) * ref.abs() + 2.0 ** -25
    err = (w.to(torch.float64) - ref).abs()
    bad = ~(err <= tol)
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        n, k = divmod(i, K)
        pytest.fail(f"{int(bad.sum())} of {bad.numel()} weights off; first at [{n}, {k}]: got {w[n, k].item()}, "
                    f"ref {ref[n, k].item()}")


def test_dequantize_weight_validates_out():
    qw = _weight(77, 1056, 4, 32, False)
    with pytest.raises(ValueError, match="out"):
        wo.dequantize_weight(qw, torch.float16, out=torch.empty(77, 1055, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="out"):
        wo.dequantize_weight(qw, torch.float16, out=torch.empty(77, 1056, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(TypeError, match="dtype"):
        wo.dequantize_weight(qw, torch.int8)


# --------------------------------------------------------------------------------------------
# dequant_cublas
# --------------------------------------------------------------------------------------------

def _dequant_cublas_cases():
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for bits in (4, 8):
            for M in (1, 17, 128, 300):
                cases.append((dtype, bits, M))
    return cases


@pytest.mark.parametrize("case", _dequant_cublas_cases(), ids=lambda c: f"{_dtype_id(c[0])}-int{c[1]}-M{c[2]}")
def test_dequant_cublas_matches_reference(case, monkeypatch):
    dtype, bits, M = case
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 must stay fp32
    qw = _weight(N_MAIN, K_MAIN, bits, 64, False)
    x, bias = _inputs(M, K_MAIN, N_MAIN, dtype, seed=20)
    act = (0, 1, 2)[M % 3]
    _check(x, qw, bias, act, "dequant_cublas")
    _check(x, qw, None, act, "dequant_cublas")


@pytest.mark.parametrize("block_size", [32, 128, None, 48])
@pytest.mark.parametrize("bits", [4, 8])
def test_dequant_cublas_block_sizes(bits, block_size):
    K = {128: 4224, 48: 4224}.get(block_size, K_MAIN)
    qw = _weight(N_MAIN, K, bits, block_size, True)
    x, bias = _inputs(160, K, N_MAIN, torch.bfloat16, seed=21)
    _check(x, qw, bias, 2, "dequant_cublas")


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=_dtype_id)
def test_default_dispatch_uses_dequant_cublas_from_the_threshold(dtype):
    """From DEQUANT_CUBLAS_MIN_M, or on Hopper above gemm_wgmma's range when that reaches further."""
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    M = wo.DEQUANT_CUBLAS_MIN_M
    if "gemm_wgmma" in wo.candidate_strategies(M, dtype, capability()):
        M = wo.dispatch.GEMM_WGMMA_LIMIT_M + 1
    x, bias = _inputs(M, K_MAIN, N_MAIN, dtype, seed=22)
    _check(x, qw, bias, 2, None)
    plan = wo.get_plan(qw, M, dtype, x.device.index)
    assert plan.strategy == "dequant_cublas"
    assert wo.get_plan(qw, M - 1, dtype, x.device.index).strategy != "dequant_cublas"


def test_dequant_cublas_follows_in_place_scale_change():
    qw = _weight(256, 1024, 8, 64, True)
    from cutlass_ops.formats import QuantizedWeight

    qw = QuantizedWeight(qw.qweight.clone(), qw.scale.clone(), qw.offset.clone(), 8, 64, 256, 1024)
    x, _ = _inputs(200, 1024, 256, torch.float16, seed=23)
    before = wo.linear_weight_only(x, qw, strategy="dequant_cublas")
    qw.scale.mul_(2)
    after = wo.linear_weight_only(x, qw, strategy="dequant_cublas")
    torch.testing.assert_close(after.float(), 2 * before.float(), rtol=2e-3, atol=1e-3)


def test_dequant_cublas_cuda_graph():
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    x, bias = _inputs(256, K_MAIN, N_MAIN, torch.float16, seed=24)
    expected = wo.linear_weight_only(x, qw, bias, 2, strategy="dequant_cublas")  # builds the plan
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            static_out = wo.linear_weight_only(static_x, qw, bias, 2, strategy="dequant_cublas")
    torch.cuda.current_stream().wait_stream(stream)
    # cuBLAS may pick another algorithm under capture: compare with the reference, not bitwise.
    for sign in (1, -1):
        static_x.copy_(sign * x)
        graph.replay()
        torch.cuda.synchronize()
        ref = linear_reference(sign * x, qw, bias, 2)
        assert bool(((static_out.double() - ref).abs() <= _tolerance(x, qw, ref, torch.float16)).all())
    assert bool(((expected.double() - linear_reference(x, qw, bias, 2)).abs()
                 <= _tolerance(x, qw, linear_reference(x, qw, bias, 2), torch.float16)).all())


# --------------------------------------------------------------------------------------------
# gemv_stream
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=_dtype_id)
def test_gemv_stream_block64_ragged_n(dtype, bits, M):
    """N = 4097 (a partial row group), K = 4160 (not a multiple of 32 chunks), asymmetric block 64."""
    qw = _weight(N_MAIN, K_MAIN, bits, 64, False)
    x, bias = _inputs(M, K_MAIN, N_MAIN, dtype, seed=30)
    _check_stream(x, qw, bias, 2)


@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("block_size", [32, 128, None, 96])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", HALF_TYPES, ids=_dtype_id)
def test_gemv_stream_block_sizes(dtype, bits, block_size, M):
    """Blocks 32 / 128 / per-channel (shift path) and 96 (3 or 6 chunks per group: division path)."""
    K = 4224 if block_size in (128, 96) else K_MAIN
    qw = _weight(N_MAIN, K, bits, block_size, True)
    x, bias = _inputs(M, K, N_MAIN, dtype, seed=31)
    _check_stream(x, qw, bias if M != 3 else None, 2 if M != 8 else 1)


@pytest.mark.parametrize("N", [1, 3, 5, 77])
@pytest.mark.parametrize("bits", [4, 8])
def test_gemv_stream_tiny_n(bits, N):
    """Fewer rows than one row group (rows past N are clamped to N - 1 and dropped), and N = 77."""
    qw = _weight(N, 1056, bits, 32, False)
    x, bias = _inputs(3, 1056, N, torch.float16, seed=32)
    _check_stream(x, qw, bias, 0)


@pytest.mark.parametrize("M", [1, 7])
@pytest.mark.parametrize("bits", [4, 8])
def test_gemv_stream_split_k_is_exact_and_deterministic(bits, M):
    """Small N splits K across blocks (fp32 workspace + splitk_reduce)."""
    N, K = 256, 8192
    qw = _weight(N, K, bits, 128, False)
    x, bias = _inputs(M, K, N, torch.float16, seed=33)
    shape = wo.stream_launch_shape(M, N, K, bits, sm_count(_dev()), *smem_limits(_dev()))
    assert shape.splits > 1
    first = _check_stream(x, qw, bias, 0)
    second = wo.linear_weight_only(x, qw, bias, 0, strategy="gemv_stream")
    assert torch.equal(first, second)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=_dtype_id)
def test_gemv_stream_long_k_splits_for_shared_memory(dtype):
    """M = 8, K = 16384: the activations (256 KiB) exceed one block's shared memory, so K is split."""
    M, N, K = 8, 1031, 16384
    qw = _weight(N, K, 4, 128, False)
    shape = wo.stream_launch_shape(M, N, K, 4, sm_count(_dev()), *smem_limits(_dev()))
    assert shape.splits > 1 and shape.smem <= smem_limits(_dev())[1]
    x, bias = _inputs(M, K, N, dtype, seed=34)
    _check_stream(x, qw, bias, 2)


@pytest.mark.parametrize("bits, sigma", [(8, 125.0), (4, 4000.0), (8, 2000.0)])  # all overflow unguarded
def test_gemv_stream_half_large_activations_do_not_overflow(bits, sigma):
    """float16 rows whose chunk partial sums would pass 65504 (max |x| > 32 for int8, > 256 for int4) are
    scaled by a power of two in the kernel. Row 0 is large throughout, row 1 is N(0, 1), row 2 is
    N(0, 1) with one outlier of 8 sigma."""
    K, N = 2048, 515
    qw = _weight(N, K, bits, 64, False)
    gen = torch.Generator().manual_seed(35 + bits)
    x = torch.randn(3, K, generator=gen)
    x[0] *= sigma
    x[2, 100] = 8 * sigma
    x = x.to(torch.float16).cuda()
    bias = (torch.randn(N, generator=gen) * 0.5).to(torch.float16).cuda()
    ref = linear_reference(x, qw, bias, 0)
    assert bool(ref.abs().max() < 60000), "test data must stay within float16's range"
    out = _check_stream(x, qw, bias, 0, ref=ref)
    assert bool(torch.isfinite(out).all())


def test_gemv_stream_bfloat16_large_activations():
    qw = _weight(515, 2048, 8, 64, False)
    gen = torch.Generator().manual_seed(36)
    x = (torch.randn(2, 2048, generator=gen) * 1e5).to(torch.bfloat16).cuda()
    _check_stream(x, qw, None, 0)


def test_gemv_stream_matches_other_strategies_in_tolerance():
    """Same answer as the tensor-core GEMV on the same inputs (both within the reference tolerance)."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("gemv_mma needs sm_80+")
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    x, bias = _inputs(2, K_MAIN, N_MAIN, torch.float16, seed=37)
    ref = linear_reference(x, qw, bias, 0)
    stream = _check_stream(x, qw, bias, 0, ref=ref)
    mma = _check(x, qw, bias, 0, "gemv_mma", ref=ref)
    tol = _stream_tolerance(x, qw, ref, torch.float16) + _tolerance(x, qw, ref, torch.float16)
    assert bool(((stream.double() - mma.double()).abs() <= tol).all())


def test_gemv_stream_table_flip_routes_the_default(monkeypatch):
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("SMALL_M_GEMV applies on sm_80+")
    from cutlass_ops.formats import QuantizedWeight

    cached = _weight(N_MAIN, K_MAIN, 4, 64, False)
    # A fresh weight: plans are cached per weight, and the shared one must keep its default plans.
    qw = QuantizedWeight(cached.qweight.clone(), cached.scale.clone(), cached.offset.clone(), 4, 64, N_MAIN, K_MAIN,
                         symmetric=False)
    x, bias = _inputs(1, K_MAIN, N_MAIN, torch.float16, seed=38)
    monkeypatch.setitem(wo.SMALL_M_GEMV, 1, "gemv_stream")
    assert wo.get_plan(qw, 1, torch.float16, x.device.index).strategy == "gemv_stream"
    _check(x, qw, bias, 2, None)


def test_gemv_stream_cuda_graph_split_k():
    N, K = 256, 8192
    qw = _weight(N, K, 4, 128, False)
    x, bias = _inputs(1, K, N, torch.float16, seed=39)
    expected = wo.linear_weight_only(x, qw, bias, 0, strategy="gemv_stream")
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            static_out = wo.linear_weight_only(static_x, qw, bias, 0, strategy="gemv_stream")
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, expected)


def test_gemv_stream_refuses_what_it_cannot_run():
    qw = _weight(N_MAIN, K_MAIN, 4, 64, False)
    with pytest.raises(ValueError, match="float32"):
        wo.linear_weight_only(torch.zeros(1, K_MAIN, device="cuda"), qw, strategy="gemv_stream")
    with pytest.raises(ValueError, match="M <= 8"):
        wo.linear_weight_only(torch.zeros(9, K_MAIN, dtype=torch.float16, device="cuda"), qw,
                              strategy="gemv_stream")
