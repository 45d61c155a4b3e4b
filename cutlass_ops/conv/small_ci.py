"""The conv strategy "small_ci" (``conv_small_ci.cu``): direct convolution for few input channels per group.

Aimed at CNN stems (Ci = 3, 7x7, stride 2: K = Kh*Kw*Ci/groups = 147), which the tensor-core igemm
cannot take (it needs Ci/groups % 32 == 0). A block of 128 threads owns 64 output channels of one
group, dequantizes their weights once into shared memory (float [K][64]) and walks tiles of
2 output rows x 64 output columns (one wave of persistent blocks), staging each tile's input patch
in shared memory; each thread accumulates 4 pixels x 16 channels in fp32. Any dtype, NCHW or NHWC,
stride, padding, dilation, kernel size, groups and block size, any arch (sm_75+), as long as the
shared memory of one block (:func:`smem_bytes`: K * 64 weights and the patch, as float) fits
:data:`SMEM_BUDGET` (and the GPU's opt-in limit: 64 KiB on sm_75). That bounds K = Kh*Kw*Ci/groups:
7x7 stride 2 up to 5 channels per group (K = 245), 3x3 stride 1 up to 29 (K = 261), 1x1 up to 131.
"""
from __future__ import annotations

import logging
import math

import torch

from custom_kernels.device import sm_count, smem_limits
from custom_kernels.launch import KernelArgs, Launch, LaunchConfig, Ptr

from .geometry import DTYPE_CODES, GEOMETRY_ARGS, ConvGeometry, conv_defines, conv_kernel

__all__ = ["SmallCiArgs", "SmallCiPlan", "small_ci_unsupported", "smem_bytes", "launch_config", "patch_shape"]

log = logging.getLogger(__name__)

SOURCE = "conv_small_ci.cu"
# The tile of conv_small_ci.cu (TH, TW, COT, THREADS there; the compile tests compare them).
TH, TW, COT, THREADS = 2, 64, 64, 128
BLOCKS_PER_SM = 4  # the kernels' __launch_bounds__(128, 4); the plan asks the driver for the real occupancy
# Dynamic shared memory of one block at most: the opt-in limit of sm_86/89/120 (sm_80: 163 KiB, sm_90:
# 227 KiB), so that these GPUs run every geometry small_ci_unsupported accepts; on sm_75 (64 KiB) the
# plan refuses the few between (the stem, 52,712 bytes, fits; with Ci = 4, 70,272 bytes, it does not).
SMEM_BUDGET = 99 * 1024
INT32_MAX = 2 ** 31 - 1
MAX_GRID_Y = 65535  # channel tiles (groups * ceil(Co/groups / COT)) run along gridDim.y


class SmallCiArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("qweight", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("out", Ptr),
                *GEOMETRY_ARGS]


def patch_shape(g: ConvGeometry) -> tuple[int, int]:
    """(PH, Lp) of the staged input patch: PH rows, and Lp slots per stride phase along x (the patch is
    stored [Cg][PH][sw][Lp], column lx at phase lx % sw, slot lx // sw)."""
    return (TH - 1) * g.sh + (g.Kh - 1) * g.dh + 1, TW + (g.Kw - 1) * g.dw // g.sw


def smem_bytes(g: ConvGeometry) -> int:
    """Dynamic shared memory of one block: float ws[K][COT], int koff[ceil4(K) + 4], float xs[Cg][PH][sw][Lp]."""
    PH, Lp = patch_shape(g)
    K4 = (g.K + 3) // 4 * 4
    return 4 * (g.K * COT + K4 + 4 + g.Cg * PH * g.sw * Lp)


