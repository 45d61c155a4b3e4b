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


def test_tensor_memo_follows_version_and_lifetime():
    memo = plan_cache.TensorMemo(kept=2)
    t = torch.ones(4)
    memo.put(t, "checked")
    assert memo.get(t) == "checked"
    t.add_(1)  # in place: a new version, not remembered
    assert memo.get(t) is None
    memo.put(t, "again")
    del t  # freed: its entries go with it
    assert len(memo) == 0
    a, b, c = torch.ones(1), torch.ones(1), torch.ones(1)
    for x in (a, b, c):
        memo.put(x, 1)
    assert len(memo) == 2 and memo.get(a) is None  # bounded, oldest out
