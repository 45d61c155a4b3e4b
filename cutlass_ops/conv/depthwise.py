"""The conv strategy "depthwise" (``conv_depthwise.cu``): groups == Ci, one weight channel per output
channel (a channel multiplier Co = m * Ci allowed), any kernel size, stride, padding and dilation,
fp32 / fp16 / bf16, int4 / int8, NCHW or NHWC, fp32 accumulation, any GPU.

Each block dequantizes its channel slice's weights into shared memory once (floats, at most 48 KiB)
and loops over output tiles (grid-stride). NHWC: threads along channel vectors of V = 4 / 2 / 1
channels, each computing a strip of TW = 4 outputs along Ow; Kw = 3 / 5 / 7 with stride and dilation
1 along W take the register-window kernels (``..._nhwc_v4_k<Kw>``). NCHW: threads along the output
pixels of one (image, channel) plane, TW pixels per thread. A call whose x or out is not aligned to
the vector width runs the one-channel NHWC kernel instead.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from custom_kernels.device import sm_count
from custom_kernels.launch import KernelArgs, Launch, LaunchConfig, Ptr

from .geometry import DTYPE_CODES, GEOMETRY_ARGS, ConvGeometry, conv_defines, conv_kernel

__all__ = ["DepthwiseArgs", "DepthwisePlan", "NhwcTile", "NchwTile", "depthwise_unsupported", "vector_width",
           "window_kw", "kernel_name", "nhwc_tile", "nchw_tile", "strip_blocks"]

log = logging.getLogger(__name__)

SOURCE = "conv_depthwise.cu"
THREADS = 256  # threads per block (the kernels' __launch_bounds__)
TW = 4  # outputs per thread (conv_depthwise.cu: TW)
CHANNEL_THREADS = 32  # NHWC: at most one warp of channel vectors per block (a wider slice adds no reuse)
SMEM_LIMIT = 48 * 1024  # staged float weights per block: what every GPU gives without an opt-in
WINDOW_KW = (3, 5, 7)  # Kw of the register-window NHWC kernels
VECTOR_WIDTHS = (4, 2)  # NHWC channels per thread, widest first (1 is the fallback)
GRID_Y_MAX = 65535
_INT32_MAX = 2 ** 31 - 1


class DepthwiseArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("qweight", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("out", Ptr),
                *GEOMETRY_ARGS]


def depthwise_unsupported(geometry: ConvGeometry, dtype: torch.dtype) -> str | None:
    """Why the depthwise strategy cannot run this conv (None: it can, on any GPU, in either layout).
    Pure: no GPU."""
    g = geometry
    if dtype not in DTYPE_CODES:
        return f"it needs fp32, fp16 or bf16 activations, got {dtype}"
    if g.groups != g.Ci:
        return f"it needs groups == Ci (depthwise), got groups={g.groups}, Ci={g.Ci}"
    if g.Co % g.Ci != 0:
        return f"it needs Co a multiple of Ci (a channel multiplier), got Co={g.Co}, Ci={g.Ci}"
    taps = g.Kh * g.Kw
    if g.block_size < 1 or taps % g.block_size != 0:
        return f"it needs block_size to divide K = Kh*Kw = {taps}, got block_size={g.block_size}"
    if taps * 4 > SMEM_LIMIT:  # one channel's staged weights must fit a block's shared memory
        return f"a {g.Kh}x{g.Kw} kernel needs {taps * 4} bytes of shared memory per channel, over {SMEM_LIMIT}"
    if nhwc_tile(g, 1).slices > GRID_Y_MAX:
        return f"Co={g.Co} needs more than {GRID_Y_MAX} channel slices of a {g.Kh}x{g.Kw} kernel"
    # 32-bit offsets in the kernels; the last strip / pixel chunk may run THREADS * TW past the end
    if g.batch * g.Ci * g.H * g.W > _INT32_MAX or g.batch * g.Co * g.Oh * g.Ow > _INT32_MAX - THREADS * TW:
        return (f"x [{g.batch}, {g.Ci}, {g.H}, {g.W}] or the output [{g.batch}, {g.Co}, {g.Oh}, {g.Ow}] is too "
                f"large for 32-bit offsets")
    return None


def vector_width(geometry: ConvGeometry) -> int:
    """Channels per NHWC thread: the widest of 4, 2 dividing Ci, without a channel multiplier (the thread's
    input and output channels must be the same vector), else 1."""
    g = geometry
    if g.Co != g.Ci:
        return 1
    for v in VECTOR_WIDTHS:
        if g.Ci % v == 0 and v * g.Kh * g.Kw * 4 <= SMEM_LIMIT:
            return v
    return 1


def window_kw(geometry: ConvGeometry, vector: int) -> int | None:
    """Kw of the register-window kernel this NHWC conv takes (None: the generic one)."""
    g = geometry
    return g.Kw if vector == 4 and g.Kw in WINDOW_KW and g.sw == 1 and g.dw == 1 else None


@dataclass(frozen=True)
class NhwcTile:
    """NHWC block: ``ct`` threads along channel vectors of ``vector`` channels x ``st`` threads along
    strips of TW outputs; ``slices`` blocks along Co (grid.y); ``smem`` bytes of staged weights."""

    vector: int
    ct: int
    st: int
    slices: int
    smem: int


def nhwc_tile(geometry: ConvGeometry, vector: int) -> NhwcTile:
    """At most one warp of channel vectors per block, fewer where the staged weights would pass SMEM_LIMIT;
    the rest of THREADS along strips."""
    g = geometry
    taps = g.Kh * g.Kw
    vectors = g.Co // vector
    ct = max(1, min(vectors, CHANNEL_THREADS, SMEM_LIMIT // (vector * taps * 4)))
    slices = math.ceil(vectors / ct)
    ct = math.ceil(vectors / slices)  # even slices: Co = 48 channel vectors -> 2 x 24, not 32 + 16
    return NhwcTile(vector, ct, max(1, THREADS // ct), slices, ct * vector * taps * 4)


def strip_blocks(geometry: ConvGeometry, tile: NhwcTile) -> int:
    """Blocks of ``tile.st`` strips (TW outputs along Ow) that cover the NHWC output: grid.x before its cap."""
    g = geometry
    return math.ceil(g.batch * g.Oh * math.ceil(g.Ow / TW) / tile.st)


@dataclass(frozen=True)
class NchwTile:
    """NCHW block: ``tx`` threads along one plane's output pixels x ``ty`` planes; its ``grid`` and
    ``smem`` bytes of staged weights."""

    tx: int
    ty: int
    grid: tuple[int, int]
    smem: int


def nchw_tile(geometry: ConvGeometry) -> NchwTile:
    """Whole warps along a plane's pixels (up to THREADS), the rest of the block along planes."""
    g = geometry
    taps = g.Kh * g.Kw
    pixels, planes = g.Oh * g.Ow, g.batch * g.Co
    # whole warps (one weight per warp: a broadcast), as few as cover a small plane
    tx = min(THREADS, 32 * math.ceil(math.ceil(pixels / TW) / 32))
    ty = max(1, min(THREADS // tx, planes, SMEM_LIMIT // (taps * 4)))
    grid = (math.ceil(planes / ty), min(math.ceil(pixels / (tx * TW)), GRID_Y_MAX))
    return NchwTile(tx, ty, grid, ty * taps * 4)


def _name(dtype: torch.dtype, bits: int, layout: str) -> str:
    return f"conv_depthwise_{DTYPE_CODES[dtype][1]}_w{bits}_{layout}"


def kernel_name(geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool,
                vector: int | None = None) -> str:
    """The entry point that runs this conv: NCHW one kernel; NHWC the one of ``vector`` channels per thread
    (default :func:`vector_width`), its register-window variant where :func:`window_kw` allows."""
    if not channels_last:
        return _name(dtype, bits, "nchw")
    vector = vector_width(geometry) if vector is None else vector
    kw = window_kw(geometry, vector)
    return _name(dtype, bits, f"nhwc_v{vector}" + ("" if kw is None else f"_k{kw}"))


class DepthwisePlan:
    """conv_depthwise_<dtype>_w<bits>_<layout>[_v<V>[_k<Kw>]] for one geometry on one device;
    ``plan(x, qw, bias, out)``."""

    strategy = "depthwise"

    @staticmethod
    def kernels(dtype: torch.dtype, bits: int, channels_last: bool) -> tuple:
        """(source, kernel, defines) of every kernel the plan may load (one module): NCHW one kernel; NHWC
        the vector widths 1, 2, 4 and the register-window kernels."""
        defines = conv_defines(dtype, bits)
        if not channels_last:
            return ((SOURCE, _name(dtype, bits, "nchw"), defines),)
        names = [f"nhwc_v{v}" for v in (1, *reversed(VECTOR_WIDTHS))] + [f"nhwc_v4_k{kw}" for kw in WINDOW_KW]
        return tuple((SOURCE, _name(dtype, bits, layout), dict(defines)) for layout in names)

    def __init__(self, geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool, device: int,
                 arch: str):
        reason = depthwise_unsupported(geometry, dtype)
        if reason is not None:
            raise ValueError(f"strategy='depthwise' cannot run this conv: {reason}")
        self.geometry = geometry
        self.fallback = None  # NHWC: the one-channel kernel, for a call whose x or out is misaligned
        self.alignment = 1  # bytes x and out must be aligned to for self.launch

        def load(name: str):
            return conv_kernel(SOURCE, name, dtype, bits, arch)  # one module: every name shares its build

        name = kernel_name(geometry, dtype, bits, channels_last)
        if channels_last:
            vector = vector_width(geometry)
            self.launch = self._nhwc_launch(load(name), vector, device)
            if vector > 1:
                self.fallback = self._nhwc_launch(load(kernel_name(geometry, dtype, bits, True, 1)), 1, device)
                self.alignment = vector * dtype.itemsize
        else:
            tile = nchw_tile(geometry)
            config = LaunchConfig.of(tile.grid, (tile.tx, tile.ty), tile.smem)
            self.launch = Launch(load(name), config, DepthwiseArgs(**geometry.kernel_fields()), device)
        log.debug("conv depthwise plan: %s grid=%s block=%s smem=%d", name, self.launch.shape.grid,
                  self.launch.shape.block, self.launch.shape.smem)

    def _nhwc_launch(self, kernel, vector: int, device: int) -> Launch:
        """One wave of resident blocks (each then loops over strips: the weights are staged once per block)."""
        g = self.geometry
        tile = nhwc_tile(g, vector)
        resident = kernel.max_active_blocks(tile.ct * tile.st, tile.smem, device) * sm_count(device)
        grid = (min(strip_blocks(g, tile), max(1, resident // tile.slices)), tile.slices)
        config = LaunchConfig.of(grid, (tile.ct, tile.st), tile.smem)
        return Launch(kernel, config, DepthwiseArgs(**g.kernel_fields()), device)

    def __call__(self, x: torch.Tensor, qw, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        launch = self.launch
        if self.fallback is not None and (x.data_ptr() | out.data_ptr()) % self.alignment:
            launch = self.fallback
        launch(x=x.data_ptr(), qweight=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(),
               offset=qw.offset.data_ptr(), bias=0 if bias is None else bias.data_ptr(), out=out.data_ptr())
