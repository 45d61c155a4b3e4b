"""CPU tests of the per-token quantization kernel (``quant_token.cu``): every variant builds for sm_75, sm_80
and sm_90a, the build keeps the IEEE arithmetic the bit-exactness rests on, the host side names what it loads,
and the kernel's arithmetic, replayed in torch ops, is ``quantize_per_token_reference``'s."""
from __future__ import annotations


import pytest
import torch

from custom_kernels import nvrtc
from custom_kernels.cuda_paths import cuda_include_dirs, nvcc_path
from cutlass_ops.torch_ops import quantize_per_token, quantize_per_token_reference
from cutlass_ops.w8a8 import quant_token
from cutlass_ops.w8a8.quant_token import SOURCE, quant_token_kernels, quantize_per_token_gpu, warps_per_row
from _nvcc import nvcc_cubin

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def _is_cubin(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("arch", [75, 80, "90a"])
def test_every_variant_compiles(arch, dtype):
    (source, name, defines), = quant_token_kernels(dtype)
    cubin = nvrtc.compile_file(source, arch, defines=defines)
    assert _is_cubin(cubin.data)
    assert name.encode() + b"\0" in cubin.data  # the extern "C" symbol


def test_kernels_named_per_dtype():
    for dtype in DTYPES:
        assert quant_token_kernels(dtype) == ((SOURCE, f"quant_token_{TAGS[dtype]}", {}),)
    with pytest.raises(KeyError):
        quant_token_kernels(torch.float64)


def _ptx(arch: str) -> str:
    """The PTX NVRTC makes of quant_token.cu with the runtime's options (for a compute_ target)."""
    from cuda.bindings import nvrtc as rtc

    path = nvrtc.kernel_path(SOURCE)
    err, prog = rtc.nvrtcCreateProgram(path.read_bytes(), SOURCE.encode(), 0, [], [])
    assert err == rtc.nvrtcResult.NVRTC_SUCCESS
    try:
        opts = [*nvrtc.BASE_OPTIONS, f"--gpu-architecture=compute_{arch}", f"-I{nvrtc.KERNEL_DIR}",
                *[f"-I{d}" for d in cuda_include_dirs()]]
        err, = rtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        assert err == rtc.nvrtcResult.NVRTC_SUCCESS
        err, size = rtc.nvrtcGetPTXSize(prog)
        buf = bytearray(size)
        rtc.nvrtcGetPTX(prog, buf)
    finally:
        rtc.nvrtcDestroyProgram(prog)
    return bytes(buf).rstrip(b"\0").decode()


@pytest.mark.parametrize("arch", ["75", "90a"])
def test_build_keeps_ieee_division_and_torch_rounding(arch):
    """What the bit-exactness rests on: IEEE division (div.rn, no approximate or flushed variant), rint
    (cvt.rni.f32.f32), torch's float -> int cast (cvt.rzi.s32.f32), an unsigned max, 16-byte loads."""
    ptx = _ptx(arch)
    assert "div.rn.f32" in ptx and "div.approx" not in ptx and "div.full" not in ptx
    assert ".ftz" not in ptx
    assert "cvt.rni.f32.f32" in ptx and "cvt.rzi.s32.f32" in ptx and "max.u32" in ptx
    assert "ld.global.v4.u32" in ptx


def test_plain_nvcc_builds_sm80(tmp_path):
    try:
        nvcc_path()
    except RuntimeError:
        pytest.skip("nvcc is not installed")
    assert _is_cubin(nvcc_cubin(SOURCE, tmp_path))


def test_warps_per_row():
    # at most 4 16-byte loads per thread of a row, up to 8 warps
    assert [warps_per_row(K, 2) for K in (1, 7, 1024, 1025, 2048, 4096, 8192, 14336)] == [1, 1, 1, 2, 2, 4, 8, 8]
    assert [warps_per_row(K, 4) for K in (1, 512, 513, 1024, 2048, 4096)] == [1, 1, 2, 2, 4, 8]
    for K in range(1, 20000, 97):
        w = warps_per_row(K, 2)
        assert w in (1, 2, 4, 8) and quant_token.WARPS % w == 0


# ----------------------------------------------------------------------------------------------
# the kernel's arithmetic, replayed in torch ops on the CPU
# ----------------------------------------------------------------------------------------------

def _kernel_arithmetic(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quant_token.cu step by step: amax as an unsigned max of the bits of |x|, s = amax / 127 (IEEE, 1 where
    0), q = rint(x / s) converted as cvt.rzi.s32.f32 does (NaN -> 0, saturating), then clamped as an int."""
    xf = x.to(torch.float32)
    bits = xf.view(torch.int32).to(torch.int64) & 0x7FFFFFFF  # non-negative: int64 order is unsigned order
    amax = bits.amax(dim=-1, keepdim=True).to(torch.int32).view(torch.float32)
    s = amax / 127.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    t = torch.round(xf / s).double()
    cvt = torch.nan_to_num(t, nan=0.0).clamp(-2.0 ** 31, 2.0 ** 31 - 1).to(torch.int64)
    return cvt.clamp(-127, 127).to(torch.int8), s


def _rows(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    K = 300
    x = torch.randn(16, K, generator=g, dtype=torch.float64) * 3
    x[:, ::17] *= 25
    k = torch.arange(K, dtype=torch.float64)
    ties = ((k % 127) + 0.5) * torch.where(k % 2 == 0, 1.0, -1.0)
    ties[0] = 127.0
    x[1], x[2], x[3] = ties, ties / 8, ties * 2.0 ** (8 if dtype == torch.float16 else 100)
    x[4] = 0.0
    x[5] = -0.0
    x[6] *= 2.0 ** (-20 if dtype == torch.float16 else -135)  # subnormal-range values
    x = x.to(dtype)
    x[7, 3] = float("nan")
    x[8, 0] = float("inf")
    x[9, K - 1] = float("-inf")
    x[10, 0], x[10, 1] = float("inf"), float("nan")
    if dtype == torch.float32:
        x[11] = 0.0
        x[11, 5] = 2.0 ** -149  # amax / 127 underflows: s = 1
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_arithmetic_is_the_reference(dtype):
    x = _rows(dtype)
    A_q, s = _kernel_arithmetic(x)
    A_ref, s_ref = quantize_per_token_reference(x)
    assert torch.equal(A_q, A_ref)
    nan = torch.isnan(s_ref)
    assert torch.equal(torch.isnan(s), nan) and torch.equal(s[~nan], s_ref[~nan])
    assert torch.isnan(s[7]).all() and torch.isnan(s[10]).all() and (s[8:10] == float("inf")).all()
    assert not A_q[7:11].any()
    assert (s[1] == 1).all() and (s[2] == 0.125).all()
    # ties round half to even: -1.5 -> -2, 2.5 -> 2, -3.5 -> -4, -0.5 -> 0, 1.5 -> 2
    assert A_q[1, :5].tolist() == [127, -2, 2, -4, 4] and A_q[1, 127:130].tolist() == [0, 2, -2]


def test_cpu_tensors_keep_the_torch_ops():
    x = _rows(torch.float16)
    got, want = quantize_per_token(x), quantize_per_token_reference(x)
    assert torch.equal(got[0], want[0]) and torch.equal(torch.isnan(got[1]), torch.isnan(want[1]))
    with pytest.raises(ValueError, match="CUDA"):
        quantize_per_token_gpu(x)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        quantize_per_token_gpu(x.double())
