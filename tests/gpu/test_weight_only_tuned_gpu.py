"""The tuned weight-only dispatch on a GPU: entries for one activation type (``"dtype"`` in this GPU's tuning file,
cutlass_ops/weight_only/tuned.py) are what the default dispatch takes for that type, the type-less ones for the
other, and the variant they name computes the float64 reference's result. Skips where this GPU's file has none."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from custom_kernels.device import capability
from cutlass_ops.weight_only import tuned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_weight_only_gpu import _check, _inputs, _weight  # noqa: E402  (shared helpers)

pytestmark = pytest.mark.gpu


def _typed_entries(limit: int = 4):
    if not torch.cuda.is_available():
        return []
    table = tuned.table(torch.cuda.get_device_name(0))
    typed = [e for e in (table.entries if table is not None else ()) if e.dtype is not None]
    return sorted(typed, key=lambda e: e.N * e.K)[:limit]  # the smallest weights: quick


@pytest.mark.parametrize("entry", _typed_entries() or [pytest.param(None, marks=pytest.mark.skip(
    reason="this GPU's tuning file has no entries for one activation type"))],
    ids=lambda e: f"{e.dtype}-N{e.N}-K{e.K}-W{e.bits}-M{e.M_lo}" if e is not None else "none")
def test_typed_entry_is_the_dispatch_for_its_type(entry):
    dtype = tuned.DTYPE_NAMES[entry.dtype]
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    cc = capability(0)
    qw = _weight(entry.N, entry.K, entry.bits, entry.block_size, False)
    M = entry.M_lo
    assert tuned.tuned_for(qw, M, dtype, 0, cc) == (entry.strategy, entry.config)
    untyped = tuned.table(torch.cuda.get_device_name(0)).lookup(M, entry.N, entry.K, entry.bits, entry.block_size)
    expected_other = (untyped.strategy, untyped.config) if untyped is not None else None
    assert tuned.tuned_for(qw, M, other, 0, cc) == expected_other
    x, bias = _inputs(M, entry.K, entry.N, dtype, seed=41)
    _check(x, qw, bias, 0, None)  # the default dispatch: the typed entry's variant
