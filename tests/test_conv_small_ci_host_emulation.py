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
Tolerance as in tests/gpu/test_conv_groups_gpu.py: |y - ref| <= (3 u + K 2^-23) S + u |ref|.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from custom_kernels.cuda_paths import cuda_include_dirs
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops.conv.geometry import DTYPE_CODES, GEOMETRY_FIELDS, ConvGeometry, conv2d_output_shape
from cutlass_ops.conv.small_ci import SmallCiPlan, launch_config, small_ci_unsupported
from cutlass_ops.formats import quantize_conv_weight
from cutlass_ops.reference import conv2d_reference

HARNESS = Path(__file__).parent / "host_emu" / "run_conv_small_ci.cpp"
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@dataclass(frozen=True)
class Case:
    batch: int
    Ci: int
    H: int
    W: int
    Co: int
    k: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    bits: int
    block_size: int | None
    dtype: torch.dtype
    channels_last: bool
    act: int
    bias: bool = True
    sms: int = 132      # launch_config's SM count: a small one makes each block walk several pixel tiles
    out_shift: int = 0  # out one element past an aligned address: the NHWC scalar-store path

    def __str__(self) -> str:
        pair = lambda p: f"{p[0]}x{p[1]}" if p[0] != p[1] else str(p[0])  # noqa: E731
        return (f"b{self.batch}_ci{self.Ci}_{self.H}x{self.W}_co{self.Co}_g{self.groups}_k{pair(self.k)}"
                f"_s{pair(self.stride)}_p{pair(self.padding)}_d{pair(self.dilation)}_w{self.bits}_bs{self.block_size}"
                f"_{DTYPE_CODES[self.dtype][1]}_{'nhwc' if self.channels_last else 'nchw'}_act{self.act}"
                f"{'' if self.bias else '_nobias'}_sm{self.sms}{f'_shift{self.out_shift}' if self.out_shift else ''}")


def case(batch, Ci, H, W, Co, k, stride, padding, dilation, groups, bits, block_size, dtype, channels_last, act,
         **kw) -> Case:
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    return Case(batch, Ci, H, W, Co, pair(k), pair(stride), pair(padding), pair(dilation), groups, bits, block_size,
                dtype, channels_last, act, **kw)


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


