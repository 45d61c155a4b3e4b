"""The fast int4/int8 -> fp16/bf16 converters (converters.cuh) against the plain conversion, exactly,
over input words that put every nibble / byte value at every position (all 2^16 values of each
16-bit half, combined with a set of fixed patterns in the other half)."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.formats import INT4_DEINTERLEAVE
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

pytestmark = pytest.mark.gpu

_OTHER_HALVES = [0x0000, 0xFFFF, 0x8888, 0x7777, 0x1234, 0xFEDC, 0xA5A5, 0x5A5A, 0x0F0F, 0xF0F0, 0x8000, 0x0001]


@pytest.fixture(scope="module")
def words() -> torch.Tensor:
    """int64 [n] values in [0, 2^32): all low halves x fixed high halves, and the reverse."""
    every = torch.arange(1 << 16, dtype=torch.int64)
    fixed = torch.tensor(_OTHER_HALVES, dtype=torch.int64)
    low_sweep = (fixed[:, None] << 16) | every[None, :]
    high_sweep = (every[None, :] << 16) | fixed[:, None]
    return torch.cat([low_sweep.flatten(), high_sweep.flatten()])


class ConverterArgs(KernelArgs):
    """converters_test.cu's entry points: (words, out, n)."""
    _fields_ = [("words", Ptr), ("out", Ptr), ("n", I32)]


def _run(name: str, words: torch.Tensor, pairs: int) -> torch.Tensor:
    """Raw output words of converter entry ``name``: int32 [n, pairs]."""
    signed = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32).cuda()
    out = torch.full((words.numel(), pairs), -1, dtype=torch.int32, device="cuda")
    config = LaunchConfig.of(min(-(-words.numel() // 256), 4096), 256)
    args = ConverterArgs(words=signed.data_ptr(), out=out.data_ptr(), n=words.numel())
    Launch(load_kernel("converters_test.cu", name), config, args, signed.device.index)()
    torch.cuda.synchronize()
    return out


def _int4_values(words: torch.Tensor, signed: bool) -> torch.Tensor:
    """[n, 8] element values in K order of interleaved words (u = q + 8 when signed)."""
    nibbles = torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=1)
    u = nibbles[:, list(INT4_DEINTERLEAVE)]
    return u - 8 if signed else u


def _int8_values(words: torch.Tensor, signed: bool) -> torch.Tensor:
    b = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=1)
    return torch.where(b >= 128, b - 256, b) if signed else b


@pytest.mark.parametrize("signed", [True, False], ids=["int4", "uint4"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_int4_converter_exact(words, signed, dtype):
    name = ("test_int4s" if signed else "test_uint4s") + ("_to_half2x4" if dtype == torch.float16 else "_to_bf162x4")
    got = _run(name, words, 4).view(dtype).reshape(-1, 8).cpu()
    expected = _int4_values(words, signed).to(dtype)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("signed", [True, False], ids=["int8", "uint8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_int8_converter_exact(words, signed, dtype):
    name = ("test_int8s" if signed else "test_uint8s") + ("_to_half2x2" if dtype == torch.float16 else "_to_bf162x2")
    got = _run(name, words, 2).view(dtype).reshape(-1, 4).cpu()
    expected = _int8_values(words, signed).to(dtype)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
