"""CUTLASS int8 GEMMs on a GPU: every kernel generation, every epilogue, pointer patching, graphs.

Integer-valued inputs: int32 results must equal torch._int_mm (and the exact float64 product,
exact because |sum| < 2^53) bit for bit. Float epilogues are compared with their float64
reference (the epilogue function itself) within the output format's rounding.
Kernels come from the cache (scripts/build_kernels.py --arch 90); a missing one is built first.
"""
from __future__ import annotations

import pytest
import torch

import epilogues
from cutlass_ops import cutlass as gemm
from cutlass_ops.cutlass import int8_gemm, int8_gemm_requant

pytestmark = pytest.mark.gpu

M_VALUES = (1, 3, 17, 127, 512)
# (N, K): minimal, not multiples of any tile, and larger; every N/K obeys the 16-byte rules.
NK_VALUES = ((8, 16), (264, 272), (1000, 1040))
EPS = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24}  # unit roundoff of each output format
TINY = {"f16": 2.0 ** -25, "bf16": 2.0 ** -134, "f32": 2.0 ** -150}  # half the smallest subnormal


def _archs() -> list[int]:
    if not torch.cuda.is_available():
        return [90, 80, 75]
    major, minor = torch.cuda.get_device_capability()
    cc = 10 * major + minor
    return [a for a in (90, 80, 75) if a <= cc and (a != 90 or cc == 90)]


ARCHS = _archs()


def _int8(*shape, generator=None) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator).cuda()


