"""Programmatic dependent launch of the Sm90 CUTLASS kernels: a kernel that reads what the kernel
just before it wrote must see all of it, eagerly and in a CUDA graph (a missing wait on the
previous grid would read the zeros the buffers start from)."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops import cutlass as gemm
from cutlass_ops.cutlass.build import lookup
from cutlass_ops.cutlass.kernel import GemmKernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs an sm_90 GPU")]

LAYERS = 6


def _chain(x0, weights, multipliers, biases, hidden, sync: bool):
    """h_{i+1} = requant(h_i @ W_i^T) into preallocated buffers, back to back on one stream."""
    h = x0
    for W, m, b, out in zip(weights, multipliers, biases, hidden):
        gemm.int8_gemm(h, W, "requant", arch=90, out=out, multiplier=m, fused_bias=b)
        if sync:
            torch.cuda.synchronize()
        h = out
    return h


def _problem(M: int, H: int, gen: torch.Generator):
    x0 = torch.randint(-128, 128, (M, H), dtype=torch.int8, generator=gen).cuda()
    weights = [torch.randint(-128, 128, (H, H), dtype=torch.int8, generator=gen).cuda() for _ in range(LAYERS)]
    # std(accumulator) ~ std(h) * 74 * sqrt(H): this multiplier keeps std(h) ~ 70 layer after layer
    multipliers = [torch.full((H,), 1.0 / (74 * H ** 0.5)).cuda() for _ in range(LAYERS)]
    biases = [(torch.rand(H, generator=gen) * 2000 - 1000).cuda() for _ in range(LAYERS)]
    return x0, weights, multipliers, biases


@pytest.mark.parametrize("M", (16, 200, 1024))  # the small, medium and large (cluster) tiles
def test_dependent_chain_sees_each_previous_result(M):
    gen = torch.Generator().manual_seed(7)
    H = 2048
    x0, weights, multipliers, biases = _problem(M, H, gen)
    plan = gemm.get_plan(0, 90, "requant", "s8", M)
    assert plan.kernel.pdl, "Sm90 kernels are built with grid dependency control and launched with PDL"
    ref_bufs = [torch.zeros(M, H, dtype=torch.int8, device="cuda") for _ in range(LAYERS)]
    ref = _chain(x0, weights, multipliers, biases, ref_bufs, sync=True).clone()
    assert 0.9 < (ref != 0).float().mean() and (ref.abs() >= 127).float().mean() < 0.3  # a chain worth checking
    for _ in range(5):
        bufs = [torch.zeros(M, H, dtype=torch.int8, device="cuda") for _ in range(LAYERS)]
        out = _chain(x0, weights, multipliers, biases, bufs, sync=False)
        torch.cuda.synchronize()
        for got, want in zip(bufs, ref_bufs):
            assert torch.equal(got, want)
        assert torch.equal(out, ref)


def test_dependent_chain_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(8)
    M, H = 64, 2048
    x0, weights, multipliers, biases = _problem(M, H, gen)
    ref_bufs = [torch.zeros(M, H, dtype=torch.int8, device="cuda") for _ in range(LAYERS)]
    _chain(x0, weights, multipliers, biases, ref_bufs, sync=True)
    bufs = [torch.zeros(M, H, dtype=torch.int8, device="cuda") for _ in range(LAYERS)]
    _chain(x0, weights, multipliers, biases, bufs, sync=False)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _chain(x0, weights, multipliers, biases, bufs, sync=False)
    for _ in range(3):
        for b in bufs:
            b.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(bufs, ref_bufs):
            assert torch.equal(got, want)


def test_last_writer_wins_on_one_output():
    gen = torch.Generator().manual_seed(9)
    M, N, K = 16, 8192, 4096
    A1, A2 = (torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=gen).cuda() for _ in range(2))
    B = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=gen).cuda()
    want = gemm.int8_gemm(A2, B, "none", arch=90)
    D = torch.empty_like(want)
    for _ in range(20):
        for _ in range(3):
            gemm.int8_gemm(A1, B, "none", arch=90, out=D)
        gemm.int8_gemm(A2, B, "none", arch=90, out=D)
    torch.cuda.synchronize()
    assert torch.equal(D, want)


def test_pdl_can_be_turned_off(monkeypatch):
    spec = gemm.get_plan(0, 90, "none", None, 16).spec
    artifact = lookup(spec)
    assert artifact is not None and artifact.meta["grid_dependency_control"]
    monkeypatch.setenv("CUTLASS_OPS_PDL", "0")
    assert not GemmKernel(artifact).pdl
    monkeypatch.setenv("CUTLASS_OPS_PDL", "1")
    assert GemmKernel(artifact).pdl
