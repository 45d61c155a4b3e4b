"""int8_gemm at an N that is not a multiple of 16 bytes of D: the any-N kernels on a GPU.

On GPUs with Sm80 kernels (compute capability >= 8.0) such an N runs on the plan's any-N kernel
(cutlass_ops/cutlass/tuning.py ``any_n_spec``: Sm80, D stored one element at a time), with nothing
padded along N: no padded copy of B or of the per-column inputs, D written in place. Every registered
epilogue with every output type it writes, N in {1, 3, 257, 1000, 4097}, M in {1, 3, 64, 130} (every M
bucket), without and with ``out=``; int32 and int8 results equal the exact product / float64 reference
bit for bit (power-of-two requant multipliers), float results are held to tests/gpu/test_int8_gemm_gpu.py's
bound. Also K unaligned on the same kernel (A and B padded along K only) and CUDA-graph replays. Outside
graph capture the plans pad N instead at M = 1 and, on Sm90 plans, at M <= 64 and on long any-N grids
(cutlass/plan.py ``pads_N``): these tests keep every M > 1 on the any-N kernels (fixture ``any_n_rule``).
Padding itself (Sm75, any K, the padded-N rule on Hopper): tests/gpu/test_int8_any_shape_gpu.py.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import epilogues

# the padded tests' helpers (inputs with exact requant results, the check against the reference, and through
# them the aligned tests' tolerance), loaded once whichever file pytest imports first
_spec = importlib.util.spec_from_file_location("test_int8_any_shape_gpu",
                                               Path(__file__).with_name("test_int8_any_shape_gpu.py"))
_shape = sys.modules.setdefault("test_int8_any_shape_gpu", importlib.util.module_from_spec(_spec))
if not hasattr(_shape, "_check"):
    _spec.loader.exec_module(_shape)
_check, _epilogue_inputs, _int8 = _shape._check, _shape._epilogue_inputs, _shape._int8

pytestmark = pytest.mark.gpu

PAIRS = [(name, element) for name in epilogues.names() for element in epilogues.get(name).output_dtypes]
N_VALUES = (1, 3, 257, 1000, 4097)
M_VALUES = (1, 3, 64, 130)
K = 256


@pytest.fixture(scope="module")
def co():
    import cutlass_ops

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        pytest.skip("any-N kernels are Sm80: this GPU pads N (test_int8_any_shape_gpu.py)")
    return cutlass_ops


@pytest.fixture(autouse=True)
def any_n_rule(monkeypatch):
    """The any-N kernels under test at every M > 1 (pads_N as before the Hopper padded-N rule: M = 1 only)."""
    from cutlass_ops.cutlass import plan as plan_module

    monkeypatch.setattr(plan_module.Int8Gemm, "pads_N", lambda self, M, N, device: M == 1)


def _ctas(plan, M: int, N: int) -> int:
    from cutlass_ops.cutlass.plan import _ctas as ctas

    return ctas(plan, M, N)


def _plan(M: int, name: str, element: str):
    from cutlass_ops.cutlass import plan_for

    return plan_for(M, torch.cuda.current_device(), name, None, epilogues.OUTPUT_DTYPES[element])


def _assert_ran_unpadded(M: int, N: int, name: str, element: str, weight_side: list) -> None:
    """N unaligned for the bucket's kernel: the any-N kernel is loaded and nothing was padded along N."""
    from cutlass_ops.cutlass import padding

    plan = _plan(M, name, element)
    assert plan.any_n is not None and plan.any_n.spec.alignment_D == 1 and plan.any_n.spec.kernel_cc == 80
    if N % plan.spec.alignment_D:
        chosen = plan.any_n_for(M, N, torch.cuda.current_device())
        assert chosen in (plan.any_n, plan.any_n_narrow, plan.any_n_wide) and chosen.spec.alignment_D == 1
        assert chosen._kernel is not None  # the any-N kernel it picks ran
        assert all(padding._padded.get(t) is None for t in weight_side)  # B, per-column inputs: no copies


@pytest.mark.parametrize("M", M_VALUES)
@pytest.mark.parametrize("N", N_VALUES)
@pytest.mark.parametrize("name,element", PAIRS, ids=[f"{n}-{e}" for n, e in PAIRS])
def test_every_epilogue_any_N(co, name, element, N, M):
    gen = torch.Generator().manual_seed(M * 10007 + N)
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs(name, M, N, gen)
    dtype = epilogues.OUTPUT_DTYPES[element]
    D = co.int8_gemm(A, B, name, out_dtype=dtype, **inputs)
    _check(D, A, B, name, element, inputs)
    out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda") if dtype.is_floating_point else \
        torch.full((M, N), -7, dtype=dtype, device="cuda")
    assert co.int8_gemm(A, B, name, out=out, **inputs) is out
    _check(out, A, B, name, element, inputs)
    per_col = [v for n, v in inputs.items() if dict(epilogues.get(name).inputs).get(n) == "per_col"]
    if M > 1:  # M = 1 outside capture pads N on purpose (test_M1_pads_N_outside_capture)
        _assert_ran_unpadded(M, N, name, element, [B, *per_col])
    assert torch.equal(co.int8_gemm(A, B, name, out_dtype=dtype, **inputs), D)  # again: the C++ path's shape


def _run_and_check(co, name: str, element: str, M: int, N: int, seed: int):
    """int8_gemm at (M, N, K) checked against the reference; the plan of M's bucket."""
    gen = torch.Generator().manual_seed(seed)
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs(name, M, N, gen)
    D = co.int8_gemm(A, B, name, out_dtype=epilogues.OUTPUT_DTYPES[element], **inputs)
    _check(D, A, B, name, element, inputs)
    return _plan(M, name, element)


