"""The conv strategy "igemm" (``conv_igemm.cu``): implicit GEMM on tensor cores (mma.sync, sm_80+).

fp16/bf16 with Ci / groups % 32 == 0 and block_size % 32 == 0, and for a grouped conv
(Co / groups) % 64 == 0, so that each tile's 64 output channels read one group. It reads the input
as NHWC; an NCHW input is first transposed to NHWC (one extra kernel), and the output is written
directly in the caller's layout. Small problems are split along K (fp32 partials, then a reduce
kernel that adds the bias and applies the activation). Weights are dequantized in the input dtype,
with scale and offset rounded to it (fp16: |scale|, |offset| must stay below 65504).
"""
from __future__ import annotations

import logging
import math

import torch

from custom_kernels.device import capability
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr

from .geometry import DTYPE_CODES, GEOMETRY_ARGS, ConvGeometry, conv_defines, conv_kernel

__all__ = ["IgemmArgs", "SplitKReduceArgs", "TransposeArgs", "IgemmPlan", "choose_splits", "igemm_problem",
           "igemm_unsupported"]

log = logging.getLogger(__name__)

SOURCE = "conv_igemm.cu"
# Tile of the igemm kernel (conv_igemm.cu: BM, BN, BK, THREADS).
BM, BN, BK, THREADS = 64, 64, 32, 128
ELEMENTWISE_THREADS = 256
MIN_K_TILES_PER_SPLIT = 2
CTAS_PER_SM_TARGET = 4
SPLIT_MIN_SAVED_K_TILES = 9
MAX_SPLITS = 32


class IgemmArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("qweight", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("out", Ptr),
                ("workspace", Ptr), *GEOMETRY_ARGS, ("kt_per_split", I32)]


class SplitKReduceArgs(KernelArgs):
    _fields_ = [("workspace", Ptr), ("bias", Ptr), ("out", Ptr), ("M", I32), ("Co", I32), ("OhOw", I32),
                ("splits", I32), ("act", I32)]


class TransposeArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("x_nhwc", Ptr), ("C", I32), ("P", I32)]


def _arch_problem(cc: int) -> str | None:
    return f"it needs sm_80 or newer, got sm_{cc}" if cc < 80 else None


