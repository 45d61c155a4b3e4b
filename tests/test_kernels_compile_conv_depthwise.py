"""The depthwise conv kernels (conv_depthwise.cu) build with NVRTC (sm_75/80/90) and plain nvcc, each
(dtype, bits) module exports exactly the entry points DepthwisePlan names, and the host's rules (which
convs the strategy takes, the launch tiles) hold. No GPU needed; the kernels run in
tests/gpu/test_conv_depthwise_gpu.py."""
from __future__ import annotations

import math
import re

import pytest
import torch

from custom_kernels import nvrtc
from cutlass_ops.conv.depthwise import (
    SMEM_LIMIT, THREADS, TW, DepthwisePlan, depthwise_unsupported, nchw_tile, nhwc_tile, vector_width, window_kw,
)
from cutlass_ops.conv.geometry import DTYPE_CODES, ConvGeometry, conv2d_output_shape
from _nvcc import nvcc_cubin

SOURCE = "conv_depthwise.cu"
DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16}
MODULES = [(t, b) for t in DTYPES for b in (4, 8)]


def _entries(data: bytes) -> set[str]:
    """The conv_depthwise_* names in a cubin (extern "C": unmangled in the ELF string table)."""
    return {m.decode() for m in re.findall(rb"conv_depthwise_[a-z0-9_]+?(?=\x00)", data)}


def _plan_names(dtype: torch.dtype, bits: int) -> set[str]:
    return {name for cl in (False, True) for source, name, _ in DepthwisePlan.kernels(dtype, bits, cl)
            if source == SOURCE}


ALL_ENTRIES = set().union(*(_plan_names(DTYPES[t], b) for t, b in MODULES))


def geometry(batch=1, Ci=8, H=9, W=9, m=1, k=3, stride=1, padding=1, dilation=1, block_size=None, groups=None,
             kw=None) -> ConvGeometry:
    Kh, Kw = k, kw or k
    Oh, Ow = conv2d_output_shape(H, W, Kh, Kw, (stride,) * 2, (padding,) * 2, (dilation,) * 2)
    return ConvGeometry(batch, H, W, Ci, Oh, Ow, m * Ci, Kh, Kw, stride, stride, padding, padding, dilation,
                        dilation, block_size or Kh * Kw, 0, Ci if groups is None else groups)


# ---------------------------------------------------------------------------------------------
# builds
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", [75, 80, 90])
def test_nvrtc_builds_every_entry_point(arch):
    cubin = nvrtc.compile_file(SOURCE, arch)
    assert cubin.data[:4] == b"\x7fELF"
    assert _entries(cubin.data) == ALL_ENTRIES
    assert len(ALL_ENTRIES) == 6 * 7  # per module: nchw, nhwc_v1/v2/v4, nhwc_v4_k3/k5/k7


@pytest.mark.parametrize("t_code, bits", MODULES)
def test_each_module_exports_exactly_its_entry_points(t_code, bits):
    """DepthwisePlan builds one module per (dtype, bits) through CUOPS_CONV_T / CUOPS_CONV_BITS."""
    dtype = DTYPES[t_code]
    (source, _, defines), *_ = DepthwisePlan.kernels(dtype, bits, True)
    assert defines == {"CUOPS_CONV_T": t_code, "CUOPS_CONV_BITS": bits}
    data = nvrtc.compile_file(source, 90, defines=defines).data
    assert _entries(data) == _plan_names(dtype, bits)
    tag = DTYPE_CODES[dtype][1]
    assert _plan_names(dtype, bits) == {f"conv_depthwise_{tag}_w{bits}_{layout}" for layout in (
        "nchw", "nhwc_v1", "nhwc_v2", "nhwc_v4", "nhwc_v4_k3", "nhwc_v4_k5", "nhwc_v4_k7")}


def test_plain_nvcc_builds(tmp_path):
    """The same file compiles as ordinary CUDA C++ with nvcc."""
    try:
        cubin = nvcc_cubin(SOURCE, tmp_path)
    except RuntimeError as exc:  # nvcc_path: no toolkit on this machine
        pytest.skip(str(exc))
    assert _entries(cubin) == ALL_ENTRIES


def test_host_mirrors_kernel_constants():
    text = nvrtc.kernel_path(SOURCE).read_text()
    assert re.search(r"constexpr int TW = (\d+);", text).group(1) == str(TW)
    assert f"__launch_bounds__({THREADS})" in text


# ---------------------------------------------------------------------------------------------
# which convs the strategy takes
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("g", [
    geometry(),
    geometry(Ci=1, H=1, W=1, k=1, padding=0),
    geometry(Ci=96, k=7, padding=3, batch=32, H=56, W=56),
    geometry(Ci=3, m=2, k=5, stride=2, padding=2, dilation=2, block_size=5),
    geometry(Ci=130, k=3, kw=5, block_size=1),
    geometry(Ci=48, k=3, block_size=3),
    geometry(Ci=4, k=101, H=120, W=120, padding=0),  # 10201 taps: 40804 bytes per channel, still fits
], ids=str)
def test_depthwise_takes(g):
    for dtype in DTYPES.values():
        assert depthwise_unsupported(g, dtype) is None


