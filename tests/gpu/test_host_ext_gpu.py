"""The C++ per-call path of int8_gemm: after a shape's first (Python) call it takes the later
calls, with the same results, the same errors, and inside CUDA graphs."""
from __future__ import annotations

import pytest
import torch

import cutlass_ops
import epilogues
from custom_kernels import host_ext
from cutlass_ops import cutlass as gemm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


def _archs() -> list[int]:
    if not torch.cuda.is_available():
        return [90, 80, 75]
    cc = 10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]
    return [a for a in (90, 80, 75) if a <= cc and (a != 90 or cc == 90)]


def _operands(M: int, N: int, K: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random int8 A [M, K] and B [N, K] on the GPU."""
    return (torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g).cuda(),
            torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g).cuda())


def _inputs(epilogue: str, M: int, N: int, g: torch.Generator) -> dict:
    if epilogue == "none":
        return {}
    if epilogue == "requant":
        return dict(multiplier=(torch.rand(N, generator=g) * 1e-4).cuda(),
                    fused_bias=(torch.randn(N, generator=g) * 100).cuda())
    return dict(scale_row=(torch.rand(M, generator=g) * 1e-2).cuda(), scale_col=(torch.rand(N, generator=g) * 1e-2).cuda(),
                bias=torch.randn(N, generator=g).cuda())


def _registered_dequant(M: int, N: int, K: int, seed: int):
    """(generator, A, B, dequant inputs) after one int8_gemm call, which registers the shape."""
    g = torch.Generator().manual_seed(seed)
    A, B = _operands(M, N, K, g)
    inputs = _inputs("dequant", M, N, g)
    cutlass_ops.int8_gemm(A, B, "dequant", **inputs)
    return g, A, B, inputs


@pytest.fixture(autouse=True)
def _needs_extension():
    if host_ext.load() is None:
        pytest.fail("the C++ launch path did not load on a GPU machine (see the log for why)")


@pytest.mark.parametrize("arch", _archs())
@pytest.mark.parametrize("epilogue", ["none", "dequant", "requant"])
@pytest.mark.parametrize("M", (3, 200, 600))
def test_second_call_takes_the_cpp_path_with_the_same_result(arch, epilogue, M):
    g = torch.Generator().manual_seed(M + arch)
    N, K = 272, 512
    A, B = _operands(M, N, K, g)
    inputs = _inputs(epilogue, M, N, g)
    first = cutlass_ops.int8_gemm(A, B, epilogue, arch=arch, **inputs)  # Python path; registers the shape
    plan = gemm.plan_for(M, 0, epilogue, arch, None)
    assert plan._fast, "plans without scalar inputs get the C++ path"
    shapes = plan._fast.shapes
    assert shapes >= 1
    A2 = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g).cuda()
    second = cutlass_ops.int8_gemm(A2, B, epilogue, arch=arch, **inputs)  # C++ path: new A, same shape
    out = torch.full_like(second, 7)
    third = cutlass_ops.int8_gemm(A, B, epilogue, arch=arch, out=out, **inputs)
    assert third is out and plan._fast.shapes == shapes  # nothing new prepared for these calls
    exact1 = (A.double() @ B.double().T).round().long().cpu()
    exact2 = (A2.double() @ B.double().T).round().long().cpu()
    if epilogue == "none":
        assert torch.equal(second.cpu().double(), exact2)
    else:
        ref2 = epilogues.get(epilogue).reference(exact2, None, **inputs)
        ref1 = epilogues.get(epilogue).reference(exact1, None, **inputs)
        # requant: int8 steps (fp32 vs fp64 rounding at a half); float outputs: a few f16 ulps of the largest
        tol = (lambda ref: 1.0) if epilogue == "requant" else (lambda ref: 2e-3 * max(1.0, ref.abs().max()))
        assert (second.cpu().double() - ref2).abs().max() <= tol(ref2)
        assert (third.cpu().double() - ref1).abs().max() <= tol(ref1)
    assert torch.equal(third, first)


def test_errors_are_the_python_paths_after_registration():
    M, N = 32, 256
    _, A, B, inputs = _registered_dequant(M, N, 256, seed=3)
    cutlass_ops.int8_gemm(A, B, "dequant", **inputs)
    with pytest.raises(ValueError, match="scale_col"):
        cutlass_ops.int8_gemm(A, B, "dequant", **{**inputs, "scale_col": torch.ones(N + 8, device="cuda")})
    with pytest.raises(TypeError, match="unexpected"):
        cutlass_ops.int8_gemm(A, B, "dequant", **inputs, shift=torch.ones(N, device="cuda"))
    with pytest.raises(ValueError, match="out must"):
        cutlass_ops.int8_gemm(A, B, "dequant", out=torch.empty(M, N, dtype=torch.float32, device="cuda"),
                              out_dtype=torch.float16, **inputs)
    with pytest.raises(ValueError, match="16-byte"):
        cutlass_ops.int8_gemm(A, B, "dequant", **{**inputs, "bias": torch.ones(N + 1, device="cuda")[1:]})


def test_cpp_path_in_a_cuda_graph():
    M, N, K = 64, 512, 512
    g, A, B, inputs = _registered_dequant(M, N, K, seed=4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        D = cutlass_ops.int8_gemm(A, B, "dequant", **inputs)
    for _ in range(2):
        A.copy_(torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        ref = epilogues.get("dequant").reference((A.double() @ B.double().T).round().long().cpu(), None, **inputs)
        assert (D.cpu().double() - ref).abs().max() <= 2e-3 * max(1.0, ref.abs().max())


def test_the_cpp_path_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("CUTLASS_OPS_HOST_EXT", "0")
    assert host_ext.load() is None


@pytest.mark.parametrize("arch", _archs())
def test_cpp_path_hands_back_what_python_must_refuse(arch):
    """The checks the C++ path leaves to Python (out aliasing an operand, an input asking for a gradient,
    a per-column input changed in place to NaN) still raise once that path has taken the shape."""
    M, N, K = 32, 256, 256
    g = torch.Generator().manual_seed(arch)
    buf = torch.empty(M * N * 2 + M * K, dtype=torch.int8, device="cuda")
    out = buf[: M * N * 2].view(torch.float16).view(M, N)
    A = buf[M * N * 2:].view(M, K)
    A.copy_(torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g))
    B = torch.randint(-128, 128, (N, K), dtype=torch.int8, generator=g).cuda()
    inputs = _inputs("dequant", M, N, g)
    for _ in range(3):  # registers the shape and the pointers, then the C++ path takes the call
        cutlass_ops.int8_gemm(A, B, "dequant", arch=arch, out=out, **inputs)
    plan = gemm.plan_for(M, 0, "dequant", arch, torch.float16)
    assert plan.run_fast(A, B, out, inputs, 0) is out, "the plain case runs in C++"
    overlapping = buf[M * N:M * N + M * N * 2].view(torch.float16).view(M, N)  # out's second half + A's start
    with pytest.raises(ValueError, match="out overlaps A"):
        cutlass_ops.int8_gemm(A, B, "dequant", arch=arch, out=overlapping, **inputs)
    with pytest.raises(RuntimeError, match="scale_col requires grad"):
        cutlass_ops.int8_gemm(A, B, "dequant", arch=arch, out=out,
                              **{**inputs, "scale_col": inputs["scale_col"].clone().requires_grad_()})
    inputs["scale_col"][5] = float("nan")  # in place: a new version, unchecked, so C++ hands it back
    with pytest.raises(ValueError, match="scale_col holds NaN"):
        cutlass_ops.int8_gemm(A, B, "dequant", arch=arch, out=out, **inputs)
    inputs["scale_col"][5] = 1e-3
    again = cutlass_ops.int8_gemm(A, B, "dequant", arch=arch, **inputs)
    ref = epilogues.get("dequant").reference((A.double() @ B.double().T).round().long().cpu(), None, **inputs)
    assert (again.cpu().double() - ref).abs().max() <= 2e-3 * max(1.0, ref.abs().max())
    assert host_ext.load().finite_count() >= 1
