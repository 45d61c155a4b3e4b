"""finite_check: weight-side epilogue inputs are checked for NaN / Inf once per tensor version."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops import finite_check


def test_nan_and_inf_raise_naming_the_input():
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = torch.ones(8)
        t[3] = bad
        with pytest.raises(ValueError, match="scale_col holds NaN or Inf"):
            finite_check.check_finite_once(t, "scale_col")


def test_checked_once_then_again_after_an_in_place_change():
    t = torch.ones(16)
    finite_check.check_finite_once(t, "M_scale")
    assert finite_check._checked.get(t) is True  # remembered: the next call does not synchronise
    t[0] = float("nan")  # a new version: checked again
    with pytest.raises(ValueError, match="M_scale"):
        finite_check.check_finite_once(t, "M_scale")


def test_per_col_inputs_of_an_epilogue():
    ok, bad = torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0])
    # scale_row is per row (an activation scale, new every call): not checked; scale_col and bias are
    finite_check.check_per_col_inputs("dequant", {"scale_row": bad, "scale_col": ok, "bias": ok})
    with pytest.raises(ValueError, match="bias holds NaN"):
        finite_check.check_per_col_inputs("dequant", {"scale_row": ok, "scale_col": ok, "bias": bad.clone()})
    finite_check.check_per_col_inputs("no-such-epilogue", {"x": bad})  # the plan names the bad epilogue
