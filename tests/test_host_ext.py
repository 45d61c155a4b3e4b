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
    assert ext.run(plan, A, B, 0, None, inputs, 0, True) is None  # no launch function, no state: Python's turn
    assert ext.state_count(plan) == 0


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
