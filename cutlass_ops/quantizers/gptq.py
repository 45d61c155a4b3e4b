"""GPTQ (Frantar et al., 2023): quantize W column by column along K with Hessian error feedback.

With H = X^T X / M from the calibration inputs X (plus ``damp`` * mean(diag H) on the diagonal)
and U the upper Cholesky factor of H^-1, column k is rounded to its group's grid and the
rounding error e = (w_k - deq_k) / U_kk is spread over the columns not yet quantized:
W[:, j] -= e * U[k, j] for j > k. Columns are processed in lazy batches of 128 (the same
arithmetic as the column loop, with the update of the later columns done as one matmul).

The (scale, offset) of every block is fixed before the loop from the original W ("static
groups"), by the importance-weighted clipping search ("imatrix", weights = diag H) or, with
params="minmax", by minmax. So with act_order=True, which processes the columns in order of
decreasing diag H (the most active inputs first, while the most freedom is left to compensate),
the groups are still the natural contiguous K blocks and the result is in the natural K order,
as the kernels need; only the order of the error feedback is permuted.

Because the output error ||X (W - Wq)^T||^2 = sum_n e_n^T H e_n is a sum over rows, each row
finally keeps whichever of the GPTQ row and the plain rounding (same scale and offset) has the
lower error in that metric, so GPTQ is never worse than rounding on the calibration inputs.
Computed in float64 on W's device.
"""
from __future__ import annotations

import torch

from cutlass_ops.quantizers._blocks import qrange
from cutlass_ops.quantizers.calibration import hessian, normalized_importance
from cutlass_ops.quantizers.minmax import quantize_minmax
from cutlass_ops.quantizers.mse import IMATRIX_FLOOR, quantize_search

LAZY_BATCH = 128


def inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """U upper triangular with U^T U = (H + damp * mean(diag H) * I)^-1; dead inputs get H_kk = 1."""
    H = H.clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    mean_diag = torch.diagonal(H).mean()
    H.diagonal().add_(damp * mean_diag)
    L = torch.linalg.cholesky(H)
    H_inv = torch.cholesky_inverse(L)
    return torch.linalg.cholesky(H_inv, upper=True)


def gptq_loop(W: torch.Tensor, U: torch.Tensor, scale_k: torch.Tensor, offset_k: torch.Tensor,
              qmin: int, qmax: int) -> torch.Tensor:
    """Quantize W [N, K] in its column order with per-column (scale, offset) [N, K]; returns q."""
    W = W.clone()
    N, K = W.shape
    Q = torch.empty_like(W)
    for i1 in range(0, K, LAZY_BATCH):
        i2 = min(i1 + LAZY_BATCH, K)
        W1, U1 = W[:, i1:i2], U[i1:i2, i1:i2]
        E1 = torch.empty_like(W1)
        for i in range(i2 - i1):
            s, o = scale_k[:, i1 + i], offset_k[:, i1 + i]
            w = W1[:, i]
            q = torch.round((w - o) / s).clamp_(qmin, qmax)
            Q[:, i1 + i] = q
            e = (w - (q * s + o)) / U1[i, i]
            W1[:, i:] -= e[:, None] * U1[i, i:][None, :]
            E1[:, i] = e
        W[:, i2:] -= E1 @ U[i1:i2, i2:]
    return Q


def quantize_gptq(W: torch.Tensor, bits: int, block_size: int, symmetric: bool, calibration=None,
                  act_order: bool = False, damp: float = 0.01, params: str = "imatrix"):
    """W [N, K] -> (q int32 [N, K], scale f32 [N, G], offset f32 [N, G]) in natural K order."""
    if not isinstance(act_order, bool):
        raise TypeError(f"act_order must be a bool, got {type(act_order).__name__}")
    if params not in ("imatrix", "minmax"):
        raise ValueError(f"params must be 'imatrix' or 'minmax', got {params!r}")
    if not damp >= 0:
        raise ValueError(f"damp must be >= 0, got {damp!r}")
    qmin, qmax = qrange(bits)
    N, K = W.shape
    H = hessian(calibration).to(W.device)
    diag = torch.diagonal(H)
    if params == "minmax":
        q_rtn, scale, offset = quantize_minmax(W, bits, block_size, symmetric)
    else:
        c = normalized_importance(diag, IMATRIX_FLOOR)
        q_rtn, scale, offset = quantize_search(W, bits, block_size, symmetric, c)
    scale_k = scale.double().repeat_interleave(block_size, dim=1)
    offset_k = offset.double().repeat_interleave(block_size, dim=1)
    W64 = W.to(torch.float64)
    perm = torch.argsort(diag, descending=True, stable=True) if act_order else \
        torch.arange(K, device=W.device)
    U = inverse_cholesky(H[perm][:, perm], damp)
    Q = torch.empty_like(W64)
    Q[:, perm] = gptq_loop(W64[:, perm], U, scale_k[:, perm], offset_k[:, perm], qmin, qmax)
    # Keep, per row, whichever of GPTQ and plain rounding has the lower output error e^T H e.
    errors = []
    for q in (Q, q_rtn.to(torch.float64)):
        E = W64 - (q * scale_k + offset_k)
        errors.append(((E @ H) * E).sum(dim=1))
    keep_gptq = errors[0] <= errors[1]
    Q = torch.where(keep_gptq[:, None], Q, q_rtn.to(torch.float64))
    return Q.to(torch.int32), scale, offset
