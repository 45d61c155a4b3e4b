"""Act-order (GPTQ ``desc_act``): the K permutation of x that a weight stored in group order needs.

:func:`checked_perm` returns ``perm`` as the int32 contiguous copy the kernels read, its range checked
(0 <= perm < K: one host synchronisation) once per perm tensor and in-place version, kept while that
tensor lives (``plan_cache.TensorMemo``).
"""
from __future__ import annotations

import torch

from cutlass_ops.graph_pool import outside_graph_pool
from cutlass_ops.plan_cache import TensorMemo

__all__ = ["checked_perm"]

_converted_perms = TensorMemo(256)  # perm tensor -> its checked int32 copy


def checked_perm(qw, perm: torch.Tensor) -> torch.Tensor:
    """``perm`` (integer [qw.K], values in [0, K)) as a checked int32 contiguous tensor, cached."""
    if (not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.shape[0] != qw.K
            or perm.dtype not in (torch.int32, torch.int64)):
        got = f"{perm.dtype} {tuple(perm.shape)}" if isinstance(perm, torch.Tensor) else type(perm).__name__
        raise ValueError(f"perm must be an int32 or int64 tensor [K={qw.K}], got {got}")
    if torch.compiler.is_compiling():  # traced: index_select checks its indices on the device
        return perm
    perm32 = _converted_perms.get(perm)  # K is perm's own length: the check holds for any weight of that K
    if perm32 is None:
        perm32 = outside_graph_pool(lambda: _converted(perm, qw.K), perm.device)
        _converted_perms.put(perm, perm32)
    return perm32


def _converted(perm: torch.Tensor, K: int) -> torch.Tensor:
    if perm.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("perm is used for the first time inside CUDA graph capture; call once before "
                           "capturing (its range is checked once, with a host synchronisation)")
    if perm.numel():
        lo, hi = (int(v) for v in torch.aminmax(perm))
        if lo < 0 or hi >= K:
            raise ValueError(f"perm values must lie in [0, K={K}), got values from {lo} to {hi}")
    return perm.to(torch.int32, copy=True).contiguous()  # a fresh tensor: 16-byte aligned for the kernel
