"""Statistics of calibration activations X [*, K] (the inputs of the layer whose weight is W [N, K]).

The layer's output error on X is ||X W^T - X Wq^T||^2 = sum_n (w_n - wq_n)^T X^T X (w_n - wq_n),
so H = X^T X / M (M rows) is the metric for GPTQ, and its diagonal, the mean square of each
input channel, is the per-channel importance (llama.cpp's imatrix) for the weighted searches.
"""
from __future__ import annotations

import torch


def _rows(X: torch.Tensor) -> torch.Tensor:
    return X.reshape(-1, X.shape[-1])


def hessian(X: torch.Tensor, chunk_rows: int = 8192) -> torch.Tensor:
    """H = X^T X / M as float64 [K, K], accumulated over row chunks."""
    X2 = _rows(X)
    M, K = X2.shape
    H = torch.zeros(K, K, dtype=torch.float64, device=X2.device)
    for i in range(0, M, chunk_rows):
        x = X2[i:i + chunk_rows].to(torch.float64)
        H.addmm_(x.T, x)
    return H / M


def channel_importance(X: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """Per-input-channel weights c [K] = mean_m x_mk^2 / mean_k(mean_m x_mk^2) + floor (float64).

    Normalized to mean 1 so that ``floor`` is relative: floor > 0 keeps every channel's error
    counting a little, also where the calibration never excites a channel.
    """
    X2 = _rows(X).to(torch.float64)
    return normalized_importance((X2 * X2).mean(dim=0), floor)


def normalized_importance(mean_square: torch.Tensor, floor: float) -> torch.Tensor:
    """mean_square / its mean + floor; all ones where every channel is silent."""
    mean = mean_square.mean()
    c = mean_square / mean if float(mean) > 0 else torch.ones_like(mean_square)
    return c + floor
