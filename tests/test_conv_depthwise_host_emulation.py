"""conv_depthwise.cu's own source run on the CPU (tests/host_emu: one std::thread per CUDA thread, g++ with
AddressSanitizer), launched with the shapes DepthwisePlan computes, against the float64 reference.

Every entry point of every (dtype, bits) module runs at least once, on ragged shapes; the grid is capped so
that blocks loop (grid-stride), shared memory is NaN-filled before each block and poisoned past the launch's
bytes, out is NaN-filled, and x / out sit in heap blocks of exactly their size: a missed output, an
unstaged weight or an out-of-buffer access fails. No GPU needed; the GPU run is
tests/gpu/test_conv_depthwise_gpu.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from custom_kernels.cuda_paths import cuda_include_dirs
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops.conv.depthwise import (
    depthwise_unsupported, kernel_name, nchw_tile, nhwc_tile, strip_blocks, vector_width,
)
from cutlass_ops.conv.geometry import ConvGeometry, conv2d_output_shape
from cutlass_ops.formats import quantize_conv_weight
from cutlass_ops.reference import conv2d_reference

HOST_EMU = Path(__file__).resolve().parent / "host_emu"
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
NUMPY = {torch.float16: np.float16, torch.bfloat16: np.int16, torch.float32: np.float32}
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    """The host build of tests/host_emu/run_conv_depthwise.cpp (skips without g++ or the CUDA headers)."""
    gxx = shutil.which("g++")
    if gxx is None or not (HOST_EMU / "cuda_host_shim.h").exists():
        pytest.skip("needs g++ and tests/host_emu/cuda_host_shim.h")
    includes = [d for d in cuda_include_dirs() if (Path(d) / "cuda_fp16.h").exists()]
    if not includes:
        pytest.skip("needs the CUDA headers (cuda_fp16.h)")
    exe = tmp_path_factory.mktemp("depthwise_emu") / "run_conv_depthwise"
    cmd = [gxx, "-std=c++20", "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-pthread",
           f"-I{HOST_EMU}", f"-I{KERNEL_DIR}", *[f"-I{d}" for d in includes], "-o", str(exe),
           str(HOST_EMU / "run_conv_depthwise.cpp")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return exe


def _bytes(t: torch.Tensor) -> bytes:
    t = t.contiguous().reshape(-1)
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def _emulate(emulator: Path, tmp_path: Path, batch, Ci, m, H, W, kernel, stride, padding, dilation, bits,
             block_size, dtype, channels_last, act, with_bias, grid_cap=2, misalign=False, expect=None, seed=0):
    Kh, Kw = kernel
    Co = m * Ci
    g = torch.Generator().manual_seed(seed)
    qw = quantize_conv_weight(torch.randn(Co, 1, Kh, Kw, generator=g) * 0.2, bits=bits, block_size=block_size,
                              symmetric=False)
    x = torch.randn(batch, Ci, H, W, generator=g).to(dtype)
    bias = (torch.randn(Co, generator=g) * 0.5).to(dtype) if with_bias else None
    Oh, Ow = conv2d_output_shape(H, W, Kh, Kw, stride, padding, dilation)
    geometry = ConvGeometry(batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, *stride, *padding, *dilation, qw.block_size, act,
                            Ci)
    assert depthwise_unsupported(geometry, dtype) is None

    # the plan's launch, with grid.x (NHWC) or grid.y (NCHW) capped at grid_cap: blocks loop
    if channels_last:
        vector = 1 if misalign else vector_width(geometry)  # the plan's fallback for a misaligned x / out
        name = kernel_name(geometry, dtype, bits, True, vector)
        tile = nhwc_tile(geometry, vector)
        grid, block, smem = (min(strip_blocks(geometry, tile), grid_cap), tile.slices), (tile.ct, tile.st), tile.smem
        x_stored, out_shape = x.permute(0, 2, 3, 1), (batch, Oh, Ow, Co)
    else:
        name = kernel_name(geometry, dtype, bits, False)
        tile = nchw_tile(geometry)
        grid, block, smem = (tile.grid[0], min(tile.grid[1], grid_cap)), (tile.tx, tile.ty), tile.smem
        x_stored, out_shape = x, (batch, Co, Oh, Ow)
    if expect is not None:
        assert name.endswith(expect), name

    run = 0
    while (tmp_path / f"run{run}").exists():  # a fresh folder per call: no bias.bin left by an earlier one
        run += 1
    tmp_path = tmp_path / f"run{run}"
    tmp_path.mkdir()

    (tmp_path / "x.bin").write_bytes(_bytes(x_stored))
    (tmp_path / "qweight.bin").write_bytes(qw.qweight.contiguous().numpy().tobytes())
    (tmp_path / "scale.bin").write_bytes(qw.scale.contiguous().numpy().tobytes())
    (tmp_path / "offset.bin").write_bytes(qw.offset.contiguous().numpy().tobytes())
    if bias is not None:
        (tmp_path / "bias.bin").write_bytes(_bytes(bias))
    (tmp_path / "out.bin").write_bytes(_bytes(torch.full(out_shape, float("nan"), dtype=dtype)))
    shift = 1 if misalign else 0  # elements: x and out start off every vector alignment
    launch = [name, *grid, *block, smem, shift, shift, *geometry.kernel_fields().values()]
    (tmp_path / "launch.txt").write_text(" ".join(map(str, launch)))
    result = subprocess.run([str(emulator), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"

    y = torch.from_numpy(np.frombuffer((tmp_path / "out.bin").read_bytes(), dtype=NUMPY[dtype]).copy())
    y = (y.view(torch.bfloat16) if dtype == torch.bfloat16 else y).reshape(out_shape)
    y = (y.permute(0, 3, 1, 2) if channels_last else y).double()
    assert bool(torch.isfinite(y).all()), f"{name}: NaN outputs (unwritten, or an unstaged weight read)"

    ref = conv2d_reference(x, qw, bias, stride, padding, dilation, act, groups=Ci)
    mag = (qw.int_values().double().reshape(Co, qw.num_groups, qw.block_size).abs()
           * qw.scale.double().abs()[..., None] + qw.offset.double().abs()[..., None]).reshape(Co, 1, Kh, Kw)
    S = F.conv2d(x.double().abs(), mag, None if bias is None else bias.double().abs(), stride, padding, dilation, Ci)
    u = UNIT_ROUNDOFF[dtype]
    tol = (3 * u + Kh * Kw * 2.0 ** -23) * S + u * ref.abs()
    err = (y - ref).abs()
    assert bool((err <= tol).all()), f"{name}: max err {err.max():.3e}, max excess {(err - tol).max():.3e}"


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
