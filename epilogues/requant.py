"""Requantizing epilogues: int32 accumulator -> int8 output, O_q = clamp(round(M_n * (accum + b_n))).

``multiplier`` [1, N] is the per-channel requantization multiplier M_n and ``fused_bias`` [1, N]
the bias already expressed in accumulator units. The functions compute the float value; the
EVT store of an int8 ``D`` converts it with round-half-to-even and saturation to [-128, 127]
(CUTLASS's float -> int32 -> int8 array converter: ``cvt.rni`` then ``cvt.pack.sat.s8.s32``), so
``requant`` needs no explicit round or clamp. ``requant_clamp`` narrows the range with runtime
scalars ``lo``/``hi``; clamping before the rounding store equals clamping after it because
``lo``/``hi`` are integers and rounding is monotonic.
"""
from __future__ import annotations

from ._ops import maximum, minimum


def requant(accum, multiplier, fused_bias):
    D = multiplier * (accum + fused_bias)
    return D


def requant_clamp(accum, multiplier, fused_bias, lo, hi):
    D = minimum(maximum(multiplier * (accum + fused_bias), lo), hi)
    return D