@pytest.mark.parametrize("N", (257, 4097))
@pytest.mark.parametrize("name,element", [("none", "s32"), ("requant_clamp", "s8"), ("dequant_relu", "bf16"),
                                          ("kblock_accumulate", "f32")])
def test_large_M_takes_the_wide_any_N_tile_where_it_fills_the_GPU(co, name, element, N):
    """Large M bucket: the wide any-N tile where its tiles alone cover the SMs (N = 4097), a smaller one where
    they would not (N = 257: the any-N tile, or the narrow one where that leaves SMs idle); both exact / bounded."""
    from cutlass_ops.cutlass.plan import bucket_limits, _gpu_name
    from custom_kernels.device import sm_count

    M = bucket_limits(_gpu_name(0))[1] + 264
    plan = _run_and_check(co, name, element, M, N, M + N)
    wide = plan.any_n_wide
    assert wide is not None and wide.spec.threadblock_shape != plan.any_n.spec.threadblock_shape
    fills = _ctas(wide, M, N) >= sm_count(0)
    small = plan.any_n if _ctas(plan.any_n, M, N) >= sm_count(0) else plan.any_n_narrow
    assert plan.any_n_for(M, N, 0) is (wide if fills else small)
    assert (wide if fills else small)._kernel is not None  # the one chosen ran


@pytest.mark.parametrize("M,N", [(64, 257), (64, 4097), (130, 1001), (8, 3)])
@pytest.mark.parametrize("name,element", [("none", "s32"), ("requant", "s8"), ("dequant", "f16")])
def test_idle_grids_take_the_narrow_any_N_tile(co, name, element, M, N):
    """These grids of the any-N tile (64 x 64) have at most 65 CTAs, fewer than the GPU's SMs: the narrow tile
    (64 x 32) runs; exact / bounded as the others."""
    from custom_kernels.device import sm_count

    plan = _run_and_check(co, name, element, M, N, M * 31 + N)
    narrow = plan.any_n_narrow
    assert narrow is not None and narrow.spec.threadblock_shape[1] < plan.any_n.spec.threadblock_shape[1]
    if _ctas(plan.any_n, M, N) >= sm_count(0):
        pytest.skip(f"a GPU of {sm_count(0)} SMs: the any-N tile's {_ctas(plan.any_n, M, N)} CTAs fill it")
    assert plan.any_n_for(M, N, 0) is narrow and narrow._kernel is not None


@pytest.mark.parametrize("name,element", [("none", "s32"), ("requant", "s8"), ("dequant", "f16")])
def test_M1_pads_N_outside_capture_and_takes_any_N_while_capturing(co, name, element):
    """M = 1: one row of D_pad is D already, so eagerly the aligned kernel runs on N-padded B (kept per
    tensor); while a CUDA graph is captured nothing is kept, so the graph holds the any-N kernel instead of
    a copy of B per replay. Both give the exact / bounded result."""
    from cutlass_ops.cutlass import padding

    N = 257
    gen = torch.Generator().manual_seed(N)
    A, B = _int8(1, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs(name, 1, N, gen)
    dtype = epilogues.OUTPUT_DTYPES[element]
    D = co.int8_gemm(A, B, name, out_dtype=dtype, **inputs)
    _check(D, A, B, name, element, inputs)
    assert padding._padded.get(B), "M = 1 eagerly: B padded along N and kept"
    B2 = B.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        G = co.int8_gemm(A, B2, name, out_dtype=dtype, **inputs)
    graph.replay()
    torch.cuda.synchronize()
    assert padding._padded.get(B2) is None, "captured: the any-N kernel, nothing padded"
    _check(G, A, B2, name, element, inputs)


@pytest.mark.parametrize("M,N,K_odd", [(3, 257, 100), (64, 1001, 4097), (130, 4097, 33)])
@pytest.mark.parametrize("name,element", [("none", "s32"), ("requant", "s8"), ("dequant", "f16")])
def test_unaligned_K_pads_only_K(co, name, element, M, N, K_odd):
    """K % 16 != 0 on the any-N kernel: A copied per call, B padded along K only (its rows stay N)."""
    from cutlass_ops.cutlass import padding

    gen = torch.Generator().manual_seed(N + K_odd)
    A, B = _int8(M, K_odd, generator=gen), _int8(N, K_odd, generator=gen)
    inputs = _epilogue_inputs(name, M, N, gen)
    D = co.int8_gemm(A, B, name, out_dtype=epilogues.OUTPUT_DTYPES[element], **inputs)
    _check(D, A, B, name, element, inputs)
    copies = padding._padded.get(B)
    assert copies and {key[0] for key in copies} == {N}  # padded to [N, K16], not N_pad
    for name_in, value in inputs.items():
        if dict(epilogues.get(name).inputs).get(name_in) == "per_col":
            assert padding._padded.get(value) is None


@pytest.mark.parametrize("N", (257, 1000))
@pytest.mark.parametrize("name,element", PAIRS, ids=[f"{n}-{e}" for n, e in PAIRS])
def test_cuda_graph_replays_any_N(co, name, element, N):
    """Captured at an unaligned N: the graph holds the any-N kernel alone (no copy of B, no D copy), and
    replays read A's and B's current values."""
    from cutlass_ops.cutlass import padding

    M = 64
    gen = torch.Generator().manual_seed(N)
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs(name, M, N, gen)
    dtype = epilogues.OUTPUT_DTYPES[element]
    co.int8_gemm(A, B, name, out_dtype=dtype, **inputs)  # warm-up: load the kernel, register the shape
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        D = co.int8_gemm(A, B, name, out_dtype=dtype, **inputs)
    assert padding._padded.get(B) is None
    for _ in range(2):
        A.copy_(_int8(M, K, generator=gen))
        B.copy_(_int8(N, K, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        _check(D, A, B, name, element, inputs)
