"""A plan's C++ per-call path (``custom_kernels/host/int8_gemm_launch.cpp``).

The Python path (``Int8Gemm._arguments`` + ``GemmKernel.launch``, :mod:`.plan`) stays the reference: a call the
C++ side cannot take as the plain case comes back as None and goes through Python, which raises the
precise error or prepares the problem shape; once Python has prepared and verified a shape's
Params (``_ShapeState.params_address``), they are registered here and later calls of that shape
skip Python's checks and bookkeeping (measured in ``scripts/profile_host.py``).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from custom_kernels import host_ext
from custom_kernels.device import check, current_device, raw_stream, retry_in_context

from .kernel import GemmKernel

log = logging.getLogger(__name__)

_KIND = {"per_row": 0, "per_col": 1, "matrix": 2}


class FastPath:
    """One plan registered with the extension; ``run`` returns D, or None for the Python path."""

    def __init__(self, ext, plan_id: int, kernel: GemmKernel):
        self._ext = ext
        self._id = plan_id
        self._kernel = kernel
        self._registered: set[tuple] = set()

    @classmethod
    def create(cls, kernel: GemmKernel, slots, out_dtype: torch.dtype, align_D: int,
               has_scalars: bool) -> "FastPath | None":
        """The plan's C++ path, or None (extension unavailable, or an epilogue with scalars)."""
        if has_scalars:  # scalars key the Params; those epilogues keep the Python path
            return None
        ext = host_ext.load()
        if ext is None:
            return None
        inputs = [(name, _KIND[kind], slot, required) for name, kind, slot, required in slots.inputs]
        plan_id = ext.register_plan(slots.A, slots.B, slots.C, slots.D, slots.C_is_D, slots.always, align_D,
                                    torch.empty(0, dtype=out_dtype), inputs)
        return cls(ext, plan_id, kernel)

    def run(self, A: torch.Tensor, B: torch.Tensor, device: int, out: torch.Tensor | None,
            inputs: dict[str, Any], need_finite: bool = False, padded: bool = False) -> torch.Tensor | None:
        """D, or None for the Python path; ``need_finite``: hand back per-column inputs not marked as
        checked for NaN / Inf (:meth:`mark_finite`), as ``cutlass_ops.int8_gemm`` requires; ``padded``: an N
        the kernel cannot store may run on the padded copies registered by :meth:`register_padded`."""
        if device != current_device():  # the C++ launch runs in the current context: Python switches it
            return None
        D = self._ext.run(self._id, A, B, device, out, inputs, raw_stream(device), need_finite, padded)
        if D.__class__ is int:  # the launch failed: decode the CUresult
            D = retry_in_context(D, device, lambda: self._ext.run(self._id, A, B, device, out, inputs,
                                                                  raw_stream(device), need_finite, padded))
            if D.__class__ is int:
                check((D,), f"cuLaunchKernelEx({self._kernel.name})")
        return D

    def register(self, M: int, N: int, K: int, nonnull: int, device: int, pointers: list[int]) -> None:
        """Hand what Python prepared for this shape to the extension: patchable Params once, or
        (kernels whose Params embed the pointers) the Params built for these pointers."""
        state = self._kernel.prepared_state(M, N, K, nonnull, (), device)
        if state is None or state.shape is None:
            return
        key = (M, N, K, nonnull, device)
        if key not in self._registered:
            if state.words is not None and not state.params_address:
                return  # not verified yet: stays on the Python path
            shape = state.shape
            words = list(state.words) if state.words is not None else []
            self._ext.register_state(self._id, M, N, K, nonnull, device, bytes(state.params), words,
                                     int(shape.function), list(shape.grid), list(shape.block), shape.smem,
                                     list(shape.cluster), shape.pdl)
            self._registered.add(key)
        if state.words is None:
            params = state.rebuilt.get(tuple(pointers))
            if params is not None and not self._ext.register_params(self._id, M, N, K, nonnull, device,
                                                                     list(pointers), bytes(params)):
                self._registered.discard(key)  # the extension's table started over: register again next call

    def register_padded(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], N_pad: int,
                        unpad: tuple[int, int, int, int, bool]) -> None:
        """The kept padded copies of a padded-N call (B and its per-column inputs, each (tensor, copy) with
        N_pad rows or elements) and the unpad_rows launch for its D ((device, load width, CUfunction, most
        blocks, PDL)), so that the next such call runs in C++."""
        for t, copy in pairs:
            self._ext.register_padded(t, N_pad, copy)
        self._ext.register_unpad(*unpad)

    def mark_finite(self, tensors: list[torch.Tensor]) -> None:
        """Tell the extension these per-column inputs were checked for NaN / Inf (until changed in place)."""
        if tensors:
            self._ext.mark_finite(tensors)

    @property
    def plan_id(self) -> int:
        """The plan's index in the extension (the per-channel linear's C++ path names its GEMM by it)."""
        return self._id

    @property
    def shapes(self) -> int:
        """Problem shapes the C++ path takes."""
        return self._ext.state_count(self._id)
