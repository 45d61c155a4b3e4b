"""Scheme 2 on the GPU: the per-K-block orchestrator (CUTLASS kblock_accumulate epilogue), the
documents' literal variant (DequantAndAcc with atomics) and the fused kernel, all through
``cutlass_ops.linear_w8a8``, against a float64 evaluation of the 4-term formula."""
from __future__ import annotations

import pytest
import torch

import cutlass_ops as ops
from cutlass_ops.formats import quantize_activation_reference

pytestmark = pytest.mark.gpu

PATHS = ("orchestrator", "literal", "fused")
EPS = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _reference_and_bound(x, qw, bias, act):
    """float64 scheme-2 result on the GPU, and an error bound for an fp32-accumulating kernel."""
    bs = qw.block_size
    A_q, sA, oA, sumA = (t.to(x.device) for t in quantize_activation_reference(x.cpu(), bs))
    M, K = A_q.shape
    G = K // bs
    Aq = A_q.double().view(M, G, bs).transpose(0, 1)            # [G, M, bs]
    Bq = qw.qweight.double().view(qw.N, G, bs).permute(1, 2, 0)  # [G, bs, N]
    Cq = torch.bmm(Aq, Bq)                                      # [G, M, N]
    sA, oA, sumA = sA.double().T[:, :, None], oA.double().T[:, :, None], sumA.double().T[:, :, None]
    sB, oB = qw.scale.double().T[:, None, :], qw.offset.double().T[:, None, :]
    sumB = Bq.sum(1, keepdim=True)                              # [G, 1, N]
    terms = (sA * sB * Cq, sA * oB * sumA, oA * sB * sumB, bs * oA * oB)
    ref = sum(t.sum(0) for t in terms)
    magnitude = sum(t.abs().sum(0) for t in terms)
    if bias is not None:
        ref = ref + bias.double()
        magnitude = magnitude + bias.double().abs()
    ref = torch.clamp(ref, min=0) if act else ref
    ref = torch.clamp(ref, max=6) if act == "relu6" else ref
    return ref, (3 * G + 8) * 2.0**-24 * magnitude


def _check(out, ref, bound, dtype):
    assert out.dtype == dtype and not torch.isnan(out).any() and not torch.isinf(out).any()
    err = (out.double() - ref).abs()
    allowed = bound + EPS[dtype] * ref.abs() + 1e-30
    worst = (err / allowed).max().item()
    assert worst <= 1.0, f"max error / bound = {worst:.3f}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("M", [1, 3, 17, 127])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_paths_ragged_block64(path, M, dtype):
    torch.manual_seed(M)
    N, K, bs = 4097, 4160, 64
    w = torch.randn(N, K) * 0.05
    qw = ops.quantize_weight(w, bits=8, block_size=bs, symmetric=False).to("cuda")
    x = torch.randn(M, K, device="cuda").to(dtype)
    bias = torch.randn(N, device="cuda")
    out = ops.linear_w8a8(x, qw, bias, activation="relu6", path=path)
    ref, bound = _reference_and_bound(x, qw, bias, "relu6")
    _check(out, ref, bound, dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bs", [32, 64, 128, 256])
def test_every_block_size(path, bs):
    torch.manual_seed(bs)
    M, N, K = 33, 1000, 4352 if bs == 256 else 4160 if bs == 64 else 4096
    qw = ops.quantize_weight(torch.randn(N, K) * 0.05, bits=8, block_size=bs, symmetric=False).to("cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    out = ops.linear_w8a8(x, qw, None, activation="relu", path=path)
    ref, bound = _reference_and_bound(x, qw, None, "relu")
    _check(out, ref, bound, torch.float16)


@pytest.mark.parametrize("path", PATHS)
def test_large_M(path):
    torch.manual_seed(7)
    M, N, K, bs = 2048, 1032, 2048, 128
    qw = ops.quantize_weight(torch.randn(N, K) * 0.05, bits=8, block_size=bs, symmetric=False).to("cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    out = ops.linear_w8a8(x, qw, None, path=path)
    ref, bound = _reference_and_bound(x, qw, None, None)
    _check(out, ref, bound, torch.bfloat16)


@pytest.mark.parametrize("path", PATHS)
def test_constant_activation_block_gives_finite_output(path):
    M, N, K, bs = 5, 64, 256, 64
    qw = ops.quantize_weight(torch.randn(N, K) * 0.05, bits=8, block_size=bs, symmetric=False).to("cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    x[:, :bs] = 0.75   # a zero-range block in every row
    x[2, bs:] = -1.25  # and a whole constant row
    out = ops.linear_w8a8(x, qw, None, path=path)
    ref, bound = _reference_and_bound(x, qw, None, None)
    _check(out, ref, bound, torch.float16)


@pytest.mark.parametrize("path", ["orchestrator", "literal"])
def test_graph_capture(path):
    torch.manual_seed(3)
    M, N, K, bs = 16, 256, 512, 128
    qw = ops.quantize_weight(torch.randn(N, K) * 0.05, bits=8, block_size=bs, symmetric=False).to("cuda")
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    expected = ops.linear_w8a8(x, qw, None, path=path)  # warm-up: loads every kernel
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        out = ops.linear_w8a8(x, qw, None, path=path)
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0) if path == "orchestrator" else \
        torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)  # atomics: order may differ


@pytest.mark.parametrize("path", ["orchestrator", "literal"])
def test_many_M_share_bucketed_buffers(path):
    """Calls of one weight at several M: the per-block buffers are kept per M bucket (a few sets, the
    first M rows used), so every M is right and the per-weight plans stay bounded."""
    from cutlass_ops import plan_cache
    from cutlass_ops.w8a8.blocks import BUCKETS_KEPT, m_bucket

    torch.manual_seed(5)
    N, K, bs = 264, 512, 128
    qw = ops.quantize_weight(torch.randn(N, K) * 0.05, bits=8, block_size=bs, symmetric=False).to("cuda")
    Ms = (17, 18, 1, 16, 33, 300, 17, 129, 250, 1000, 2, 77)
    for M in Ms:
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        out = ops.linear_w8a8(x, qw, None, path=path)
        ref, bound = _reference_and_bound(x, qw, None, None)
        _check(out, ref, bound, torch.float16)
    plan = plan_cache.plan(qw, f"w8a8.{path}", lambda: None)
    assert plan is not None and len(plan.buffers._sets) <= BUCKETS_KEPT
    assert m_bucket(17) == m_bucket(18) and m_bucket(1) == m_bucket(16) == 16
    assert all(M <= m_bucket(M) <= M * 9 // 8 + 1 for M in range(17, 5000))
