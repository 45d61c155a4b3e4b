"""Per-block search for the (scale, offset) with the least squared error, optionally weighted.

For each clipping ratio r in [min_ratio, 1] (``steps`` values), the block's range is shrunk by r
(symmetric: scale = r * max(max / qmax, min / qmin); asymmetric: scale = r * (max - min) /
(2^bits - 1) about the range's centre), the block is rounded to that grid, and then (scale,
offset) is refitted by least squares for the rounded q and the block rounded again, ``refits``
times. Each of these steps can only lower the error of the pair it started from; every pair
evaluated is offered to a per-block best, which starts at the minmax quantization, so the result
is never worse than "minmax", block by block (in the weighted error when weights are given).

Vectorized over all blocks (loop over ratios only), in float32, on W's device; rows are
processed in chunks to bound the temporaries.

"imatrix" is the same search with each input channel's error weighted by its mean square
activation on the calibration inputs (see ``calibration.channel_importance``); "mse_balanced"
weights it by a data-free estimate of that from W alone (``weight_balance_importance``), taking
only pairs no worse than minmax in plain MSE.
"""
from __future__ import annotations

import torch

from cutlass_ops.quantizers._blocks import (
    BestPerBlock, block_error, finalize, least_squares, qrange, round_to_grid, row_chunks, to_blocks,
    weight_blocks,
)
from cutlass_ops.quantizers.calibration import channel_importance, normalized_importance
from cutlass_ops.quantizers.minmax import quantize_minmax

SEARCH_DTYPE = torch.float32
# Relative weight of a channel the calibration never excites (importance is normalized to mean 1).
IMATRIX_FLOOR = 0.05


def _start_pair(Wb: torch.Tensor, bits: int, symmetric: bool, r: float):
    """The grid of ratio r: the block's unclipped (scale, offset) with the scale shrunk by r."""
    qmin, qmax = qrange(bits)
    w_max, w_min = Wb.amax(dim=-1), Wb.amin(dim=-1)
    if symmetric:
        # The smallest scale that clips nothing on either side of the signed grid [qmin, qmax].
        scale = r * torch.maximum(w_max / qmax, w_min / qmin)
        offset = torch.zeros_like(scale)
    else:
        scale = r * (w_max - w_min) / (2 ** bits - 1)
        offset = (w_max + w_min) / 2 - (qmax + qmin) / 2 * scale
    return torch.where(scale > 0, scale, torch.ones_like(scale)), offset


def search_params(Wb: torch.Tensor, bits: int, symmetric: bool, best: BestPerBlock,
                  c: torch.Tensor | None = None, steps: int = 20, min_ratio: float = 0.5,
                  refits: int = 2) -> BestPerBlock:
    """Offer every (ratio, refit) pair of blocks Wb [N, G, B] to ``best``; returns ``best``."""
    qmin, qmax = qrange(bits)
    ratios = torch.linspace(1.0, min_ratio, steps).tolist() if steps > 1 else [1.0]
    for r in ratios:
        scale, offset = _start_pair(Wb, bits, symmetric, r)
        for i in range(refits + 1):
            q = round_to_grid(Wb, scale, offset, qmin, qmax)
            plain = None if best.limit is None else block_error(Wb, q, scale, offset)
            best.offer(scale, offset, block_error(Wb, q, scale, offset, c), plain)
            if i < refits:
                scale, offset = least_squares(Wb, q, scale, offset, symmetric, c)
    return best


def quantize_search(W: torch.Tensor, bits: int, block_size: int, symmetric: bool,
                    c: torch.Tensor | None = None, plain_limit: bool = False, **options):
    """W [N, K] -> (q int32 [N, K], scale f32 [N, G], offset f32 [N, G]) by ``search_params``.

    plain_limit: with weights c, take only pairs no worse than minmax in the unweighted error.
    """
    steps, min_ratio, refits = (options.get(k, d) for k, d in
                                (("steps", 20), ("min_ratio", 0.5), ("refits", 2)))
    if steps < 1 or not 0 < min_ratio <= 1 or refits < 0:
        raise ValueError(f"search options need steps >= 1, 0 < min_ratio <= 1, refits >= 0; got "
                         f"steps={steps}, min_ratio={min_ratio}, refits={refits}")
    qs, scales, offsets = [], [], []
    for rows in row_chunks(*W.shape):
        W_rows = W[rows]
        fallback = quantize_minmax(W_rows, bits, block_size, symmetric)
        Wb = to_blocks(W_rows, block_size, SEARCH_DTYPE)
        cb = weight_blocks(c, block_size, SEARCH_DTYPE)
        q0, scale0, offset0 = fallback
        q0b = q0.reshape(Wb.shape).to(SEARCH_DTYPE)
        limit = block_error(Wb, q0b, scale0, offset0) if plain_limit and cb is not None else None
        best = BestPerBlock(scale0.to(SEARCH_DTYPE), offset0.to(SEARCH_DTYPE),
                            block_error(Wb, q0b, scale0, offset0, cb), limit)
        search_params(Wb, bits, symmetric, best, cb, **options)
        q, scale, offset = finalize(W_rows, block_size, bits, best.scale, best.offset, c, fallback,
                                    plain_limit)
        qs.append(q), scales.append(scale), offsets.append(offset)
    return torch.cat(qs), torch.cat(scales), torch.cat(offsets)


def quantize_mse(W, bits, block_size, symmetric, calibration=None, **options):
    """Unweighted clipping search ("mse")."""
    return quantize_search(W, bits, block_size, symmetric, None, **options)


def weight_balance_importance(W: torch.Tensor, floor: float = IMATRIX_FLOOR) -> torch.Tensor:
    """A data-free estimate of the input channels' importance from W [N, K] alone, c [K].

    In trained networks the inputs with large activations meet small weight columns (the terms
    x_k * w_nk stay balanced across k: LayerNorm gains and outlier channels are compensated by
    the next layer), so E[x_k^2] ~ 1 / mean_n w_nk^2: normalized to mean 1, plus ``floor``.
    """
    col = W.to(torch.float64).pow(2).mean(dim=0)
    tiny = torch.finfo(torch.float64).tiny
    return normalized_importance(torch.where(col > 0, 1.0 / col.clamp_min(tiny), 0.0), floor)


def quantize_mse_balanced(W, bits, block_size, symmetric, floor: float = IMATRIX_FLOOR, **options):
    """Clipping search weighted by ``weight_balance_importance(W)`` ("mse_balanced"), taking only
    pairs that are no worse than minmax in plain weight MSE, block by block."""
    c = weight_balance_importance(W, floor)
    return quantize_search(W, bits, block_size, symmetric, c, plain_limit=True, **options)


def quantize_imatrix(W, bits, block_size, symmetric, calibration=None, floor: float = IMATRIX_FLOOR,
                     **options):
    """Clipping search with per-input-channel importance from the calibration inputs ("imatrix")."""
    c = channel_importance(calibration, floor).to(W.device)
    return quantize_search(W, bits, block_size, symmetric, c, **options)
