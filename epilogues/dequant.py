"""Dequantizing epilogues: int32 accumulator -> float output with per-row x per-column scales.

``scale_row`` [M, 1] is the per-token (activation) scale, ``scale_col`` [1, N] the per-channel
(weight) scale, ``bias`` [1, N] is added after scaling. Each function is both the EVT trace input
(CUTLASS reads its source: assignments and one returned name, every input used once) and the
float64 reference (evaluated on torch tensors).
"""
from __future__ import annotations

from ._ops import maximum, minimum


def dequant(accum, scale_row, scale_col, bias):
    D = accum * scale_row * scale_col + bias
    return D


def dequant_relu(accum, scale_row, scale_col, bias):
    D = maximum(accum * scale_row * scale_col + bias, 0.0)
    return D


def dequant_relu6(accum, scale_row, scale_col, bias):
    D = minimum(maximum(accum * scale_row * scale_col + bias, 0.0), 6.0)
    return D
