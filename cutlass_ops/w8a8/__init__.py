"""Scheme 2: W8A8 quantized per K block - int8 activations quantized per row and K block (QuantA),
an int8 weight per column and K block, fp32 promotion of each block's int32 product.

For K block i (block_size = bs columns of A and of B):

    D[m, n] = act( sum_i [ sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB ] + bias[n] )

Three paths, one plan class each, every plan kept per weight in ``cutlass_ops.plan_cache``:

- ``"fused"`` (:mod:`.fused`, variants in :mod:`.tiles`): one NVRTC kernel (mma.sync, or wgmma +
  TMA on Hopper) after one QuantA launch.
- ``"orchestrator"`` (:mod:`.orchestrator`): QuantA once, one CUTLASS int8 GEMM per K block with
  the ``kblock_accumulate`` epilogue.
- ``"literal"`` (:mod:`.literal`): the documents' kernels one by one (QuantA of a block, int32
  GEMM, DequantAndAcc) - kept for comparison.

The helper kernels live in :mod:`.quant_a` (QuantA, SumBq) and :mod:`.epilogue` (DequantAndAcc,
BiasAndActivation). Importing this package imports only torch and the plan cache (so ``PATHS`` is
cheap to import); the first call binds the kernels' modules, and the per-block paths import the
CUTLASS family when their first plan is built.
"""
from __future__ import annotations

import torch

from cutlass_ops import plan_cache

__all__ = ["PATHS", "linear_w8a8"]

PATHS = ("fused", "orchestrator", "literal")
_PLAN_KEYS = {"orchestrator": "w8a8.orchestrator", "literal": "w8a8.literal"}
_fused_linear = _bias_and_activation = None  # bound on the first call: importing PATHS stays light


def _bind():
    global _fused_linear, _bias_and_activation
    from .epilogue import bias_and_activation
    from .fused import fused_linear

    _fused_linear, _bias_and_activation = fused_linear, bias_and_activation


def _build_block_plan(qw, path: str):
    # imported on a plan-cache miss only: these paths pull in the CUTLASS family
    if path == "orchestrator":
        from .orchestrator import OrchestratorPlan

        return OrchestratorPlan(qw)
    from .literal import LiteralPlan

    return LiteralPlan(qw)


def linear_w8a8(x2d: torch.Tensor, qw, bias: torch.Tensor | None = None, act: int = 0, *,
                path: str = "fused") -> torch.Tensor:
    """Scheme 2 on x2d [M, K] (fp16/bf16/fp32) and an int8 per-block weight: [M, N] in x2d.dtype.

    The family entry behind ``cutlass_ops.linear_w8a8``, which has checked the operands: x2d CUDA,
    contiguous, M >= 1; qw an int8 weight on x2d's device; bias None or contiguous [N]; act a code.
    """
    if _fused_linear is None:
        _bind()
    if path == "fused":
        return _fused_linear(x2d, qw, bias, act)
    key = _PLAN_KEYS.get(path)
    if key is None:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    acc = plan_cache.plan(qw, key, lambda: _build_block_plan(qw, path))(x2d)
    out = torch.empty((x2d.shape[0], qw.N), dtype=x2d.dtype, device=x2d.device)
    bias32 = None if bias is None else plan_cache.float32_copy(bias)
    _bias_and_activation(acc[:, :qw.N], out, bias32, act)
    return out