def igemm_problem(dtype: torch.dtype, Ci: int, Co: int, groups: int, block_size: int,
                  cc: int | None = None) -> str | None:
    """Why the igemm strategy cannot run a conv of ``dtype`` activations with ``Ci`` input channels per
    group, ``Co`` output channels, ``groups`` and the weight's ``block_size`` on sm_``cc`` (None: it can,
    given 16-byte aligned operands; ``cc`` None: on a GPU new enough). Pure: no GPU."""
    if dtype not in (torch.float16, torch.bfloat16):
        return f"it needs fp16 or bf16 activations, got {dtype}"
    if Ci % BK != 0:
        return f"it needs Ci % {BK} == 0, got Ci={Ci}" if groups == 1 else (
            f"it needs Ci / groups % {BK} == 0, got Ci / groups = {Ci} (groups={groups})")
    if groups > 1 and (Co // groups) % BN != 0:  # a tile's BN columns must read one group's channels
        return f"it needs (Co / groups) % {BN} == 0 for groups > 1, got Co={Co}, groups={groups}"
    if block_size % BK != 0:
        return f"it needs block_size % {BK} == 0, got block_size={block_size}"
    return None if cc is None else _arch_problem(cc)


def igemm_unsupported(x: torch.Tensor, channels_last: bool, qw, Ci: int, device: int, groups: int = 1) -> str | None:
    """Why the igemm strategy cannot run this problem, or None when it can (``Ci``: the weight's
    input channels, i.e. per group)."""
    # the GPU is asked for its capability only when the shapes fit
    problem = igemm_problem(x.dtype, Ci, qw.N, groups, qw.block_size) or _arch_problem(capability(device))
    if problem is not None:
        return problem
    if qw.qweight.data_ptr() % 16 != 0:
        return "it needs qw.qweight 16-byte aligned"
    if channels_last and x.data_ptr() % 16 != 0:  # an NCHW input is copied to a fresh tensor
        return "it needs a 16-byte aligned channels_last x"
    return None


def choose_splits(M: int, Co: int, KT: int, sms: int) -> int:
    """How many slices to split K into (1 = no split).

    A grid with at least one tile per SM is not split. Otherwise the split aims at about 4 CTAs
    per SM with >= 2 K tiles per slice, and is taken only when it shortens each CTA's K loop by
    more than SPLIT_MIN_SAVED_K_TILES tiles: measured on an H200 (scripts/bench_conv.py sweeps
    every split), a latency-bound CTA spends about 0.4 us per K tile and the extra reduce
    kernel costs about 3.5 us.
    """
    tiles = math.ceil(M / BM) * math.ceil(Co / BN)
    if tiles >= sms:
        return 1
    splits = max(1, min(math.ceil(CTAS_PER_SM_TARGET * sms / tiles), KT // MIN_K_TILES_PER_SPLIT, MAX_SPLITS))
    if KT - math.ceil(KT / splits) <= SPLIT_MIN_SAVED_K_TILES:
        return 1
    return splits


class IgemmPlan:
    """The implicit-GEMM launches of one geometry on one device (NCHW transpose, GEMM, split-K
    reduce as needed); ``plan(x, qw, bias, out)``."""

    strategy = "igemm"

    @staticmethod
    def kernels(dtype: torch.dtype, bits: int, channels_last: bool) -> tuple:
        """(source, kernel, defines) of every kernel the plan may load: the GEMM, the NCHW -> NHWC
        transpose of an NCHW input, and the split-K reduction (where the GPU's SM count splits K)."""
        tag, layout, defines = DTYPE_CODES[dtype][1], "nhwc" if channels_last else "nchw", conv_defines(dtype, bits)
        return ((SOURCE, f"conv_igemm_{tag}_w{bits}_{layout}", defines),
                *(() if channels_last else ((SOURCE, "conv_nchw_to_nhwc_b16", dict(defines)),)),
                (SOURCE, f"conv_splitk_reduce_{tag}_{layout}", dict(defines)))

    def __init__(self, geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool, device: int,
                 arch: str, sms: int, split_k: int | None):
        g = self.geometry = geometry
        tag = DTYPE_CODES[dtype][1]
        layout = "nhwc" if channels_last else "nchw"
        M, Co = g.M, g.Co
        KT = g.K // BK
        splits = choose_splits(M, Co, KT, sms) if split_k is None else min(split_k, KT)
        kt_per_split = math.ceil(KT / splits)
        splits = math.ceil(KT / kt_per_split)  # no empty split
        grid = (math.ceil(M / BM), math.ceil(Co / BN), splits)
        if grid[1] > 65535:
            raise ValueError(f"Co={Co} is too large for the igemm grid (at most {65535 * BN})")
        if not channels_last and g.batch > 65535:
            raise ValueError(f"batch={g.batch} is too large for the NCHW transpose grid; pass channels_last input")
        self.splits = splits
        kernel = conv_kernel(SOURCE, f"conv_igemm_{tag}_w{bits}_{layout}", dtype, bits, arch)
        self.gemm = Launch(kernel, LaunchConfig.of(grid, THREADS),
                           IgemmArgs(**g.kernel_fields(), kt_per_split=kt_per_split), device)
        self.transpose = None  # NCHW -> NHWC copy of the input
        if not channels_last:
            P = g.H * g.W
            self.transpose = Launch(conv_kernel(SOURCE, "conv_nchw_to_nhwc_b16", dtype, bits, arch),
                                    LaunchConfig.of((math.ceil(P / 32), math.ceil(g.Ci / 32), g.batch), (32, 8)),
                                    TransposeArgs(C=g.Ci, P=P), device)
        self.reduce = None
        self.workspace_shape = None
        if splits > 1:
            self.reduce = Launch(conv_kernel(SOURCE, f"conv_splitk_reduce_{tag}_{layout}", dtype, bits, arch),
                                 LaunchConfig.of(math.ceil(M * Co / ELEMENTWISE_THREADS), ELEMENTWISE_THREADS),
                                 SplitKReduceArgs(M=M, Co=Co, OhOw=g.Oh * g.Ow, splits=splits, act=g.act), device)
            self.workspace_shape = (splits, Co, M) if not channels_last else (splits, M, Co)
        log.debug("conv igemm plan: M=%d N=%d K=%d grid=%s splits=%d", M, Co, g.K, grid, splits)

    def __call__(self, x: torch.Tensor, qw, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        if self.transpose is not None:  # NCHW caller: one transpose to NHWC; the kernel writes NCHW directly
            x_nhwc = torch.empty_like(x, memory_format=torch.channels_last)
            self.transpose(x=x.data_ptr(), x_nhwc=x_nhwc.data_ptr())
            x = x_nhwc
        workspace = 0
        if self.workspace_shape is not None:
            ws = torch.empty(self.workspace_shape, dtype=torch.float32, device=x.device)
            workspace = ws.data_ptr()
        bias_ptr = 0 if bias is None else bias.data_ptr()
        self.gemm(x=x.data_ptr(), qweight=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(),
                  offset=qw.offset.data_ptr(), bias=bias_ptr, out=out.data_ptr(), workspace=workspace)
        if self.reduce is not None:
            self.reduce(workspace=workspace, bias=bias_ptr, out=out.data_ptr())
