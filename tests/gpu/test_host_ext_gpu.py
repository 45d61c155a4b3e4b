"""The C++ per-call path of int8_gemm: after a shape's first (Python) call it takes the later
calls, with the same results, the same errors, and inside CUDA graphs. And QuantLinear "w8a8_channel"'s
one-call C++ forward (quantize per token + the dequant GEMM) against its Python path, bit for bit."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import cutlass_ops
import epilogues
from custom_kernels import host_ext
from cutlass_ops import cutlass as gemm
from cutlass_ops._validate import parse_activation
from cutlass_ops.nn import QuantLinear
from cutlass_ops.quantize_model import W8A8ChannelConfig
from cutlass_ops.torch_ops import linear_w8a8_channel_impl, quantize_per_token_reference
from cutlass_ops.w8a8 import channel_fast

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


# --------------------------------------------------------------------------------------------
# QuantLinear "w8a8_channel": quantize per token + the dequant GEMM in one C++ call
# --------------------------------------------------------------------------------------------

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _channel_layer(N: int, K: int, dtype: torch.dtype, bias: bool, act=None) -> QuantLinear:
    torch.manual_seed(N + K)
    q = QuantLinear.from_float(nn.Linear(K, N, bias=bias), W8A8ChannelConfig()).cuda().to(dtype)
    q.act = parse_activation(act)  # the configs quantize weights; the activation is the module's
    return q


def _python_path(q: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    return linear_w8a8_channel_impl(x, q.qweight, q.scale, q.bias, q.act)


def _cpp_path(q: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """The C++ path forced: after the Python path registered the layer (a few calls: the GEMM registers a
    shape once its Params are verified; Sm90 also each new pointer set of A_q, s and D), it must take x."""
    for _ in range(4):
        out = channel_fast.run(x, q.qweight, q.scale, q.bias, q.act)
        if out is not None:
            return out
        _python_path(q, x)
    pytest.fail("the C++ path of QuantLinear w8a8_channel never took a plain call")


def _reference(q: QuantLinear, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 act(A_q @ W_q^T * s * scale + bias) from the CPU quantizer's A_q and s, its tolerance: the
    epilogue's float32 roundings of each term and the output's rounding)."""
    N, K = q.qweight.shape
    A_q, s = quantize_per_token_reference(x.cpu().reshape(-1, K))
    terms = (A_q.long() @ q.qweight.cpu().long().T).double() * s.double() * q.scale.cpu().double().reshape(1, N)
    bias = q.bias.detach().cpu().double() if q.bias is not None else torch.zeros(N, dtype=torch.float64)
    ref = terms + bias
    if q.act == 1:
        ref = ref.clamp_min(0)
    u = UNIT_ROUNDOFF[x.dtype]
    tol = 8 * 2.0 ** -24 * (terms.abs() + bias.abs()) + u * ref.abs() + u * torch.finfo(x.dtype).tiny
    return ref.reshape(*x.shape[:-1], N), tol.reshape(*x.shape[:-1], N)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("N, K", [(256, 96), (1000, 4096)])
def test_channel_cpp_path_is_the_python_path_bit_for_bit(N, K, bias, M, dtype):
    q = _channel_layer(N, K, dtype, bias)
    x = (torch.randn(M, K) * 2).to(dtype).cuda()
    with torch.no_grad():
        python = _python_path(q, x)
        cpp = _cpp_path(q, x)
        module = q(x)  # the eager forward: the C++ path now
    assert cpp.dtype == dtype and cpp.shape == (M, N)
    assert torch.equal(cpp, python) and torch.equal(module, python)
    ref, tol = _reference(q, x)
    err = (cpp.cpu().double() - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max():.3e}, max err/tol {(err / tol).max():.3f}"