def channel_tiles(g: ConvGeometry) -> int:
    """Blocks along gridDim.y: ceil((Co / groups) / COT) channel tiles in each group."""
    return g.groups * math.ceil(g.Co // g.groups / COT)


def pixel_tiles(g: ConvGeometry) -> int:
    """TH x TW output tiles of every image."""
    return g.batch * math.ceil(g.Oh / TH) * math.ceil(g.Ow / TW)


def launch_config(g: ConvGeometry, sms: int, blocks_per_sm: int = BLOCKS_PER_SM) -> LaunchConfig:
    """One wave of persistent blocks: gridDim.y = the channel tiles, gridDim.x = as many pixel-tile
    walkers as fill ``sms`` SMs at ``blocks_per_sm`` (never more than there are pixel tiles); each block
    stages its weights once and strides over the pixel tiles. Pure: no GPU."""
    grid_y = channel_tiles(g)
    grid_x = max(1, min(pixel_tiles(g), math.ceil(sms * blocks_per_sm / grid_y)))
    return LaunchConfig.of((grid_x, grid_y), THREADS, smem=smem_bytes(g))


def small_ci_unsupported(geometry: ConvGeometry, dtype: torch.dtype, smem_limit: int = SMEM_BUDGET) -> str | None:
    """Why the small_ci strategy cannot run this conv (None: it can) with ``smem_limit`` bytes of dynamic
    shared memory per block (default :data:`SMEM_BUDGET`; the plan passes its GPU's, if lower). Pure: no GPU."""
    g = geometry
    if dtype not in DTYPE_CODES:
        return f"it needs fp32, fp16 or bf16 activations, got {dtype}"
    if min(g.batch, g.H, g.W, g.Ci, g.Oh, g.Ow, g.Co, g.Kh, g.Kw, g.sh, g.sw, g.dh, g.dw, g.block_size,
           g.groups) < 1 or min(g.ph, g.pw) < 0:
        return f"it needs positive sizes, strides and dilations and non-negative padding, got {g}"
    if g.Ci % g.groups or g.Co % g.groups:
        return f"groups={g.groups} must divide Ci={g.Ci} and Co={g.Co}"
    if g.K % g.block_size:
        return f"block_size={g.block_size} must divide K = Kh*Kw*Ci/groups = {g.K}"
    if max(g.batch * g.Ci * g.H * g.W, g.batch * g.Co * g.Oh * g.Ow) > INT32_MAX:  # the kernel's 32-bit offsets
        return (f"x [{g.batch}, {g.Ci}, {g.H}, {g.W}] or out [{g.batch}, {g.Co}, {g.Oh}, {g.Ow}] has 2^31 "
                f"elements or more")
    smem = smem_bytes(g)
    if smem > min(smem_limit, SMEM_BUDGET):
        PH, Lp = patch_shape(g)
        return (f"it needs K * {COT} weights + the input patch in shared memory: {smem} bytes > "
                f"{min(smem_limit, SMEM_BUDGET)} "
                f"(K = Kh*Kw*Ci/groups = {g.Kh}*{g.Kw}*{g.Cg} = {g.K}; patch {g.Cg} x {PH} x {g.sw * Lp} floats); "
                f"fewer input channels per group, a smaller kernel, stride or dilation fit")
    if channel_tiles(g) > MAX_GRID_Y:
        return f"Co={g.Co} with groups={g.groups} gives {channel_tiles(g)} channel tiles > {MAX_GRID_Y}"
    return None


class SmallCiPlan:
    """conv_small_ci_<dtype>_w<bits>_<layout> for one geometry on one device; ``plan(x, qw, bias, out)``."""

    strategy = "small_ci"

    @staticmethod
    def kernels(dtype: torch.dtype, bits: int, channels_last: bool) -> tuple:
        """(source, kernel, defines) of the kernel the plan loads."""
        name = f"conv_small_ci_{DTYPE_CODES[dtype][1]}_w{bits}_{'nhwc' if channels_last else 'nchw'}"
        return ((SOURCE, name, conv_defines(dtype, bits)),)

    def __init__(self, geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool, device: int,
                 arch: str):
        reason = small_ci_unsupported(geometry, dtype, smem_limits(device)[1])
        if reason is not None:
            raise ValueError(f"strategy='small_ci' cannot run this conv: {reason}")
        self.geometry = geometry
        ((source, name, _),) = self.kernels(dtype, bits, channels_last)
        kernel = conv_kernel(source, name, dtype, bits, arch)
        smem = smem_bytes(geometry)
        kernel.set_max_dynamic_smem(smem)  # above 48 KiB needs the opt-in (the stem: 52,712 bytes)
        occupancy = kernel.max_active_blocks(THREADS, smem, device)
        if occupancy < 1:
            raise RuntimeError(f"{name} cannot run with {smem} bytes of shared memory on device {device}")
        config = launch_config(geometry, sm_count(device), occupancy)
        self.launch = Launch(kernel, config, SmallCiArgs(**geometry.kernel_fields()), device)
        log.debug("conv small_ci plan: %s grid=%s smem=%d blocks/SM=%d", geometry, config.grid, smem, occupancy)

    def __call__(self, x: torch.Tensor, qw, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        self.launch(x=x.data_ptr(), qweight=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(),
                    offset=qw.offset.data_ptr(), bias=0 if bias is None else bias.data_ptr(), out=out.data_ptr())
