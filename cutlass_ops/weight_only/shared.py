"""What several weight-only strategies derive from a weight, each built once per weight through
``plan_cache`` (so the plans of one weight share it): the (scale, offset) pairs packed into one
int32 word, a 16-byte aligned qweight, and the group shift of the kernels' K indexing.
"""
from __future__ import annotations

import logging
import math

import torch

from cutlass_ops import plan_cache
from cutlass_ops.finite_check import HOST_CHECK_MAX

from .dispatch import _is_pow2

log = logging.getLogger(__name__)

__all__ = ["ELEMENT", "wo_defines", "block_shift", "pack_scale_offset", "scale_offset_words", "aligned_qweight",
           "derived", "SingleLaunchPlan"]

# WO_ELEMENT of the kernels (weight_only_types.cuh): the activation / output type.
ELEMENT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def wo_defines(dtype: torch.dtype, bits: int, config=None) -> dict[str, int]:
    """The NVRTC defines of a weight-only kernel module: activation type, weight width, and those of the
    kernel variant ``config`` (its ``defines()``; the defaults add none). Plans load their kernels with
    these, and ``cutlass_ops.default_variants`` enumerates the modules from the same function."""
    return {"WO_ELEMENT": ELEMENT[dtype], "WO_BITS": bits, **(config.defines() if config is not None else {})}


def block_shift(qw) -> int:
    """log2(block_size) for power-of-two blocks, 30 for one group per row (k >> 30 == 0), else -1."""
    if qw.num_groups == 1:
        return 30
    return int(math.log2(qw.block_size)) if _is_pow2(qw.block_size) else -1


def pack_scale_offset(qw, dtype: torch.dtype) -> torch.Tensor:
    """int32 [N, G]: scale in the low 16 bits, offset in the high 16 bits, both as ``dtype``."""
    device = qw.scale.device
    scale, offset = qw.scale, qw.offset
    if device.type == "cuda" and scale.numel() <= HOST_CHECK_MAX:  # as finite_check.all_finite: no first
        scale, offset = scale.cpu(), offset.cpu()                   # launches of torch kernels in a new process
    pair = torch.stack((scale.to(dtype), offset.to(dtype)), dim=-1)
    if not bool(torch.isfinite(pair).all()):
        raise ValueError(f"qw.scale/qw.offset overflow {dtype} (the tensor-core kernels dequantize in the "
                         f"activation type); use float32 activations or strategy='gemm_simt'/'gemv_simt'")
    tiny = torch.finfo(dtype).tiny
    if dtype == torch.float16 and bool(((scale.abs() < tiny) & (scale != 0)).any()):
        log.warning("some qw.scale values are below the float16 normal range (%g): they lose relative "
                    "precision in the float16 tensor-core kernels", tiny)
    return pair.contiguous().view(torch.int32).reshape(qw.N, qw.num_groups).to(device)


def scale_offset_words(qw, dtype: torch.dtype) -> torch.Tensor:
    """:func:`pack_scale_offset` of ``qw``, built once per (weight, dtype) and shared by its plans."""
    return plan_cache.plan(qw, ("weight_only.scale_offset", dtype), lambda: pack_scale_offset(qw, dtype))


def aligned_qweight(qw) -> torch.Tensor:
    """qw.qweight, or a contiguous 16-byte aligned copy of it (the 16-byte loads need both), copied once
    per weight.

    The cache (and the plans) never hold the weight's own tensors: its entry lives as long as they do."""
    t = qw.qweight
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t

    def copy() -> torch.Tensor:
        log.info("copying qw.qweight (non-contiguous or not 16-byte aligned) for the 16-byte loads")
        return t.clone(memory_format=torch.contiguous_format)
    return plan_cache.plan(qw, ("weight_only.aligned_qweight",), copy)


def derived(t: torch.Tensor, *originals: torch.Tensor) -> torch.Tensor | None:
    """``t`` when it is a copy a plan must keep alive, None when it is one of the weight's own tensors
    (a plan must not hold those: its weight's cache entry is dropped when they are freed)."""
    return None if any(t is o for o in originals) else t


class SingleLaunchPlan:
    """A strategy whose call is one launch with the activations, bias, output and activation code as
    its per-call fields (``A``, ``bias``, ``D``, ``act``); subclasses build ``self.launch`` once."""

    config_type = None
    bias_tensor = False  # the bias arrives as its address (0: none)
    per_m = True  # one plan per M

    def __call__(self, x: torch.Tensor, bias: int, act: int, out: torch.Tensor) -> None:
        self.launch(A=x.data_ptr(), bias=bias, D=out.data_ptr(), act=act)