def test_channel_cpp_path_keeps_leading_dims_and_activation():
    q = _channel_layer(256, 96, torch.float16, True, act="relu")
    x = torch.randn(2, 5, 96, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        python = _python_path(q, x)
        cpp = _cpp_path(q, x)
    assert cpp.shape == (2, 5, 256) and torch.equal(cpp, python)
    ref, tol = _reference(q, x)
    assert bool(((cpp.cpu().double() - ref).abs() <= tol).all())


def test_eager_forward_takes_the_cpp_path(monkeypatch):
    """Once registered, QuantLinear.forward never reaches the Python path for a plain call."""
    q = _channel_layer(256, 96, torch.float16, True)
    x = torch.randn(3, 96, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        want = _python_path(q, x)
        # registered with `want` alive: on Sm90 the GEMM's Params are kept per pointer set of A_q, s and D, so
        # the module's call below must see the allocator hand out what this one got (its result is dropped)
        _cpp_path(q, x)

        def python_path(*args):
            raise AssertionError("the eager forward took the Python path")
        monkeypatch.setattr("cutlass_ops.nn.modules.linear_w8a8_channel_impl", python_path)
        assert torch.equal(q(x), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_channel_unaligned_N(dtype):
    """N = 257 (K = 96): on the family's any-N kernel where it has one, or (Hopper, M = 3 <= 64) on its aligned
    kernel over N padded, then in C++ too, bit for bit; else (no any-N kernel: Sm75) on N-padded operands,
    which only the Python path prepares."""
    N, K, M = 257, 96, 3
    q = _channel_layer(N, K, dtype, True)
    x = torch.randn(M, K, dtype=dtype, device="cuda")
    with torch.no_grad():
        python = _python_path(q, x)
        plan = gemm.plan_for(M, 0, "dequant", None, dtype)
        if getattr(plan, "any_n", None) is not None:
            assert torch.equal(_cpp_path(q, x), python)
        else:
            for _ in range(3):
                assert channel_fast.run(x, q.qweight, q.scale, q.bias, q.act) is None
        assert torch.equal(q(x), python)
    ref, tol = _reference(q, x)
    assert bool(((python.cpu().double() - ref).abs() <= tol).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_channel_padded_shape_stays_on_the_python_path(dtype):
    """K % 16 != 0 (and N % 8 != 0): the GEMM runs on zero-padded operands, which only Python prepares."""
    N, K, M = 257, 100, 3
    q = _channel_layer(N, K, dtype, True)
    x = torch.randn(M, K, dtype=dtype, device="cuda")
    with torch.no_grad():
        python = _python_path(q, x)
        for _ in range(3):
            assert channel_fast.run(x, q.qweight, q.scale, q.bias, q.act) is None
        assert torch.equal(q(x), python)
    ref, tol = _reference(q, x)
    assert bool(((python.cpu().double() - ref).abs() <= tol).all())


def test_channel_input_wanting_a_gradient_gets_a_grad_fn():
    q = _channel_layer(256, 96, torch.float16, True)
    x = torch.randn(3, 96, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        _cpp_path(q, x)  # registered: a plain call would take the C++ path
    xg = x.clone().requires_grad_()
    assert channel_fast.run(xg, q.qweight, q.scale, q.bias, q.act) is None
    y = q(xg)
    assert y.grad_fn is not None
    y.float().sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape
    q.bias.requires_grad_(True)
    try:
        assert channel_fast.run(x, q.qweight, q.scale, q.bias, q.act) is None
        assert q(x).grad_fn is not None
    finally:
        q.bias.requires_grad_(False)
    with torch.no_grad():  # no gradient wanted: the C++ path again (after registering the pointer set of A_q,
        _cpp_path(q, xg)     # s and D that this allocator state gives, on Sm90)


def test_channel_cpp_path_hands_back_bad_inputs():
    """A non-contiguous x, a bias or scale on the wrong device or misaligned: None, and the module's
    forward then gives the Python path's answer or error."""
    q = _channel_layer(256, 96, torch.float16, True)
    x = torch.randn(3, 96, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        _cpp_path(q, x)
        wide = torch.randn(3, 192, dtype=torch.float16, device="cuda")[:, ::2]
        assert channel_fast.run(wide, q.qweight, q.scale, q.bias, q.act) is None
        assert torch.equal(q(wide), _python_path(q, wide.contiguous()))
        shifted = torch.empty(257, device="cuda")[1:]
        shifted.copy_(q.bias.float())
        assert channel_fast.run(x, q.qweight, q.scale, shifted, q.act) is None  # misaligned float32 bias
        assert channel_fast.run(x, q.qweight, q.scale.cpu(), q.bias, q.act) is None
        with pytest.raises(ValueError, match="x is on cpu"):
            q(x.cpu())


def test_channel_cpp_path_in_a_cuda_graph():
    q = _channel_layer(256, 96, torch.float16, True)
    x = torch.randn(3, 96, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        _cpp_path(q, x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = q(x)
        x.copy_(torch.randn(3, 96, dtype=torch.float16, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, _python_path(q, x))
