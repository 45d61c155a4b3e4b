"""conv_small_ci.cu run on the CPU, against the float64 reference. No GPU needed.

The kernel file itself is compiled by g++ with tests/host_emu/cuda_host_shim.h (one std::thread per CUDA
thread of a block, blocks one after another, __syncthreads a std::barrier) under AddressSanitizer and
UBSan: any global or shared-memory access outside its buffer (shared memory is poisoned past the launch's
bytes, the operands are heap blocks of exactly their size), any misaligned vector access and any signed
overflow of the 32-bit index math aborts the run; each block's shared memory starts NaN-filled and the
output NaN-poisoned, so an unstaged read or an unwritten output shows. The grid is the one
cutlass_ops.conv.small_ci.launch_config gives (a few SMs' worth too, so that blocks walk several tiles).
A second build under ThreadSanitizer runs the cases whose blocks walk several tiles: a missing
__syncthreads between a tile's staging and the warps still reading the previous tile is a data race.
What this cannot check: the GPU's compiler, timing, occupancy and launch (tests/gpu/test_conv_small_ci_gpu.py).
Tolerance: tests/_conv_cases.py, |y - ref| <= (3 u + K 2^-23) S + u |ref|; the harness: tests/_host_emu.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from _conv_cases import Case, check_against_reference, kernel_geometry, make
from _host_emu import Launch, emulate
from cutlass_ops.conv.small_ci import SmallCiPlan, launch_config, small_ci_unsupported

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@dataclass(frozen=True)
class EmuCase:
    """A conv case and how the harness launches it."""
    conv: Case
    sms: int = 132      # launch_config's SM count: a small one makes each block walk several pixel tiles
    out_shift: int = 0  # out one element past an aligned address: the NHWC scalar-store path

    def __str__(self) -> str:
        return f"{self.conv}_sm{self.sms}{f'_shift{self.out_shift}' if self.out_shift else ''}"


def case(*conv, sms=132, out_shift=0, **kw) -> EmuCase:
    """case(batch, Ci, H, W, Co, k, stride, padding, dilation, groups, bits, block_size, dtype, channels_last,
    act, bias=True, sms=132, out_shift=0)."""
    return EmuCase(Case(*conv, **kw), sms, out_shift)


CASES = [
    # the ResNet stem (Ci 3, 7x7, stride 2, pad 3): full size at batch 1, and ragged images
    case(1, 3, 224, 224, 64, 7, 2, 3, 1, 1, 4, None, F16, True, 1),
    case(1, 3, 224, 224, 64, 7, 2, 3, 1, 1, 8, 21, BF16, False, 0, sms=8),
    case(2, 3, 17, 23, 64, 7, 2, 3, 1, 1, 4, 147, F32, True, 0),
    case(2, 3, 17, 23, 13, 7, 2, 3, 1, 1, 8, 3, F16, False, 2),
    case(1, 3, 40, 150, 70, 7, 2, 3, 1, 1, 8, None, F16, True, 1, sms=1),       # Ow 75: two column tiles
    case(3, 3, 5, 4, 96, 7, 2, 3, 1, 1, 4, 49, BF16, True, 2, sms=1),
    case(1, 3, 1, 1, 8, 7, 2, 3, 1, 1, 4, 7, F32, False, 1),                   # one pixel, all taps but one padded
    case(2, 3, 17, 140, 16, 7, 2, 3, 1, 1, 4, 21, F16, True, 0, out_shift=1),   # unaligned out: scalar stores
    case(2, 3, 17, 140, 16, 7, 2, 3, 1, 1, 4, 21, F16, True, 0),                # aligned: vector stores
    case(1, 3, 17, 140, 16, 7, 2, 3, 1, 1, 8, 21, F32, True, 2, out_shift=1),
    # Ci 1 / 4 / 8, kernels 1 / 3 / 5, strides 1 / 3, dilation 2
    case(1, 1, 19, 70, 8, 3, 1, 1, 1, 1, 4, 9, F32, False, 0),
    case(2, 1, 9, 11, 1, 1, 1, 0, 1, 1, 8, 1, F16, True, 0),
    case(2, 1, 1, 1, 1, 1, 1, 0, 1, 1, 4, 1, BF16, False, 2, bias=False),
    case(1, 4, 21, 67, 13, 5, 3, 2, 1, 1, 4, 4, F16, False, 1),
    case(1, 4, 21, 67, 13, 5, 3, 2, 1, 1, 8, 100, BF16, True, 1, bias=False),
    case(2, 4, 17, 23, 96, 3, 1, 1, 2, 1, 8, 36, F32, True, 2, sms=2),
    case(1, 4, 5, 4, 64, 3, 2, 0, 1, 1, 4, 12, F16, False, 0),
    case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, F32, True, 2, sms=1),
    case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, BF16, False, 2, sms=1, bias=False),
    case(1, 8, 33, 130, 8, 1, 1, 0, 1, 1, 4, 8, F16, True, 1),
    case(1, 8, 33, 130, 13, 1, 2, 0, 1, 1, 8, 4, BF16, False, 1),
    case(2, 3, 12, 13, 8, 5, 1, 0, 2, 1, 4, 75, BF16, True, 0, bias=False),
    # rectangular kernels, strides, padding and dilation
    case(1, 3, 19, 70, 13, (3, 5), (1, 2), (0, 2), (2, 1), 1, 4, 3, F32, True, 1),
    case(1, 3, 19, 70, 13, (5, 3), (3, 1), (2, 0), (1, 2), 1, 8, 45, F16, False, 2),
    case(1, 2, 30, 200, 12, (1, 7), (2, 3), (0, 3), (1, 2), 1, 8, 2, F16, True, 0, sms=3),
    # groups: each channel tile inside one group; ragged tiles per group
    case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F32, True, 1, sms=2),           # 96 per group: 64 + 32
    case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F16, False, 1, sms=2),
    case(2, 4, 17, 30, 24, 3, 2, 1, 1, 2, 8, 2, F16, True, 0),                  # 12 per group: scalar stores
    case(1, 6, 30, 70, 12, 3, 3, 2, 2, 3, 8, 6, BF16, False, 1, sms=3, bias=False),
    case(1, 6, 11, 9, 6, 3, 1, 1, 1, 6, 4, 1, F32, True, 2),                    # depthwise
]


def _check(e: EmuCase, exe, tmp_path) -> None:
    c = e.conv
    x, qw, bias = make(c)
    g = kernel_geometry(c, qw.block_size)
    assert small_ci_unsupported(g, c.dtype) is None
    config = launch_config(g, e.sms)
    ((_, name, _),) = SmallCiPlan.kernels(c.dtype, c.bits, c.channels_last)
    launch = Launch(name, config.grid[:2], config.block[:2], config.smem, out_shift=e.out_shift)
    y = emulate(exe, tmp_path, launch, g, x, qw, bias, c.channels_last)
    check_against_reference(y, c, x, qw, bias, str(e))


@pytest.mark.parametrize("c", CASES, ids=str)
def test_kernel_source_matches_float64_reference(c, conv_emulator, tmp_path):
    _check(c, conv_emulator("address"), tmp_path)


# Blocks that walk several pixel tiles (sms = 1 or 2: a tile's staging overwrites the patch the previous
# tile's warps read), both layouts, both NHWC store paths, channel tiles with an idle warp.
RACE_CASES = [
    case(1, 3, 40, 150, 70, 7, 2, 3, 1, 1, 8, None, F16, True, 1, sms=1),
    case(2, 3, 17, 140, 16, 7, 2, 3, 1, 1, 4, 21, F16, True, 0, sms=1, out_shift=1),
    case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F16, False, 1, sms=2),
    case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, BF16, False, 2, sms=1, bias=False),
]


@pytest.mark.parametrize("c", RACE_CASES, ids=str)
def test_kernel_source_has_no_shared_memory_race(c, conv_emulator, tmp_path):
    _check(c, conv_emulator("thread"), tmp_path)