SANITIZERS = {  # g++ flags of each harness build
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread"],  # data races between the emulated threads: a missing __syncthreads
}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """sanitizer -> the harness built with g++ under it (once per module; skips without g++ or CUDA headers)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not installed")
    try:
        includes = cuda_include_dirs()
    except RuntimeError as exc:
        pytest.skip(f"no CUDA headers: {exc}")
    built: dict[str, Path] = {}

    def build(sanitizer: str) -> Path:
        if sanitizer not in built:
            exe = tmp_path_factory.mktemp(f"host_emu_{sanitizer}") / "run_conv_small_ci"
            cmd = [gxx, "-std=c++20", "-O1", "-g", *SANITIZERS[sanitizer], "-fno-strict-aliasing", "-pthread",
                   f"-I{HARNESS.parent}", f"-I{KERNEL_DIR}", *[f"-I{d}" for d in includes], str(HARNESS),
                   "-o", str(exe)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
            built[sanitizer] = exe
        return built[sanitizer]

    return build


def _operands(c: Case):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(c.Co, c.Ci // c.groups, *c.k, generator=g) * 0.2
    qw = quantize_conv_weight(w, bits=c.bits, block_size=c.block_size, symmetric=False)
    x = torch.randn(c.batch, c.Ci, c.H, c.W, generator=g).to(c.dtype)
    bias = (torch.randn(c.Co, generator=g) * 0.5).to(c.dtype) if c.bias else None
    return x, qw, bias


def _tolerance(x, qw, bias, c: Case, ref: torch.Tensor) -> torch.Tensor:
    Co, Kh, Kw, Cig = qw.conv_shape
    q = qw.int_values().to(torch.float64).reshape(Co, qw.num_groups, qw.block_size)
    mag = (q.abs() * qw.scale.double().abs()[..., None] + qw.offset.double().abs()[..., None])
    mag = mag.reshape(Co, Kh, Kw, Cig).permute(0, 3, 1, 2)
    S = F.conv2d(x.double().abs(), mag, None if bias is None else bias.double().abs(), c.stride, c.padding,
                 c.dilation, c.groups)
    u = UNIT_ROUNDOFF[c.dtype]
    return (3 * u + Kh * Kw * Cig * 2.0 ** -23) * S + u * ref.abs()


def _write(path: Path, t: torch.Tensor) -> None:
    path.write_bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def _check(c: Case, exe: Path, tmp_path: Path) -> None:
    x, qw, bias = _operands(c)
    Oh, Ow = conv2d_output_shape(c.H, c.W, *c.k, c.stride, c.padding, c.dilation)
    g = ConvGeometry(c.batch, c.H, c.W, c.Ci, Oh, Ow, c.Co, *c.k, *c.stride, *c.padding, *c.dilation, qw.block_size,
                     c.act, c.groups)
    assert small_ci_unsupported(g, c.dtype) is None
    config = launch_config(g, c.sms)
    ((_, name, _),) = SmallCiPlan.kernels(c.dtype, c.bits, c.channels_last)
    _write(tmp_path / "x.bin", x.permute(0, 2, 3, 1) if c.channels_last else x)
    for field in ("qweight", "scale", "offset"):
        _write(tmp_path / f"{field}.bin", getattr(qw, field))
    if bias is not None:
        _write(tmp_path / "bias.bin", bias)
    out_shape = (c.batch, Oh, Ow, c.Co) if c.channels_last else (c.batch, c.Co, Oh, Ow)
    _write(tmp_path / "out.bin", torch.full(out_shape, float("nan"), dtype=c.dtype))
    ints = " ".join(str(v) for v in (getattr(g, f) for f in GEOMETRY_FIELDS))
    (tmp_path / "launch.txt").write_text(f"{name} {config.grid[0]} {config.grid[1]} {config.block[0]} {config.smem} "
                                         f"{c.out_shift} {ints}\n")
    run = subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{c}: the emulated kernel failed:\n{run.stderr[-4000:]}"

    y = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=c.dtype).reshape(out_shape)
    y = (y.permute(0, 3, 1, 2) if c.channels_last else y).double()
    assert bool(torch.isfinite(y).all()), f"{c}: unwritten (NaN) outputs"
    ref = conv2d_reference(x, qw, bias, c.stride, c.padding, c.dilation, c.act, groups=c.groups)
    tol = _tolerance(x, qw, bias, c, ref)
    err = (y - ref).abs()
    worst = int(torch.argmax(err - tol))
    assert bool((err <= tol).all()), (f"{c}: max err {err.max():.3e}, at the worst index err "
                                      f"{err.flatten()[worst]:.3e} > tol {tol.flatten()[worst]:.3e}")


@pytest.mark.parametrize("c", CASES, ids=str)
def test_kernel_source_matches_float64_reference(c, emulator, tmp_path):
    _check(c, emulator("address"), tmp_path)


# Blocks that walk several pixel tiles (sms = 1 or 2: a tile's staging overwrites the patch the previous
# tile's warps read), both layouts, both NHWC store paths, channel tiles with an idle warp.
RACE_CASES = [
    case(1, 3, 40, 150, 70, 7, 2, 3, 1, 1, 8, None, F16, True, 1, sms=1),
    case(2, 3, 17, 140, 16, 7, 2, 3, 1, 1, 4, 21, F16, True, 0, sms=1, out_shift=1),
    case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F16, False, 1, sms=2),
    case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, BF16, False, 2, sms=1, bias=False),
]


@pytest.mark.parametrize("c", RACE_CASES, ids=str)
def test_kernel_source_has_no_shared_memory_race(c, emulator, tmp_path):
    _check(c, emulator("thread"), tmp_path)
