"""Half-quadratic optimization of (scale, offset) per block, after HQQ (Badri & Shaji, 2023).

HQQ fits the reconstruction to W under an l_p error (p < 1, robust to outliers) by splitting it
with an auxiliary error term W_e and alternating:
  q   = round((W - offset) / scale)                   (nearest grid point)
  W_e = shrink_p(W - (q * scale + offset), beta)      (generalized soft threshold, l_p prox)
  (scale, offset) = least squares fit of W - W_e by q * scale + offset
  beta *= kappa
The HQQ package updates only the zero point in the quadratic step; here both scale and offset
are refitted (symmetric: the scale only, offset stays 0). Errors are in weight units, as in HQQ.
Starting at the minmax quantization, every iterate is offered to a per-block best by squared
error, so the result is never worse than "minmax", block by block.
"""
from __future__ import annotations

import torch

from cutlass_ops.quantizers._blocks import (
    BestPerBlock, block_error, finalize, least_squares, qrange, round_to_grid, row_chunks, to_blocks,
)
from cutlass_ops.quantizers.minmax import quantize_minmax

SEARCH_DTYPE = torch.float32


def shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    """Generalized soft thresholding: sign(x) * max(|x| - |x|^(p-1) / beta, 0)."""
    a = x.abs()
    return torch.sign(x) * (a - a.clamp_min(1e-12).pow(p - 1) / beta).clamp_min(0)


def quantize_hqq(W: torch.Tensor, bits: int, block_size: int, symmetric: bool, calibration=None,
                 iters: int = 20, lp_norm: float = 0.7, beta: float = 10.0, kappa: float = 1.01):
    """W [N, K] -> (q int32 [N, K], scale f32 [N, G], offset f32 [N, G])."""
    if iters < 1 or not 0 < lp_norm <= 1 or beta <= 0 or kappa < 1:
        raise ValueError(f"hqq options need iters >= 1, 0 < lp_norm <= 1, beta > 0, kappa >= 1; got "
                         f"iters={iters}, lp_norm={lp_norm}, beta={beta}, kappa={kappa}")
    qmin, qmax = qrange(bits)
    qs, scales, offsets = [], [], []
    for rows in row_chunks(*W.shape):
        W_rows = W[rows]
        fallback = quantize_minmax(W_rows, bits, block_size, symmetric)
        q0, scale, offset = fallback
        Wb = to_blocks(W_rows, block_size, SEARCH_DTYPE)
        scale, offset = scale.to(SEARCH_DTYPE), offset.to(SEARCH_DTYPE)
        best = BestPerBlock(scale, offset, block_error(Wb, q0.reshape(Wb.shape).to(SEARCH_DTYPE),
                                                       scale, offset))
        b = beta
        for _ in range(iters):
            q = round_to_grid(Wb, scale, offset, qmin, qmax)
            best.offer(scale, offset, block_error(Wb, q, scale, offset))
            W_r = q * scale[..., None] + offset[..., None]
            W_e = shrink_lp(Wb - W_r, b, lp_norm)
            scale, offset = least_squares(Wb - W_e, q, scale, offset, symmetric)
            b *= kappa
        q = round_to_grid(Wb, scale, offset, qmin, qmax)
        best.offer(scale, offset, block_error(Wb, q, scale, offset))
        q, scale, offset = finalize(W_rows, block_size, bits, best.scale, best.offset, None, fallback)
        qs.append(q), scales.append(scale), offsets.append(offset)
    return torch.cat(qs), torch.cat(scales), torch.cat(offsets)
