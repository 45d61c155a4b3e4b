"""Shared block helpers: the integer grid, rounding to it, per-block errors, least-squares refits.

A weight W [N, K] is viewed as blocks Wb [N, G, B] (B = block_size, G = K // B); every block has
its own (scale, offset) [N, G] and is reconstructed as q * scale + offset with q on the grid
[qmin, qmax] ([-8, 7] for int4, [-128, 127] for int8). Per-input-channel error weights c [K] are
viewed as [G, B] and broadcast over N.
"""
from __future__ import annotations

import torch


def qrange(bits: int) -> tuple[int, int]:
    """The signed integer grid [qmin, qmax] of a ``bits``-bit weight."""
    return (-128, 127) if bits == 8 else (-8, 7)


def to_blocks(W: torch.Tensor, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] -> Wb [N, K // block_size, block_size] as ``dtype``."""
    N, K = W.shape
    return W.to(dtype).reshape(N, K // block_size, block_size)


def weight_blocks(c: torch.Tensor | None, block_size: int, dtype: torch.dtype) -> torch.Tensor | None:
    """Per-channel error weights c [K] -> [G, B] (None stays None: unweighted)."""
    return None if c is None else c.to(dtype).reshape(-1, block_size)


def round_to_grid(Wb: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, qmin: int,
                  qmax: int) -> torch.Tensor:
    """q = clamp(round((w - offset) / scale), qmin, qmax): the nearest grid point, as Wb's dtype."""
    s = scale.to(Wb.dtype)[..., None]
    return torch.round((Wb - offset.to(Wb.dtype)[..., None]) / s).clamp_(qmin, qmax)


def block_error(Wb: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                c: torch.Tensor | None = None) -> torch.Tensor:
    """Per-block squared error sum_j c_j (w_j - q_j * scale - offset)^2, [N, G]."""
    e = Wb - (q * scale.to(Wb.dtype)[..., None] + offset.to(Wb.dtype)[..., None])
    e = e * e
    if c is not None:
        e = e * c
    return e.sum(dim=-1)


def least_squares(Wb: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                  symmetric: bool, c: torch.Tensor | None = None):
    """(scale, offset) minimizing sum_j c_j (w_j - q_j * scale - offset)^2 for fixed q.

    Symmetric: offset = 0 and scale = sum c q w / sum c q^2. Blocks where the fit is degenerate
    (all q equal, all c zero) or gives scale <= 0 keep the given (scale, offset).
    """
    cq = q if c is None else c * q
    S_qq = (cq * q).sum(-1)
    S_qw = (cq * Wb).sum(-1)
    if symmetric:
        new_scale = S_qw / S_qq
        new_offset = torch.zeros_like(new_scale)
    else:
        S_c = torch.full_like(S_qq, Wb.shape[-1]) if c is None else c.sum(-1).expand_as(S_qq)
        S_q = cq.sum(-1)
        S_w = (Wb if c is None else c * Wb).sum(-1)
        det = S_c * S_qq - S_q * S_q
        new_scale = (S_c * S_qw - S_q * S_w) / det
        new_offset = (S_qq * S_w - S_q * S_qw) / det
    ok = torch.isfinite(new_scale) & torch.isfinite(new_offset) & (new_scale > 0)
    return (torch.where(ok, new_scale, scale.to(new_scale.dtype)),
            torch.where(ok, new_offset, offset.to(new_offset.dtype)))


def as_stored(scale: torch.Tensor, offset: torch.Tensor):
    """Round (scale, offset) to the stored float32; a scale that underflows to 0 becomes 1."""
    scale = scale.to(torch.float32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, offset.to(torch.float32)


class BestPerBlock:
    """Keeps, per block, the (scale, offset) with the lowest error seen so far (ties keep the first).

    With ``limit`` [N, G] (an unweighted error bound), only pairs whose unweighted error is within
    it are taken: the best weighted error among those no worse than the start in plain MSE.
    """

    def __init__(self, scale: torch.Tensor, offset: torch.Tensor, error: torch.Tensor,
                 limit: torch.Tensor | None = None):
        self.scale, self.offset, self.error = scale.clone(), offset.clone(), error.clone()
        self.limit = limit

    def offer(self, scale: torch.Tensor, offset: torch.Tensor, error: torch.Tensor,
              plain_error: torch.Tensor | None = None) -> None:
        better = error < self.error
        if self.limit is not None:
            better &= plain_error <= self.limit
        self.scale = torch.where(better, scale.to(self.scale.dtype), self.scale)
        self.offset = torch.where(better, offset.to(self.offset.dtype), self.offset)
        self.error = torch.where(better, error, self.error)


def finalize(W: torch.Tensor, block_size: int, bits: int, scale: torch.Tensor, offset: torch.Tensor,
             c: torch.Tensor | None = None, fallback=None, plain_limit: bool = False):
    """q from the stored float32 (scale, offset), computed in float64 as "minmax" does.

    ``fallback`` = (q, scale, offset) of another quantization (e.g. minmax): each block keeps
    whichever of the two has the lower float64 error (ties keep the fallback), so the result is
    never worse than the fallback, block by block; with ``plain_limit`` also never worse in the
    unweighted error. Returns (q int32 [N, K], scale f32, offset f32).
    """
    qmin, qmax = qrange(bits)
    N, K = W.shape
    Wb = to_blocks(W, block_size, torch.float64)
    scale, offset = as_stored(scale, offset)
    q = round_to_grid(Wb, scale.double(), offset.double(), qmin, qmax)
    if fallback is not None:
        c64 = weight_blocks(c, block_size, torch.float64)
        q0, scale0, offset0 = fallback
        q0 = q0.reshape(Wb.shape).to(torch.float64)
        better = (block_error(Wb, q, scale.double(), offset.double(), c64)
                  < block_error(Wb, q0, scale0.double(), offset0.double(), c64))
        if plain_limit and c is not None:
            better &= (block_error(Wb, q, scale.double(), offset.double())
                       <= block_error(Wb, q0, scale0.double(), offset0.double()))
        q = torch.where(better[..., None], q, q0)
        scale = torch.where(better, scale, scale0)
        offset = torch.where(better, offset, offset0)
    return q.to(torch.int32).reshape(N, K), scale, offset


def row_chunks(N: int, K: int, max_elements: int = 1 << 24):
    """Slices of rows with at most ``max_elements`` weights each (bounds the search's temporaries)."""
    rows = max(1, max_elements // max(K, 1))
    return [slice(i, min(i + rows, N)) for i in range(0, N, rows)]
