"""conv_depthwise.cu's own source run on the CPU (tests/_host_emu.py: one std::thread per CUDA thread, g++ with
AddressSanitizer and UBSan), launched with the shapes DepthwisePlan computes, against the float64 reference.

Every entry point of every (dtype, bits) module runs at least once, on ragged shapes; the grid is capped so
that blocks loop (grid-stride), shared memory is NaN-filled before each block and poisoned past the launch's
bytes, out is NaN-filled, and x / out sit in heap blocks of exactly their size: a missed output, an
unstaged weight or an out-of-buffer access fails. No GPU needed; the GPU run is
tests/gpu/test_conv_depthwise_gpu.py."""
from __future__ import annotations

import pytest
import torch

from _conv_cases import Case, check_against_reference, kernel_geometry, make
from _host_emu import Launch, emulate
from cutlass_ops.conv.depthwise import (
    depthwise_unsupported, kernel_name, nchw_tile, nhwc_tile, strip_blocks, vector_width,
)

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture
def emulator(conv_emulator):
    """The harness under AddressSanitizer and UBSan (tests/_host_emu.py)."""
    return conv_emulator("address")


def _emulate(exe, tmp_path, batch, Ci, m, H, W, kernel, stride, padding, dilation, bits, block_size, dtype,
             channels_last, act, with_bias, grid_cap=2, misalign=False, expect=None, seed=0):
    case = Case(batch, Ci, H, W, m * Ci, kernel, stride, padding, dilation, Ci, bits, block_size, dtype, channels_last,
                act, with_bias)
    x, qw, bias = make(case, seed)
    geometry = kernel_geometry(case, qw.block_size)
    assert depthwise_unsupported(geometry, dtype) is None

    # the plan's launch, with grid.x (NHWC) or grid.y (NCHW) capped at grid_cap: blocks loop
    if channels_last:
        vector = 1 if misalign else vector_width(geometry)  # the plan's fallback for a misaligned x / out
        name = kernel_name(geometry, dtype, bits, True, vector)
        tile = nhwc_tile(geometry, vector)
        grid, block = (min(strip_blocks(geometry, tile), grid_cap), tile.slices), (tile.ct, tile.st)
    else:
        name = kernel_name(geometry, dtype, bits, False)
        tile = nchw_tile(geometry)
        grid, block = (tile.grid[0], min(tile.grid[1], grid_cap)), (tile.tx, tile.ty)
    if expect is not None:
        assert name.endswith(expect), name
    shift = 1 if misalign else 0  # elements: x and out start off every vector alignment
    y = emulate(exe, tmp_path, Launch(name, grid, block, tile.smem, shift, shift), geometry, x, qw, bias,
                channels_last)
    check_against_reference(y, case, x, qw, bias, name)


MODULES = [(F32, 4), (F32, 8), (F16, 4), (F16, 8), (BF16, 4), (BF16, 8)]
# (expected kernel suffix, batch, Ci, m, H, W, (Kh, Kw), stride, padding, dilation, block size: "1" / "div" / "K")
VARIANTS = [
    ("nchw", 2, 5, 1, 9, 11, (3, 3), (1, 1), (1, 1), (1, 1), "div"),
    ("nchw", 3, 3, 2, 10, 7, (5, 3), (2, 1), (2, 0), (1, 2), "K"),
    ("nhwc_v1", 2, 3, 1, 7, 9, (3, 5), (1, 2), (1, 2), (2, 1), "1"),
    ("nhwc_v1", 1, 4, 2, 6, 10, (3, 3), (1, 1), (1, 1), (1, 1), "div"),  # multiplier 2: one channel a thread
    ("nhwc_v2", 2, 6, 1, 8, 9, (5, 5), (2, 2), (2, 2), (1, 1), "K"),
    ("nhwc_v4", 2, 8, 1, 9, 10, (3, 3), (1, 1), (2, 2), (2, 2), "div"),  # dilation 2
    ("nhwc_v4", 1, 12, 1, 11, 9, (1, 1), (1, 1), (0, 0), (1, 1), "1"),
    ("nhwc_v4_k3", 3, 8, 1, 7, 11, (3, 3), (1, 1), (1, 1), (1, 1), "div"),
    ("nhwc_v4_k3", 2, 36, 1, 11, 5, (5, 3), (2, 1), (0, 1), (2, 1), "K"),  # Kh free: stride / dilation 2 along H
    ("nhwc_v4_k5", 2, 8, 1, 5, 13, (5, 5), (1, 1), (2, 2), (1, 1), "div"),
    ("nhwc_v4_k7", 1, 4, 1, 3, 2, (7, 7), (1, 1), (3, 3), (1, 1), "1"),  # kernel wider than the image
    ("nhwc_v4_k7", 2, 8, 1, 9, 10, (1, 7), (1, 1), (0, 3), (1, 1), "K"),
]


def _block(choice: str, kernel) -> int:
    K = kernel[0] * kernel[1]
    return {"1": 1, "K": K, "div": next(d for d in (3, 5, 7, 2, 1) if K % d == 0 and (d < K or K == 1))}[choice]


@pytest.mark.parametrize("dtype, bits", MODULES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=lambda i: f"{i}-{VARIANTS[i][0]}")
def test_every_entry_point_matches_the_reference(emulator, tmp_path, dtype, bits, variant):
    expect, batch, Ci, m, H, W, kernel, stride, padding, dilation, block = VARIANTS[variant]
    i = MODULES.index((dtype, bits)) + variant
    _emulate(emulator, tmp_path, batch, Ci, m, H, W, kernel, stride, padding, dilation, bits, _block(block, kernel),
             dtype, expect != "nchw", act=i % 3, with_bias=i % 4 != 1, grid_cap=1 + i % 3, expect=expect, seed=i)


@pytest.mark.parametrize("dtype, kernel, stride", [(F16, (3, 3), (1, 1)), (F32, (5, 5), (1, 1)),
                                                   (BF16, (3, 3), (2, 2))])
def test_misaligned_x_and_out_run_the_one_channel_kernel(emulator, tmp_path, dtype, kernel, stride):
    _emulate(emulator, tmp_path, 2, 8, 1, 7, 9, kernel, stride, (1, 1), (1, 1), 4, kernel[0], dtype, True, 1, True,
             misalign=True, expect="nhwc_v1")


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
def test_slices_and_long_grid_stride_loops(emulator, tmp_path, channels_last):
    """Ci = 130: three NHWC channel slices of 22 two-channel vectors; a 40x45 plane: NCHW pixel chunks."""
    _emulate(emulator, tmp_path, 1, 130, 1, 5, 9, (3, 3), (1, 1), (1, 1), (1, 1), 8, 9, F16, channels_last, 2,
             True, grid_cap=1)
    _emulate(emulator, tmp_path, 2, 2, 1, 40, 45, (3, 3), (1, 1), (1, 1), (1, 1), 4, 3, BF16, channels_last, 0,
             False, grid_cap=1)
