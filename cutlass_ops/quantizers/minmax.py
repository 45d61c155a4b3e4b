"""Round to nearest over each block's range: the default method (bit-for-bit the original quantizer).

symmetric:  scale = absmax / qmax, offset = 0.
asymmetric: scale = (max - min) / (2^bits - 1), offset = max - qmax * scale (max -> qmax, min -> qmin).
An all-zero (symmetric) or zero-range (asymmetric) block gets scale 1 (offset = max), so it
round-trips exactly.
"""
from __future__ import annotations

import torch

from cutlass_ops.quantizers._blocks import qrange, round_to_grid, to_blocks


def minmax_params(Wb: torch.Tensor, bits: int, symmetric: bool):
    """(scale, offset) float32 [N, G] of float64 blocks Wb [N, G, B]."""
    qmax = qrange(bits)[1]
    if symmetric:
        scale = (Wb.abs().amax(dim=-1) / qmax).to(torch.float32)
        # All-zero block (or one whose scale underflows float32): any scale reproduces it; use 1.
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return scale, torch.zeros_like(scale)
    w_max, w_min = Wb.amax(dim=-1), Wb.amin(dim=-1)
    scale = ((w_max - w_min) / (2 ** bits - 1)).to(torch.float32)
    zero_range = scale == 0
    scale = torch.where(zero_range, torch.ones_like(scale), scale)
    # w_max maps to qmax, so w_min maps to qmax - (2^bits - 1) = qmin.
    offset = torch.where(zero_range, w_max, w_max - qmax * scale.to(torch.float64)).to(torch.float32)
    return scale, offset


def quantize_minmax(W: torch.Tensor, bits: int, block_size: int, symmetric: bool):
    """W [N, K] float -> (q int32 [N, K], scale f32 [N, G], offset f32 [N, G])."""
    N, K = W.shape
    qmin, qmax = qrange(bits)
    Wb = to_blocks(W, block_size, torch.float64)
    scale, offset = minmax_params(Wb, bits, symmetric)
    # q from the stored float32 scale/offset so that dequantization meets |w - deq| <= scale / 2.
    q = round_to_grid(Wb, scale.to(torch.float64), offset.to(torch.float64), qmin, qmax)
    return q.to(torch.int32).reshape(N, K), scale, offset
