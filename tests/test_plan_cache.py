"""plan_cache: one entry per weight, rebuilt when a tensor is replaced or changed in place; weights made
under torch.inference_mode (no version counter) work too."""
from __future__ import annotations

import torch

from cutlass_ops import plan_cache, quantize_weight


def test_in_place_change_rebuilds_and_inference_tensors_work():
    qw = quantize_weight(torch.randn(16, 64), bits=4, block_size=32)
    built = []
    first = plan_cache.plan(qw, "k", lambda: built.append(1) or object())
    assert plan_cache.plan(qw, "k", lambda: built.append(1) or object()) is first and len(built) == 1
    qw.scale.mul_(1.0)  # in place: a new version, the entry starts over
    assert plan_cache.plan(qw, "k", object) is not first
    with torch.inference_mode():
        qi = quantize_weight(torch.randn(16, 64), bits=4, block_size=32)
    assert qi.qweight.is_inference() and plan_cache.version(qi.scale) == -1
    made = plan_cache.plan(qi, "k", object)
    assert plan_cache.plan(qi, "k", object) is made
