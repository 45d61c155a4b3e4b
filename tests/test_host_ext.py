"""The C++ launch path builds on a machine without a GPU, and hands back every call it was not
told about (None: the caller then takes the Python path)."""
from __future__ import annotations

import pytest
import torch

from custom_kernels import host_ext

pytestmark = pytest.mark.slow  # compiles a torch extension (tens of seconds)


@pytest.fixture(scope="module")
def ext():
    return host_ext._build_and_load()  # the module, without the GPU-only launch-function setup


def test_unregistered_shape_goes_back_to_python(ext):
    plan = ext.register_plan(0, 1, -1, 3, False, 0b1011, 8, torch.empty(0, dtype=torch.float16),
                             [("scale_row", 0, 4, True), ("scale_col", 1, 5, True), ("bias", 1, 6, False)])
    A = torch.zeros(16, 64, dtype=torch.int8)
    B = torch.zeros(32, 64, dtype=torch.int8)
    inputs = dict(scale_row=torch.ones(16), scale_col=torch.ones(32), bias=None)
    assert ext.run(plan, A, B, 0, None, inputs, 0, True, False) is None  # no launch function, no state: Python's
    assert ext.state_count(plan) == 0


def test_padded_copies_are_held_weakly_and_bounded(ext):
    """register_padded remembers Python's padded copy of a weight-side tensor (by TensorImpl and N_pad, at its
    version) without keeping the copy alive; an unaligned N without a registered copy goes back to Python;
    register_unpad refuses a load width unpad_rows.cu has no build of."""
    before = ext.padded_count()
    B, B_pad = torch.zeros(1000, 64, dtype=torch.int8), torch.zeros(1008, 64, dtype=torch.int8)
    ext.register_padded(B, 1008, B_pad)
    ext.register_padded(B, 1008, B_pad)  # again: the same entry
    assert ext.padded_count() == before + 1
    plan = ext.register_plan(0, 1, -1, 2, False, 0b111, 16, torch.empty(0, dtype=torch.int8),
                             [("multiplier", 1, 3, True), ("fused_bias", 1, 4, False)])
    A = torch.zeros(64, 64, dtype=torch.int8)
    C = torch.zeros(1000, 64, dtype=torch.int8)  # no copy registered
    for weight in (B, C):
        assert ext.run(plan, A, weight, 0, None, dict(multiplier=torch.ones(1000)), 0, False, True) is None
    with pytest.raises(RuntimeError, match="bad launch parameters"):
        ext.register_unpad(0, 3, 1, 528, True)
    ext.register_padded(B, 1008, torch.zeros(8))
    for _ in range(4100):  # past the bound the table starts over
        ext.register_padded(torch.zeros(1), 16, torch.zeros(16))
    assert ext.padded_count() <= 4096


def test_build_is_cached(ext):
    first = host_ext.build()
    assert first == host_ext.build() and any(first.glob("*.so"))


def test_finite_marks_are_bounded(ext):
    """mark_finite remembers checked per-column inputs (by TensorImpl, version), at most 4096 of them."""
    before = ext.finite_count()
    kept = [torch.ones(8) for _ in range(3)]
    ext.mark_finite(kept)
    assert ext.finite_count() == before + 3
    ext.mark_finite(kept)  # the same tensors again: no new entries
    assert ext.finite_count() == before + 3
    ext.mark_finite([torch.ones(1) for _ in range(5000)])
    assert ext.finite_count() <= 4096


def _dequant_plan(ext, dtype=torch.float16) -> int:
    """A plan laid out as the dequant epilogues' (A, B, D, scale_row, scale_col, optional bias)."""
    return ext.register_plan(0, 1, -1, 3, False, 0b1011, 8, torch.empty(0, dtype=dtype),
                             [("scale_row", 0, 4, True), ("scale_col", 1, 5, True), ("bias", 1, 6, False)])


def test_channel_path_hands_back_what_it_was_not_told_about(ext):
    """run_channel (QuantLinear w8a8_channel in one call) returns None, before any launch, without a
    registered quant_token launch and GEMM plan, for CPU tensors, and with no launch function set."""
    x = torch.randn(3, 64, dtype=torch.float16)
    B = torch.zeros(32, 64, dtype=torch.int8)
    scale = torch.ones(32, 1)
    for bias in (None, torch.zeros(32)):
        assert ext.run_channel(x, B, scale, bias, 0, 0, True) is None
    before = ext.channel_count()
    ext.register_quant_token(0, torch.empty(0, dtype=torch.float16), 64, 1, 256, 8, 1, 1056)
    assert ext.register_channel(0, torch.empty(0, dtype=torch.float16), 0, _dequant_plan(ext))
    assert ext.channel_count() == before + 2
    assert ext.run_channel(x, B, scale, None, 0, 0, True) is None  # CPU x (and no launch function: never launched)


def test_channel_path_takes_only_dequant_plans(ext):
    """register_channel refuses a plan whose inputs are not (scale_row, scale_col, optional bias) or whose
    output is not x's dtype; register_quant_token refuses launch parameters that cannot be right."""
    f16 = torch.empty(0, dtype=torch.float16)
    requant = ext.register_plan(0, 1, -1, 2, False, 0b111, 16, torch.empty(0, dtype=torch.int8),
                                [("multiplier", 1, 3, True), ("fused_bias", 1, 4, False)])
    assert not ext.register_channel(0, f16, 0, requant)
    assert not ext.register_channel(0, torch.empty(0, dtype=torch.bfloat16), 0, _dequant_plan(ext))
    with pytest.raises(RuntimeError, match="bad launch parameters"):
        ext.register_quant_token(0, f16, 64, 0, 256, 8, 1, 1056)  # a null CUfunction
    with pytest.raises(RuntimeError, match="float16, bfloat16 or float32"):
        ext.register_quant_token(0, torch.empty(0, dtype=torch.int8), 64, 1, 256, 8, 1, 1056)
