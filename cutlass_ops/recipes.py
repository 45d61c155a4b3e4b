"""The C++ replay of a quantized linear's eager call (``custom_kernels.recipe``): ``cutlass_ops.linear`` (its
GEMV plans, M <= 64), ``linear_w8a8`` (fused path) and ``linear_w8a8_block_scaled``, and so ``QuantLinear``.

The API function first offers the call to :func:`run`, which answers None until its checked path has run a
problem of this shape (weight tensors, device, x dtype, M, K, activation, bias or not); after that call,
:func:`register` records that problem's launches (the family's ``recipe``: the same plans and fields the
checked path used) and hands them to the extension. From then on the call is one C++ call: check x,
allocate the output and one workspace, patch the addresses in, launch. Anything else (a gradient wanted, a
non-contiguous or misaligned x, another device than the current one, a weight changed in place, a prepared
weight tensor dropped by the plan cache) comes back as None and takes the Python path, which raises the
precise error or registers again. ``CUTLASS_OPS_HOST_EXT=0`` keeps the Python path.

Importing this module loads no GPU runtime: the extension is bound by the first :func:`register`.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from custom_kernels.recipe import Recipe

__all__ = ["run", "register"]

_ext = None  # the extension, set by the first register() that finds it
_current_device = _raw_stream = None


def run(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
        bias: torch.Tensor | None, act: int) -> torch.Tensor | None:
    """The output [..., N] of the registered recipe of this problem, or None (the caller's Python path).
    ``qweight``, ``scale``, ``offset`` (None for a block-scaled weight): the layer's weight tensors, which key
    the recipe; ``bias``: None or the bias as the family's kernels read it (W8A8: its float32 copy,
    ``plan_cache.float32_copy``; weight-only: in x's dtype)."""
    ext = _ext
    if ext is None:
        return None
    device = x.get_device()
    if device != _current_device():  # the launches run in the current context: Python switches it
        return None
    args = (x, qweight, scale, offset, bias, act, device)
    out = ext.run_recipe(*args, _raw_stream(device))
    if out.__class__ is tuple:
        out = _failed(out, args)
    return out


def _failed(failure: tuple, args: tuple):
    """A launch failed: retried once after binding the device's context where none was current, otherwise
    CudaDriverError naming the step (the steps before it ran; the output is not returned)."""
    from custom_kernels.device import CudaDriverError, retry_in_context

    step, err = failure
    device = args[-1]
    out = retry_in_context(err, device, lambda: _ext.run_recipe(*args, _raw_stream(device)))
    if out.__class__ is tuple:
        step, err = out
    elif out.__class__ is not int:
        return out
    raise CudaDriverError(f"cuLaunchKernelEx (step {step} of a recorded layer call) failed: CUresult {int(err)}")


def register(x: torch.Tensor, weight, offset: torch.Tensor | None, has_bias: bool, act: int, family: str) -> None:
    """After the checked path ran x [..., K] through ``weight`` (a QuantizedWeight or BlockScaledWeight; ``offset``
    its offset tensor, None for a block-scaled one): record the problem's launches with the family module's
    ``recipe(weight, dtype, M, K, act, has_bias, device)`` (``family``: "cutlass_ops.weight_only",
    "cutlass_ops.w8a8.fused" or "cutlass_ops.w8a8.block_scaled_plan"; once per problem; None: a problem the
    family cannot record, remembered as such) and let :func:`run` take such calls."""
    global _ext, _current_device, _raw_stream
    ext = _ext
    if ext is None:
        from custom_kernels import host_ext
        from custom_kernels.device import current_device, raw_stream

        ext = host_ext.load()
        if ext is None:
            return
        _current_device, _raw_stream = current_device, raw_stream
        _ext = ext
    K = x.shape[-1]
    M = x.numel() // K if K else 0
    device = x.get_device()
    if M == 0 or device < 0:
        return
    # x stands for its dtype (the extension reads only that): no allocation on this per-call path
    problem = (weight.qweight, weight.scale, offset, device, x, M, K, act, has_bias)
    if ext.has_recipe(*problem):
        return
    recipe: Recipe | None = importlib.import_module(family).recipe(weight, x.dtype, M, K, act, has_bias, device)
    if recipe is None:  # remembered without steps: run() answers None, has_recipe() True
        ext.register_recipe(*problem, 1, 0, x, [], [])
        return
    ext.register_recipe(*problem, recipe.N, recipe.workspace_bytes, torch.empty(0, dtype=recipe.bias_dtype or x.dtype),
                        list(recipe.keep), [step.as_tuple() for step in recipe.steps])
