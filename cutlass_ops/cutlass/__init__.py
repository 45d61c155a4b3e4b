"""int8 x int8 GEMMs on CUTLASS kernels built ahead of time: the family behind ``cutlass_ops.int8_gemm``.

    plan = get_plan(device, arch, epilogue, element_D, M)    # cached per (device, arch, epilogue, D, M bucket)
    D = plan(A, B, out=None, **epilogue_inputs)              # A [M, K], B [N, K] int8 -> D [M, N]

``arch`` picks the kernel generation: 90 (wgmma + TMA, Hopper only), 80 (mma.sync, Ampere and
later), 75 (Turing mma.sync m8n8k16, Turing and later); every generation has every epilogue (EVT;
Sm75 uses the Sm80 visitor). None takes the device's own (90 on Hopper). Kernels come from the
build cache (``scripts/build_kernels.py`` fills it); one missing is built on first use (tens of
seconds, logged).

Modules, one concept each: :mod:`.spec` (what names a kernel), :mod:`.bridge` (the only importer of
``cutlass_cppgen``), :mod:`.emit` (sources from the interface and ``templates/``), :mod:`.build`
(nvcc into the content-addressed cache), :mod:`.arguments` (the ``Arguments`` struct without the
interface), :mod:`.kernel` (Params and the launch), :mod:`.fast` (the C++ per-call path),
:mod:`.tuning` (tiles per GPU and M bucket), :mod:`.padding` (any N and K: zero-padded operands),
:mod:`.plan` (the plan and its cache).

The entry points take operands their caller has checked (int8, 2-D, contiguous, the same K, on
one CUDA device: ``cutlass_ops.int8_gemm`` does it once); the plan checks its kernel's own rules.
Importing this package imports no CUTLASS (only emission and builds do).
"""
from __future__ import annotations

from typing import Any

import torch

from .plan import Int8Gemm, check_sizes, get_plan, plan_for
from .spec import GemmKernelSpec
from .tuning import (
    BUCKETS, FLOAT_OUTPUTS, alignment_D, bucket_for, configured_specs, kernel_spec, resolve_arch, target_arch_for,
)

__all__ = ["int8_gemm", "int8_gemm_checked", "int8_gemm_requant", "Int8Gemm", "GemmKernelSpec", "get_plan",
           "plan_for", "check_sizes", "kernel_spec", "configured_specs", "resolve_arch", "alignment_D",
           "target_arch_for", "bucket_for", "BUCKETS", "FLOAT_OUTPUTS"]


def int8_gemm_checked(A: torch.Tensor, B: torch.Tensor, epilogue: str, arch: int | None,
                      out_dtype: torch.dtype | str | None, out: torch.Tensor | None,
                      inputs: dict[str, Any], device: int | None = None) -> torch.Tensor:
    """D = epilogue(A @ B^T): the per-call entry of ``cutlass_ops.int8_gemm``, which has checked the
    operands (int8, 2-D, contiguous, same K, A and B on CUDA device ``device``); the epilogue
    inputs as one dict. One plan lookup, then the plan."""
    if device is None:
        device = A.get_device()
    return plan_for(A.shape[0], device, epilogue, arch, out_dtype).run(A, B, out, inputs, device)


def int8_gemm(A: torch.Tensor, B: torch.Tensor, epilogue: str = "none", *, arch: int | None = None,
              out_dtype: torch.dtype | str | None = None, out: torch.Tensor | None = None,
              **epilogue_args: Any) -> torch.Tensor:
    """D = epilogue(A @ B^T) with A [M, K] int8 and B [N, K] int8 (checked by the caller), on a CUTLASS kernel.

    ``epilogue`` names an entry of the ``epilogues`` registry ("none" -> int32 D; "dequant",
    "dequant_relu", "dequant_relu6" -> f16/bf16/f32 with scale_row [M], scale_col [N], bias [N];
    "requant"; "kblock_accumulate"); its inputs are passed as keyword arguments. ``arch`` forces a
    kernel generation (75, 80, 90). Any N and K: where K % 16 != 0 or N is not a multiple of 16 bytes
    of D, the same kernel runs on zero-padded operands (:mod:`.padding`; A copied per call, the padded
    B and per-column inputs kept per tensor) and D is returned as a contiguous [M, N].
    """
    return int8_gemm_checked(A, B, epilogue, arch, out_dtype, out, epilogue_args)


def int8_gemm_requant(A_q: torch.Tensor, W_q: torch.Tensor, M_scale: torch.Tensor,
                      fused_bias: torch.Tensor | None, *, clamp: tuple[int, int] = (-128, 127),
                      arch: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """O_q = clamp(round_half_even(M_scale[n] * (A_q @ W_q^T + fused_bias[n])), *clamp) as int8
    (``clamp`` checked by the caller: -128 <= lo <= hi <= 127). Any N and K, as :func:`int8_gemm`."""
    lo, hi = int(clamp[0]), int(clamp[1])
    if (lo, hi) == (-128, 127):
        return int8_gemm(A_q, W_q, "requant", arch=arch, out=out, multiplier=M_scale, fused_bias=fused_bias)
    return int8_gemm(A_q, W_q, "requant_clamp", arch=arch, out=out, multiplier=M_scale, fused_bias=fused_bias,
                     lo=float(lo), hi=float(hi))
