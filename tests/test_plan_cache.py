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


def test_float32_copy_is_kept_while_the_tensor_is_unchanged():
    bias32 = torch.randn(7)
    assert plan_cache.float32_copy(bias32) is bias32  # already float32 and contiguous: no copy
    bias = torch.randn(7).half()
    first = plan_cache.float32_copy(bias)
    assert first.dtype == torch.float32 and first.is_contiguous() and torch.equal(first, bias.float())
    assert plan_cache.float32_copy(bias) is first  # kept: no conversion on the next call
    bias.mul_(2)  # an in-place change bumps the version: a fresh copy with the new values
    second = plan_cache.float32_copy(bias)
    assert second is not first and torch.equal(second, bias.float())
    strided = torch.randn(14, dtype=torch.float32)[::2]
    assert plan_cache.float32_copy(strided).is_contiguous()


def test_float32_copy_keeps_gradients_and_skips_inference_tensors():
    bias = torch.randn(5, dtype=torch.float64)
    plan_cache.float32_copy(bias)  # kept while bias needs no gradient
    bias.requires_grad_(True)  # (no version bump): the kept copy must not be handed out now
    copy = plan_cache.float32_copy(bias)
    assert copy.grad_fn is not None
    copy.sum().backward()
    assert torch.equal(bias.grad, torch.ones(5, dtype=torch.float64))
    with torch.inference_mode():
        frozen = torch.randn(5).half()
        a = plan_cache.float32_copy(frozen)
        frozen.add_(1)  # an inference tensor has no version counter: nothing may be kept for it
        assert torch.equal(plan_cache.float32_copy(frozen), frozen.float()) and not torch.equal(a, frozen.float())
