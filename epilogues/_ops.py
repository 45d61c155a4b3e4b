"""Elementwise helpers named as the EVT frontend knows them (``maximum``, ``minimum``).

The EVT tracer reads an epilogue's *source* and maps these call names to CUTLASS functional ops;
the same names must evaluate on torch tensors when the function serves as the float64 reference.
"""
from __future__ import annotations

import torch


def maximum(x: torch.Tensor, y: float | torch.Tensor) -> torch.Tensor:
    """Elementwise max of a tensor and a scalar or tensor (EVT: ``cutlass::maximum``)."""
    if isinstance(y, torch.Tensor):
        return torch.maximum(x, y)
    return torch.clamp_min(x, y)


def minimum(x: torch.Tensor, y: float | torch.Tensor) -> torch.Tensor:
    """Elementwise min of a tensor and a scalar or tensor (EVT: ``cutlass::minimum``)."""
    if isinstance(y, torch.Tensor):
        return torch.minimum(x, y)
    return torch.clamp_max(x, y)
