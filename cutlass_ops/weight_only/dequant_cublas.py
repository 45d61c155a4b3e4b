"""Strategy "dequant_cublas": dequantize W to a transient dense [N, K] of the activation type
(dequant_weight.cu ``dequant_weight``), then one cuBLAS GEMM (torch.matmul / torch.addmm).

No dense copy of W is kept: it is written to a fresh torch allocation (the caching allocator
recycles it) on every call. :class:`Dequantizer` (one per weight, dtype and device, shared by the
plans of every M and by ``dequantize_weight``) is the dequantization launch on its own.
"""
from __future__ import annotations

import math

import torch

from custom_kernels.device import on_device, sm_count
from custom_kernels.launch import I32, I64, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel
from cutlass_ops import plan_cache

from .dispatch import _is_pow2
from .shared import aligned_qweight, derived, wo_defines
from .variants import chunk_elems

__all__ = ["DequantArgs", "Dequantizer", "dequantizer", "DequantCublasPlan"]

WARPS = 8             # kWarps in dequant_weight.cu
BLOCKS_PER_SM = 2     # its __launch_bounds__ minimum: one wave of persistent blocks
WORDS_PER_TILE = 128  # kWordsPerTile: 32 lanes x 16 bytes


class DequantArgs(KernelArgs):
    _fields_ = [("B", Ptr), ("scale", Ptr), ("offset", Ptr), ("W", Ptr), ("total_words", I64),
                ("block_size", I32), ("block_shift", I32), ("chunk_uniform", I32)]


class Dequantizer:
    """``dequantizer(W)`` writes q * scale + offset into the contiguous [N, K] ``dtype`` tensor W."""

    @staticmethod
    def kernel(dtype, bits: int) -> tuple[str, str, dict[str, int]]:
        """(source, kernel, defines) of the dequantization of ``bits``-bit weights to ``dtype``."""
        return "dequant_weight.cu", "dequant_weight", wo_defines(dtype, bits)

    def __init__(self, qw, dtype, device: int):
        qweight, scale, offset = aligned_qweight(qw), qw.scale.contiguous(), qw.offset.contiguous()
        bs = qw.block_size
        total_words = qw.N * qw.K * qw.bits // 32
        tiles = total_words // WORDS_PER_TILE
        blocks = max(1, min(-(-tiles // WARPS), BLOCKS_PER_SM * sm_count(device)))
        args = DequantArgs(B=qweight.data_ptr(), scale=scale.data_ptr(), offset=offset.data_ptr(),
                           total_words=total_words, block_size=bs,
                           block_shift=int(math.log2(bs)) if _is_pow2(bs) else -1,
                           chunk_uniform=int(bs % chunk_elems(qw.bits) == 0))
        kernel = load_kernel(*self.kernel(dtype, qw.bits), device=device)
        self.launch = Launch(kernel, LaunchConfig.of(blocks, 32 * WARPS), args, device)
        self._keep = (derived(qweight, qw.qweight), derived(scale, qw.scale), derived(offset, qw.offset))

    def __call__(self, W: torch.Tensor) -> torch.Tensor:
        self.launch(W=W.data_ptr())
        return W


def dequantizer(qw, dtype, device: int) -> Dequantizer:
    """The :class:`Dequantizer` of ``qw`` for ``dtype`` on ``device``, built once."""
    def build() -> Dequantizer:
        with on_device(device):
            return Dequantizer(qw, dtype, device)
    return plan_cache.plan(qw, ("weight_only.dequant", dtype, device), build)


class DequantCublasPlan:
    strategy = "dequant_cublas"
    config_type = None
    bias_tensor = True  # __call__ takes the bias tensor (or None), not its address
    per_m = False       # one plan serves every M

    @staticmethod
    def kernels(M: int, dtype, bits: int, config=None) -> tuple:
        """(source, kernel, defines) of the kernel the plan loads (the GEMM is cuBLAS's)."""
        return (Dequantizer.kernel(dtype, bits),)

    def __init__(self, qw, M: int, dtype, device: int, config=None):
        self.dequant = dequantizer(qw, dtype, device)
        self.shape = (qw.N, qw.K)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None, act: int, out: torch.Tensor) -> None:
        w = self.dequant(torch.empty(self.shape, dtype=x.dtype, device=x.device))  # transient
        with torch.no_grad():  # like the raw kernels (out= ops refuse inputs that require grad)
            if bias is None:
                torch.matmul(x, w.t(), out=out)
            else:
                torch.addmm(bias, x, w.t(), out=out)
            if act == 1:
                out.clamp_(min=0)
            elif act == 2:
                out.clamp_(0, 6)
