"""NaN / Inf checks of per-call epilogue inputs that are really weight-side constants (per output
channel: ``scale_col``, ``bias``, a requant multiplier), done once per tensor and in-place version.

A check costs a host synchronisation, so it runs on a tensor's first use and again only after it
changed in place (``plan_cache.TensorMemo``). Not checked: per-row inputs (per-token activation scales,
new every call: a check would synchronise every call) and inputs first seen while a CUDA graph is
captured or torch.compile traces (a synchronisation is not allowed there); such NaN / Inf show up as
NaN / Inf in the output.
"""
from __future__ import annotations

import torch

import epilogues
from cutlass_ops.plan_cache import TensorMemo

__all__ = ["all_finite", "check_finite_once", "check_per_col_inputs", "KEPT", "HOST_CHECK_MAX"]

KEPT = 4096  # tensors remembered as checked
_checked = TensorMemo(KEPT)
_per_col: dict[str, tuple[str, ...]] = {}  # epilogue name -> its per_col input names


HOST_CHECK_MAX = 1 << 20  # elements: smaller CUDA tensors are checked in a host copy


# floating dtype -> (the integer dtype of its bits, its exponent mask): a value is NaN or Inf iff all its
# exponent bits are set
_EXPONENT = {torch.float16: (torch.int16, 0x7C00), torch.bfloat16: (torch.int16, 0x7F80),
             torch.float32: (torch.int32, 0x7F800000), torch.float64: (torch.int64, 0x7FF0000000000000)}


def all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN / Inf (a host synchronisation). A small contiguous CUDA tensor is copied to
    the host and its exponent bits checked with numpy: in a fresh process the first launch of torch's isfinite
    / all kernels costs ~10-30 ms each (CUDA lazy module loading) and torch's first CPU reduction ~30 ms on a
    16-core host (measured on an H100 machine), a copy of up to 4 MiB and a numpy pass well under one."""
    exponent = _EXPONENT.get(t.dtype)
    if t.is_cuda and t.numel() <= HOST_CHECK_MAX and exponent is not None and t.is_contiguous():
        bits_dtype, mask = exponent
        bits = t.cpu().view(bits_dtype).numpy()
        return not bool(((bits & mask) == mask).any())
    return bool(torch.isfinite(t).all())


def check_finite_once(t: torch.Tensor, name: str) -> bool:
    """ValueError naming ``name`` if the floating tensor ``t`` holds NaN or Inf (checked once per version;
    a tensor's storage swapped by ``set_`` gets a new version too). True when ``t`` is known finite at its
    version; False when the check was skipped (not floating, or while compiling or capturing)."""
    if _checked.get(t) is not None:
        return True
    if not t.is_floating_point() or torch.compiler.is_compiling() or (
            t.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    if t.numel() and not all_finite(t):
        raise ValueError(f"{name} holds NaN or Inf values; the kernel would write them into the output")
    _checked.put(t, True)
    return True


def check_per_col_inputs(epilogue: str, inputs: dict) -> list[torch.Tensor]:
    """:func:`check_finite_once` on every per-output-channel tensor input of ``epilogue``; the inputs
    now known to be finite at their current version (the C++ per-call path remembers them)."""
    names = _per_col.get(epilogue)
    if names is None:
        try:
            spec = epilogues.get(epilogue)
        except (KeyError, ValueError):
            return []  # an unknown epilogue: the plan raises the precise error
        names = _per_col[epilogue] = tuple(n for n, kind in spec.inputs if kind == "per_col")
    checked = []
    for n in names:
        t = inputs.get(n)
        if t.__class__ is torch.Tensor and check_finite_once(t, n):
            checked.append(t)
    return checked
