"""The one per-weight cache: everything derived from a ``QuantizedWeight`` once, for every family.

A weight's entry is found by the identity of its tensors (``qweight``, ``scale``, ``offset``) and
trusted only while each is alive, at the same address and at the same in-place ``_version``: a
replaced tensor or an in-place change (``qw.scale.mul_(2)``) rebuilds everything derived from it.
Entries hold only weak references to the weight's tensors, so freeing a weight frees its plans
(and the GPU tensors they derived, such as packed scale/offset words). Nothing is stored on the
``QuantizedWeight`` itself: it pickles and deep-copies as plain data.

Bounded: at most :data:`MAX_WEIGHTS` weights and :data:`MAX_PLANS_PER_WEIGHT` plans per weight,
oldest weight first out, least recently used plan first out (a server that sees many M keeps a bounded set of plans).

:class:`TensorMemo` is the same idea for one tensor that is not a weight (an act-order permutation, an
epilogue input checked for NaN): a value kept while the tensor lives and is unchanged in place.
:func:`float32_copy` keeps the float32 copy of a layer's bias that way.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, TypeVar

import torch

from cutlass_ops.graph_pool import outside_graph_pool

__all__ = ["MAX_WEIGHTS", "MAX_PLANS_PER_WEIGHT", "WeightEntry", "entry", "plan", "clear", "stats", "version",
           "TensorMemo", "float32_copy"]

MAX_WEIGHTS = 4096
MAX_PLANS_PER_WEIGHT = 64

T = TypeVar("T")


class WeightEntry:
    """What the runtime derived from one weight: its plans (LRU) and the fields last validated."""

    __slots__ = ("signature", "refs", "plans", "validated", "__weakref__")

    def __init__(self, signature: tuple, refs: tuple):
        self.signature = signature
        self.refs = refs
        self.plans: OrderedDict[Any, Any] = OrderedDict()
        self.validated: tuple | None = None  # the field values last checked by QuantizedWeight.validate


_lock = threading.RLock()  # reentrant: a weakref callback may run inside a locked section
_entries: OrderedDict[tuple, WeightEntry] = OrderedDict()


def _drop(key: tuple) -> Callable[[Any], None]:
    def callback(_ref) -> None:
        lock = _lock
        if lock is None:  # interpreter shutdown: the module's globals are already gone
            return
        with lock:
            _entries.pop(key, None)
    return callback


def version(t) -> int:
    """``t._version``, or -1 for an inference tensor (torch.inference_mode): it has no version counter,
    and it cannot be changed in place outside inference mode."""
    return -1 if t.is_inference() else t._version


def entry(qw) -> WeightEntry:
    """The cache entry of ``qw`` (a fresh one if its tensors changed since the last call)."""
    q, s, o = qw.qweight, qw.scale, qw.offset
    # An id names the same live tensor for as long as the entry exists: the weak references'
    # callbacks drop the entry as the tensor is freed, before its id can be reused.
    key = (id(q), id(s), id(o))
    try:
        sig = (q.data_ptr(), s.data_ptr(), o.data_ptr(), q._version, s._version, o._version)
    except RuntimeError:  # inference tensors (made under torch.inference_mode) have no version counter
        sig = (q.data_ptr(), s.data_ptr(), o.data_ptr(), version(q), version(s), version(o))
    found = _entries.get(key)
    if found is not None and found.signature == sig:
        return found
    with _lock:
        callback = _drop(key)
        found = WeightEntry(sig, (weakref.ref(q, callback), weakref.ref(s, callback), weakref.ref(o, callback)))
        _entries[key] = found
        _entries.move_to_end(key)
        while len(_entries) > MAX_WEIGHTS:
            _entries.popitem(last=False)
    return found


def plan(qw, key: Any, build: Callable[[], T]) -> T:
    """The plan of ``qw`` under ``key``, built by ``build()`` on a miss (and kept, LRU-bounded; during a
    cudagraph-trees warm-up built outside the graph's pool: :mod:`cutlass_ops.graph_pool`)."""
    plans = entry(qw).plans
    found = plans.get(key)
    if found is not None:
        try:
            plans.move_to_end(key)  # one C call under the GIL: no lock needed for the LRU order
        except KeyError:  # evicted by another thread meanwhile: it stays usable for this call
            pass
        return found
    built = outside_graph_pool(build, getattr(qw.qweight, "device", None))
    with _lock:
        plans[key] = built
        while len(plans) > MAX_PLANS_PER_WEIGHT:
            plans.popitem(last=False)
    return built


class TensorMemo:
    """A value derived from one tensor (a check passed, a converted copy), kept while that tensor is alive
    and unchanged in place: keyed by its id and version, the entry dropped when the tensor is freed (so a
    new tensor with a freed one's id never sees it), at most ``kept`` entries, least recently stored out."""

    def __init__(self, kept: int):
        self.kept = kept
        self._values: OrderedDict[tuple, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, t) -> Any:
        """The value stored for ``t`` at its current version, or None."""
        try:  # per-call path: t._version directly (version() adds a call)
            found = self._values.get((id(t), t._version))
        except RuntimeError:  # an inference tensor
            found = self._values.get((id(t), -1))
        return found[1] if found is not None and found[0]() is t else None

    def put(self, t, value) -> None:
        key = (id(t), version(t))
        values = self._values

        def drop(_ref) -> None:
            values.pop(key, None)
        with self._lock:
            values[key] = (weakref.ref(t, drop), value)
            while len(values) > self.kept:
                values.popitem(last=False)

    def __len__(self) -> int:
        return len(self._values)


_float32_copies = TensorMemo(MAX_WEIGHTS)


def float32_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous float32 tensor: ``t`` itself when it is one, else its converted copy, kept while
    ``t`` lives unchanged in place (an fp16 / bf16 layer's bias feeds float32 epilogues: no conversion kernel
    per eager call). Made afresh and not kept for a tensor that needs its gradient (the copy must stay in
    the autograd graph) and for an inference tensor (no version counter to see an in-place change). While
    a CUDA graph is captured the conversion is captured too, neither kept nor taken from the kept copies:
    the graph then reads ``t`` itself at each replay (an in-place change of ``t`` after the capture, or a
    kept copy dropped from the bounded memo, would otherwise leave it reading a stale or freed copy)."""
    if t.dtype == torch.float32 and t.is_contiguous():
        return t
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return t.to(torch.float32).contiguous()
    found = _float32_copies.get(t)
    if found is not None and not t.requires_grad:
        return found
    if t.requires_grad or t.is_inference():
        return t.to(torch.float32).contiguous()
    copy = outside_graph_pool(lambda: t.to(torch.float32).contiguous(), t.device)
    _float32_copies.put(t, copy)
    return copy


def clear() -> None:
    """Forget every weight's plans."""
    with _lock:
        _entries.clear()


def stats() -> dict[str, int]:
    """{"weights": cached weights, "plans": plans over all of them} (the soak test reads this)."""
    with _lock:
        return {"weights": len(_entries), "plans": sum(len(e.plans) for e in _entries.values())}
