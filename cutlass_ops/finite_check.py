"""NaN / Inf checks of per-call epilogue inputs that are really weight-side constants (per output
channel: ``scale_col``, ``bias``, a requant multiplier), done once per tensor and in-place version.

A check costs a host synchronisation, so it runs on a tensor's first use and again only after it
changed in place; a weak reference guards against a freed tensor's id and address being reused.
Not checked: per-row inputs (per-token activation scales, new every call: a check would synchronise
every call) and inputs first seen while a CUDA graph is captured or torch.compile traces (a
synchronisation is not allowed there); such NaN / Inf show up as NaN / Inf in the output.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch

import epilogues
from cutlass_ops.plan_cache import version

__all__ = ["check_finite_once", "check_per_col_inputs", "KEPT"]

KEPT = 4096  # tensors remembered as checked (least recently used first out)
_checked: OrderedDict[tuple, weakref.ref] = OrderedDict()
_lock = threading.Lock()
_per_col: dict[str, tuple[str, ...]] = {}  # epilogue name -> its per_col input names


def check_finite_once(t: torch.Tensor, name: str) -> None:
    """ValueError naming ``name`` if the floating tensor ``t`` holds NaN or Inf (checked once per version;
    a tensor's storage swapped by ``set_`` gets a new version too)."""
    key = (id(t), version(t))
    ref = _checked.get(key)
    if ref is not None and ref() is t:
        return
    if not t.is_floating_point() or torch.compiler.is_compiling() or (
            t.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or Inf values; the kernel would write them into the output")
    with _lock:
        _checked[key] = weakref.ref(t)
        while len(_checked) > KEPT:
            _checked.popitem(last=False)


def check_per_col_inputs(epilogue: str, inputs: dict) -> None:
    """:func:`check_finite_once` on every per-output-channel tensor input of ``epilogue``."""
    names = _per_col.get(epilogue)
    if names is None:
        try:
            spec = epilogues.get(epilogue)
        except (KeyError, ValueError):
            return  # an unknown epilogue: the plan raises the precise error
        names = _per_col[epilogue] = tuple(n for n, kind in spec.inputs if kind == "per_col")
    for n in names:  # the memo lookup inlined: this runs on every int8_gemm call
        t = inputs.get(n)
        if t.__class__ is torch.Tensor:
            try:
                ref = _checked.get((id(t), t._version))
            except RuntimeError:  # an inference tensor
                ref = None
            if ref is None or ref() is not t:
                check_finite_once(t, n)