@pytest.mark.parametrize("g, dtype, reason", [
    (geometry(), torch.float64, "fp32, fp16 or bf16"),
    (geometry(Ci=8, groups=1), torch.float16, "groups == Ci"),
    (geometry(Ci=8, groups=4), torch.float16, "groups == Ci"),
    (ConvGeometry(1, 9, 9, 8, 9, 9, 12, 3, 3, 1, 1, 1, 1, 1, 1, 9, 0, 8), torch.float16, "Co a multiple of Ci"),
    (geometry(block_size=4), torch.float16, "block_size to divide K = Kh\\*Kw = 9"),
    (geometry(k=111, H=120, W=120, padding=0), torch.float16, "shared memory per channel"),
    (geometry(batch=2 ** 16, Ci=64, H=32, W=32), torch.float16, "too large for 32-bit offsets"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_depthwise_refuses(g, dtype, reason):
    got = depthwise_unsupported(g, dtype)
    assert got is not None and re.search(reason, got), got


# ---------------------------------------------------------------------------------------------
# kernel choice and launch tiles
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Ci, m, k, expected", [
    (128, 1, 3, 4), (96, 1, 7, 4), (130, 1, 3, 2), (3, 1, 3, 1), (1, 1, 3, 1), (8, 2, 3, 1), (48, 1, 61, 2),
    (48, 1, 101, 1),
])
def test_vector_width(Ci, m, k, expected):
    # 61x61: 4 channels of staged weights per thread would pass 48 KiB, 2 fit; 101x101: only 1
    assert vector_width(geometry(Ci=Ci, m=m, k=k, H=120, W=120)) == expected


def test_window_kernel_only_for_stride_and_dilation_one_along_w():
    assert window_kw(geometry(k=3), 4) == 3
    assert window_kw(geometry(k=7, padding=3), 4) == 7
    assert window_kw(geometry(k=5, padding=2), 2) is None  # the window kernels are V = 4 only
    assert window_kw(geometry(k=3, stride=2), 4) is None
    assert window_kw(geometry(k=3, dilation=2, padding=2), 4) is None
    assert window_kw(geometry(k=1, padding=0), 4) is None
    assert window_kw(geometry(k=3, kw=5), 4) == 5  # Kh is free: rows are a runtime loop
    g = geometry(k=3)
    assert window_kw(ConvGeometry(**{**g.kernel_fields(), "sh": 2, "Oh": 5}), 4) == 3  # stride along H is free


GEOMETRIES = [geometry(Ci=Ci, m=m, k=k, H=H, W=W, batch=b, padding=k // 2)
              for Ci, m, k, H, W, b in [(128, 1, 3, 56, 56, 32), (96, 1, 7, 56, 56, 32), (130, 1, 3, 7, 9, 1),
                                        (3, 2, 5, 5, 6, 7), (1, 1, 1, 1, 1, 1), (2048, 1, 3, 7, 7, 1),
                                        (48, 1, 31, 40, 40, 2), (16, 1, 97, 100, 100, 1), (4096, 4, 3, 3, 3, 2)]]


@pytest.mark.parametrize("g", GEOMETRIES, ids=str)
def test_nhwc_tile_covers_the_channels_within_limits(g):
    for vector in {vector_width(g), 1}:
        tile = nhwc_tile(g, vector)
        taps = g.Kh * g.Kw
        assert 1 <= tile.ct * tile.st <= THREADS and tile.ct <= 32
        assert tile.smem == tile.ct * vector * taps * 4 <= SMEM_LIMIT
        vectors = g.Co // vector
        # every channel vector in exactly one slice, and no slice empty
        assert (tile.slices - 1) * tile.ct < vectors <= tile.slices * tile.ct <= 65535 * tile.ct


@pytest.mark.parametrize("g", GEOMETRIES, ids=str)
def test_nchw_tile_covers_the_planes_within_limits(g):
    tile = nchw_tile(g)
    taps, pixels, planes = g.Kh * g.Kw, g.Oh * g.Ow, g.batch * g.Co
    assert tile.tx % 32 == 0 and tile.tx * tile.ty <= THREADS
    assert tile.smem == tile.ty * taps * 4 <= SMEM_LIMIT
    assert tile.grid[0] * tile.ty >= planes > (tile.grid[0] - 1) * tile.ty
    assert 1 <= tile.grid[1] <= min(65535, math.ceil(pixels / (tile.tx * TW)))
    assert tile.tx == THREADS or tile.tx * TW >= pixels  # a small plane takes one chunk of whole warps