def _exact(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A @ B^T exactly: float64 holds every partial sum of int8 products below 2^53."""
    return (A.double() @ B.double().T).round().long()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("N,K", NK_VALUES)
@pytest.mark.parametrize("M", M_VALUES)
def test_int32_gemm_matches_int_mm(arch, M, N, K, gen):
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    D = int8_gemm(A, B, arch=arch)
    assert D.dtype == torch.int32 and D.shape == (M, N)
    assert torch.equal(D.long(), _exact(A, B))
    if M > 16 and N % 8 == 0 and K % 8 == 0:
        assert torch.equal(D, torch._int_mm(A, B.T))


@pytest.mark.parametrize("arch", ARCHS)
def test_large_int32_gemm_matches_int_mm(arch, gen):
    A, B = _int8(512, 4096, generator=gen), _int8(4096, 4096, generator=gen)
    assert torch.equal(int8_gemm(A, B, arch=arch), torch._int_mm(A, B.T))


def _inputs(name: str, M: int, N: int, gen: torch.Generator, *, power_of_two: bool = False) -> dict:
    """Epilogue inputs of sensible magnitude (results of order 1..100)."""
    spec = epilogues.get(name)
    values = {}
    for arg, kind in spec.inputs:
        if kind == "scalar":
            continue
        shape = spec.input_shape(kind, M, N)
        if arg in ("multiplier",):
            exponent = torch.randint(-12, -7, shape, generator=gen).float()
            values[arg] = (2.0 ** exponent if power_of_two else torch.rand(shape, generator=gen) * 2e-3 + 1e-4)
        elif arg == "fused_bias":
            values[arg] = torch.randint(-3000, 3000, shape, generator=gen).float()
        elif arg.startswith("scale") or arg in ("r1", "c1"):
            values[arg] = torch.rand(shape, generator=gen) * 1e-3 + 1e-4
        else:
            values[arg] = torch.randn(shape, generator=gen)
        values[arg] = values[arg].reshape(shape if kind == "matrix" else (-1,)).cuda()
    return values


def _check_float(out: torch.Tensor, ref: torch.Tensor, element: str, magnitude: torch.Tensor) -> None:
    """|out - ref| <= one rounding of the output format + f32 arithmetic on the summed terms."""
    bound = 2 * EPS[element] * ref.abs() + 8 * 2.0 ** -24 * magnitude + TINY[element]
    err = (out.double().cpu() - ref).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3e} exceeds the bound by {worst:.3e}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("M", (3, 127))
@pytest.mark.parametrize("name,element", [
    ("dequant", "f16"), ("dequant", "bf16"), ("dequant", "f32"),
    ("dequant_relu", "f16"), ("dequant_relu", "bf16"), ("dequant_relu", "f32"),
    ("dequant_relu6", "f16"), ("dequant_relu6", "bf16"), ("dequant_relu6", "f32"),
    ("kblock_accumulate", "f32"),
])
def test_float_epilogue_matches_float64_reference(arch, M, name, element, gen):
    N, K = 264, 272
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _inputs(name, M, N, gen)
    if name.startswith("dequant"):
        inputs["scale_row"] = inputs["scale_row"] * 40  # outputs around +-50: relu6 clips some
    out = int8_gemm(A, B, name, arch=arch, out_dtype=element, **inputs)
    spec = epilogues.get(name)
    accum = _exact(A, B).cpu()
    ref = spec.reference(accum, element, **inputs)
    terms = spec.reference(accum.abs(), element, **{k: v.abs() for k, v in inputs.items()})
    assert out.dtype == epilogues.OUTPUT_DTYPES[element]
    _check_float(out, ref, element, terms.abs())


@pytest.mark.parametrize("arch", ARCHS)
def test_dequant_without_bias_reads_zero(arch, gen):
    M, N, K = 17, 264, 272
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _inputs("dequant", M, N, gen)
    inputs.pop("bias")
    out = int8_gemm(A, B, "dequant", arch=arch, out_dtype=torch.float32, **inputs)
    ref = epilogues.get("dequant").reference(_exact(A, B).cpu(), "f32", **inputs)
    _check_float(out, ref, "f32", ref.abs())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("M", (3, 127))
@pytest.mark.parametrize("clamp", [(-128, 127), (-100, 90)])
def test_requant_rounds_half_even_and_saturates_exactly(arch, M, clamp, gen):
    """Small operands, power-of-two multipliers and integer biases make every float value exact
    and put many on ties (x.5): each element must equal round-half-even + clamp, bit for bit."""
    N, K = 272, 272  # int8 D: N must be a multiple of 16
    A = torch.randint(-3, 4, (M, K), dtype=torch.int8, generator=gen).cuda()
    B = torch.randint(-3, 4, (N, K), dtype=torch.int8, generator=gen).cuda()
    multiplier = (2.0 ** -torch.randint(1, 4, (N,), generator=gen).float()).cuda()  # 1/2, 1/4, 1/8
    fused_bias = torch.randint(-200, 201, (N,), generator=gen).float().cuda()
    out = int8_gemm_requant(A, B, multiplier, fused_bias, clamp=clamp, arch=arch)
    assert out.dtype == torch.int8
    accum = _exact(A, B).cpu()
    ref = epilogues.get("requant").reference(accum, "s8", multiplier=multiplier, fused_bias=fused_bias)
    assert torch.equal(out.cpu().double(), ref.clamp(*clamp))
    exact = multiplier.cpu().double() * (accum.double() + fused_bias.cpu().double())
    assert (exact.frac().abs() == 0.5).any(), "the data should put values on ties"
    assert ((exact > clamp[1]) | (exact < clamp[0])).any(), "the data should saturate some values"


@pytest.mark.parametrize("arch", ARCHS)
def test_requant_without_bias(arch, gen):
    M, N, K = 64, 128, 64
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    mult = _inputs("requant", M, N, gen, power_of_two=True)["multiplier"]
    out = int8_gemm_requant(A, B, mult, None, arch=arch)
    ref = epilogues.get("requant").reference(_exact(A, B).cpu(), "s8", multiplier=mult, fused_bias=None)
    assert torch.equal(out.cpu().double(), ref)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["none", "dequant"])
def test_patched_params_equal_fresh_params(arch, name, gen):
    """Params patched with new pointers equal Params built from scratch for those pointers."""
    M, N, K = 127, 264, 272
    plan = gemm.get_plan(torch.cuda.current_device(), arch, name, None, M)
    calls = []
    for _ in range(3):  # three sets of buffers: three different pointer sets
        A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
        inputs = _inputs(name, M, N, gen)
        M_, N_, K_, pointers, scalars, out = plan.launch_arguments(A, B, **inputs)
        params, grid, block, patched = plan.kernel.launch_state(M, N, K, pointers, scalars)
        fresh, fresh_grid, fresh_block = plan.kernel.fresh_params(M, N, K, pointers, scalars)
        assert params == fresh and grid == fresh_grid and block == fresh_block
        plan.kernel.launch(M, N, K, pointers, scalars)
        calls.append((A, B, inputs, out, patched))
    torch.cuda.synchronize()
    for A, B, inputs, out, _ in calls:  # each launch wrote its own output
        ref = epilogues.get(name).reference(_exact(A, B).cpu(), None, **inputs)
        if name == "none":
            assert torch.equal(out.cpu().double(), ref)
        else:
            _check_float(out, ref, "f16", ref.abs())
    print(f"{plan.spec.name}: pointers patched in place = {calls[-1][-1]}")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["none", "dequant"])
def test_cuda_graph_replays_int8_gemm(arch, name, gen):
    M, N, K = 96, 256, 512
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _inputs(name, M, N, gen)
    int8_gemm(A, B, name, arch=arch, **inputs)  # warm-up: load the kernel, prepare the shape
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        D = int8_gemm(A, B, name, arch=arch, **inputs)
    for _ in range(2):
        A.copy_(_int8(M, K, generator=gen))
        B.copy_(_int8(N, K, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        ref = epilogues.get(name).reference(_exact(A, B).cpu(), None, **inputs)
        if name == "none":
            assert torch.equal(D.cpu().double(), ref)
        else:
            _check_float(D, ref, "f16", ref.abs())


def test_errors_name_the_problem(gen):
    A = _int8(4, 40, generator=gen)
    # K = 40 is the kernel's refusal only: int8_gemm runs it on padded operands (test_int8_any_shape_gpu.py)
    plan = gemm.get_plan(torch.cuda.current_device(), None, "none", None, 4)
    with pytest.raises(ValueError, match="K=40"):
        plan.launch_arguments(A, _int8(64, 40, generator=gen))
    with pytest.raises(ValueError, match="scale_row"):
        int8_gemm(_int8(4, 32, generator=gen), _int8(64, 32, generator=gen), "dequant",
                  scale_col=torch.ones(64, device="cuda"))
    with pytest.raises(ValueError, match=r"scale_col must be \[N=64\]"):
        int8_gemm(_int8(4, 32, generator=gen), _int8(64, 32, generator=gen), "dequant",
                  scale_row=torch.ones(4, device="cuda"), scale_col=torch.ones(65, device="cuda"))
    with pytest.raises(ValueError, match="16-byte"):
        base = _int8(4, 48, generator=gen)
        int8_gemm(base.view(-1)[8:8 + 4 * 32].view(4, 32), _int8(64, 32, generator=gen))


def test_public_api_out_argument_and_input_errors(gen):
    """cutlass_ops.int8_gemm: D written into ``out`` (whose dtype picks the kernel), and each bad
    epilogue input named (the per-call path checks them in the plan, not in the API)."""
    import cutlass_ops

    A, B = _int8(17, 64, generator=gen), _int8(48, 64, generator=gen)
    inputs = _inputs("dequant", 17, 48, gen)
    s_row, s_col, bias = inputs["scale_row"], inputs["scale_col"], inputs["bias"]
    spec, accum = epilogues.get("dequant"), _exact(A, B).cpu()
    terms = spec.reference(accum.abs(), "f32", **{k: v.abs() for k, v in inputs.items()})
    for dtype, element in ((torch.float16, "f16"), (torch.float32, "f32")):
        out = torch.full((17, 48), float("nan"), dtype=dtype, device="cuda")
        D = cutlass_ops.int8_gemm(A, B, "dequant", out=out, **inputs)
        assert D is out
        _check_float(out, spec.reference(accum, element, **inputs), element, terms)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        cutlass_ops.int8_gemm(A, B, "dequant", out=torch.empty(17, 47, dtype=torch.float16, device="cuda"),
                              scale_row=s_row, scale_col=s_col)
    with pytest.raises(ValueError, match="scale_col must be contiguous on cuda"):
        cutlass_ops.int8_gemm(A, B, "dequant", scale_row=s_row, scale_col=s_col.cpu())
    with pytest.raises(TypeError, match="scale_row must be a float32"):
        cutlass_ops.int8_gemm(A, B, "dequant", scale_row=s_row.half(), scale_col=s_col)
    with pytest.raises(TypeError, match="unexpected"):
        cutlass_ops.int8_gemm(A, B, "dequant", scale_row=s_row, scale_col=s_col, scales=s_col)
    D = cutlass_ops.int8_gemm(A, B, "dequant", scale_row=s_row, scale_col=s_col, bias=None)  # None: absent
    _check_float(D, spec.reference(accum, "f16", scale_row=s_row, scale_col=s_col), "f16", terms)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_host_finite_check_reads_every_dtype(dtype):
    """finite_check.all_finite on small CUDA tensors (the exponent bits of a host copy, checked by numpy):
    NaN, +-Inf anywhere flagged; the largest finite value, subnormals and signed zeros not; a strided tensor
    (the torch fallback) agrees."""
    from cutlass_ops.finite_check import all_finite

    info = torch.finfo(dtype)
    base = torch.tensor([1.0, -0.0, 0.0, info.max, -info.max, info.tiny / 4, info.tiny], dtype=dtype, device="cuda")
    assert all_finite(base) and all_finite(base[::2])
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in (0, 3, 6):
            t = base.clone()
            t[where] = bad
            assert not all_finite(t), (bad, where)
            assert not all_finite(t.view(1, -1).expand(2, -1).t()), (bad, where)  # non-contiguous: torch path
