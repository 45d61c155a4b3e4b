"""Every family's cases, built once into the registry."""
from __future__ import annotations

from sanitize.conv_cases import _build_conv_cases
from sanitize.converter_cases import _build_converter_cases
from sanitize.quantizer_cases import _build_quant_token_cases, _build_quantize_weight_cases
from sanitize.registry import CASES, Case
from sanitize.scheme2_cases import _build_scheme2_helper_cases
from sanitize.w8a8_cases import _build_block_scaled_cases, _build_pad_rows_cases, _build_w8a8_cases
from sanitize.weight_only_cases import _build_weight_only_cases


def build_cases() -> list[Case]:
    if not CASES:
        _build_weight_only_cases()
        _build_converter_cases()
        _build_conv_cases()
        _build_scheme2_helper_cases()
        _build_w8a8_cases()
        _build_block_scaled_cases()
        _build_quantize_weight_cases()
        _build_quant_token_cases()
        _build_pad_rows_cases()
    return CASES
