"""Weight-only (scheme 1) linear: D[M, N] = act(x[M, K] @ dequantize(qw)^T + bias), raw NVRTC kernels.

Strategies (``strategy=`` forces one; the default picks by M, dtype and GPU: dispatch.py, and by the GPU's
tuned entries: tuned.py), one module and one plan class each:

============== ============================================ =========================================
strategy       kernel (custom_kernels/kernels/)             applies to
============== ============================================ =========================================
gemv_mma       gemv_mma.cu ``gemv_mma_mt*``                  M <= 64, fp16/bf16, sm_80+; block_size /
               tensor cores with swapped operands, split-K   (32 int4 | 16 int8) a power of two or
               (splitk_reduce.cu)                            per-channel
gemm_small_m   gemm_small_m.cu ``gemm_small_m_mt*``          as gemv_mma (default for 9 <= M <= 64 only
               gemv_mma's mma, warps split N and share one   with dispatch.GEMM_SMALL_M_DEFAULT on)
               cp.async-staged activation tile, split-K
gemm_wgmma     gemm_wgmma.cu ``gemm_wgmma_mt*``              M <= 128, fp16/bf16, sm_90 only; block_size
               wgmma, dequantized weights as the register    as gemv_mma (default on Hopper for 17 <= M
               A operand, K-permuted activations staged in   <= 128 with dispatch.GEMM_WGMMA_DEFAULT on)
               shared memory for the warpgroups, split-K
gemv_stream    gemv_stream.cu ``gemv_stream_m*``             M <= 8, fp16/bf16, any arch; K and
               CUDA cores, two trips of 16-byte loads in     block_size multiples of 32 (int4) or
               flight per lane, activations in shared        16 (int8)
               memory, split-K for small N
gemv_simt      gemv_simt.cu ``gemv_simt_m*``                 M <= 8, any dtype; block_size % 32 (int4)
               warp per row, fp32 arithmetic                 or % 16 (int8)
gemv_dp4a      gemv_dp4a.cu: q8_1 activations, __dp4a        M <= 8, int8 weights, block_size % 32;
                                                             APPROXIMATE (activations rounded to int8)
gemm_mma       gemm_mma.cu ``gemm_mma_mt*``                  any M, fp16/bf16, sm_80+; block_size % 16
               mma.sync (weights as the A operand),
               cp.async pipeline
dequant_cublas dequant_weight.cu ``dequant_weight`` writes   any M; fp16 any arch, bf16 sm_80+, fp32;
               W [N, K] in the activation type (transient),  block_size % 8 (int4) or % 4 (int8)
               then torch.addmm / matmul (cuBLAS)
gemm_simt      gemm_simt.cu ``gemm_simt``                    anything (the fallback)
============== ============================================ =========================================

fp32 stays on CUDA cores: a tf32 path would round A and W to 10-bit mantissas (a forced dequant_cublas
in fp32 follows torch's matmul precision setting). gemv_dp4a changes the numerics and is only used
when asked for.

Numerics: the tensor-core kernels dequantize to the activation type (w = q * s + o rounded once, with
s and o rounded to that type) and accumulate in fp32; gemv_stream sums x * q in the activation type
over one 16-byte chunk (32 int4 / 16 int8 products, 16 / 8 per half of a pair; float16 activation
rows with max |x| > 256 (int4) / 32 (int8) are scaled by a power of two first, so no partial sum can
overflow), then applies s and o (rounded to that type) in fp32; dequant_cublas computes
w = fma(q, s, o) in fp32 with fp32 s and o and rounds once to the activation type, then cuBLAS
(fp32 accumulation; torch's reduced-precision-reduction flags apply). The CUDA-core kernels
gemv_simt / gemm_simt compute in fp32 throughout.

Plans: ``plan = <Strategy>Plan(qw, M, dtype, device, config)`` builds its launches (argument blocks
packed once) and ``plan(x, bias, act, out)`` writes the per-call fields and launches. Plans, and what
they derive from a weight (the (scale, offset) pairs packed into one int32 word, an aligned qweight
copy, the dequantization launch), live in ``cutlass_ops.plan_cache`` under the weight: a replaced
qweight/scale/offset tensor or an in-place change rebuilds them, and nothing is stored on the
QuantizedWeight.
"""
from __future__ import annotations

import torch

from custom_kernels.device import capability, on_device
from custom_kernels.launch import pdl_enabled
from cutlass_ops import plan_cache

from . import dispatch
from .dequant_cublas import DequantCublasPlan, dequantizer
from .dispatch import (
    DEQUANT_CUBLAS_MIN_M, GEMV_MMA_MAX_M, SMALL_M_GEMV, STRATEGIES, candidate_strategies, choose_strategy,
    dequant_problem, strategy_problem,
)
from .gemm_mma import GemmMmaPlan, gemm_mma_smem
from .gemm_simt import GemmSimtPlan
from .gemm_small_m import GemmSmallMPlan
from .gemm_wgmma import GemmWgmmaPlan
from .gemv_dp4a import GemvDp4aPlan
from .gemv_mma import GemvMmaGatherPlan, GemvMmaPdlPlan, GemvMmaPlan
from .gemv_simt import GemvSimtPlan
from .gemv_stream import GemvStreamPlan
from .shared import ELEMENT, block_shift, pack_scale_offset
from .splitk import SplitKGemvPlan
from .tuned import tuned_for
from .variants import (
    GEMM_CONFIGS, SMALL_M_GEMV_MMA, GemmConfig, GemmSmallMConfig, GemmWgmmaConfig, GemvMmaConfig, SmallMShape,
    StreamConfig,
    StreamShape, default_gemm_config, default_gemm_small_m_config, default_gemv_mma_config, default_gemv_mma_configs,
    gemm_small_m_smem, small_m_launch_shape, stream_launch_shape,
)

__all__ = ["STRATEGIES", "GEMV_MMA_MAX_M", "DEQUANT_CUBLAS_MIN_M", "SMALL_M_GEMV", "PLANS", "GemmConfig",
           "GEMM_CONFIGS", "GemvMmaConfig", "SMALL_M_GEMV_MMA", "StreamConfig", "StreamShape",
           "default_gemm_config", "default_gemv_mma_config", "default_gemv_mma_configs", "stream_launch_shape",
           "linear_weight_only",
           "dequantize_weight", "choose_strategy", "strategy_problem", "get_plan", "dispatch",
           "ELEMENT", "block_shift", "pack_scale_offset", "gemm_mma_smem", "GemmSmallMConfig", "GemmWgmmaConfig", "SmallMShape",
           "default_gemm_small_m_config", "gemm_small_m_smem", "small_m_launch_shape", "plan_class",
           "candidate_strategies", "recipe"]

# strategy -> plan class (constructor (qw, M, dtype, device, config=None); call (x, bias, act, out))
PLANS = {
    "gemv_mma": GemvMmaPlan,
    "gemm_small_m": GemmSmallMPlan,
    "gemm_wgmma": GemmWgmmaPlan,
    "gemv_stream": GemvStreamPlan,
    "gemv_simt": GemvSimtPlan,
    "gemv_dp4a": GemvDp4aPlan,
    "gemm_mma": GemmMmaPlan,
    "dequant_cublas": DequantCublasPlan,
    "gemm_simt": GemmSimtPlan,
}
assert set(PLANS) == set(STRATEGIES)


def plan_class(strategy: str, cc: int, gather: bool = False, pdl: bool | None = None) -> type:
    """The plan class running ``strategy`` on sm_``cc``. gemv_mma on sm_90+ with programmatic dependent launch
    on (``pdl``; None: ``CUTLASS_OPS_PDL``) is launched as the programmatic dependent of the kernel before it
    (:class:`GemvMmaPdlPlan`). gather: the act-order plan where there is one: there, the gather kernel then the
    GEMV as its programmatic dependent; elsewhere x is gathered first."""
    if strategy == "gemv_mma" and cc >= 90 and (pdl_enabled() if pdl is None else pdl):
        return GemvMmaGatherPlan if gather else GemvMmaPdlPlan
    return PLANS[strategy]


def _build(qw, M: int, dtype: torch.dtype, device: int, strategy: str | None, config, gather: bool = False):
    cc = capability(device)
    # the default dispatch takes this GPU's tuned choice where there is one (tuned.py), else the rules
    tuned_choice = tuned_for(qw, M, dtype, device, cc) if strategy is None and config is None else None
    chosen, config = tuned_choice or (strategy or choose_strategy(M, dtype, qw, cc), config)
    cls = plan_class(chosen, cc, gather)
    gather = cls is GemvMmaGatherPlan
    problem = strategy_problem(chosen, M, dtype, qw, cc)
    if problem is not None:
        raise ValueError(f"strategy={chosen!r} cannot run M={M}, N={qw.N}, K={qw.K}, bits={qw.bits}, "
                         f"block_size={qw.block_size}, dtype={dtype}: {problem}")
    if config is not None and (cls.config_type is None or not isinstance(config, cls.config_type)):
        raise TypeError(f"config for strategy={chosen!r} must be a "
                        f"{cls.config_type.__name__ if cls.config_type else 'None'}, got {config!r}")

    def build():
        with on_device(device):
            return cls(qw, M, dtype, device, config)
    # The default dispatch and a forced strategy share one plan; plans that serve every M share one.
    key = ("weight_only", chosen, M if cls.per_m else None, dtype, device, config, gather)
    if key == ("weight_only", strategy, M, dtype, device, config, gather):
        return build()
    return plan_cache.plan(qw, key, build)


def get_plan(qw, M: int, dtype: torch.dtype, device: int, strategy: str | None = None, config=None,
             gather: bool = False):
    """The plan running M rows of ``dtype`` activations against ``qw`` on CUDA device ``device`` (with
    ``strategy`` forced, or by the default dispatch), built on first use and cached per weight.
    gather: the act-order plan where the strategy has one (gemv_mma on Hopper: a gather kernel, then the
    GEMV as its programmatic dependent); the plan's ``gather`` attribute says whether it is one."""
    return plan_cache.plan(qw, ("weight_only", strategy, M, dtype, device, config, gather),
                           lambda: _build(qw, M, dtype, device, strategy, config, gather))


def recipe(qw, dtype: torch.dtype, M: int, K: int, act: int, has_bias: bool, device: int):
    """The launches of :func:`linear_weight_only`'s default dispatch for x [M, K] of ``dtype`` on ``device`` as a
    recipe (``custom_kernels.recipe``), or None where its plan has none (only the split-K GEMV plans:
    gemv_mma, gemm_small_m, gemv_stream; not act-order)."""
    from custom_kernels.recipe import Recipe

    plan = get_plan(qw, M, dtype, device)
    if not isinstance(plan, SplitKGemvPlan) or getattr(plan, "gather", False):
        return None
    steps, nbytes, derived = plan.recipe_steps(has_bias, act)
    return Recipe(steps, qw.N, nbytes, keep=(qw.qweight, qw.scale, qw.offset, *derived), bias_dtype=dtype)


def dequantize_weight(qw, dtype: torch.dtype = torch.float16, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """W = q * scale + offset as a dense [N, K] ``dtype`` tensor on qw's CUDA device (the kernel of
    strategy "dequant_cublas": fp32 fma with fp32 scale/offset, rounded once to ``dtype``).

    out: optional contiguous [N, K] ``dtype`` tensor on that device, 16-byte aligned, written in full.
    """
    if dtype not in ELEMENT:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    if not qw.qweight.is_cuda:
        raise ValueError(f"qw must be on a CUDA device, got {qw.qweight.device}")
    problem = dequant_problem(qw)
    if problem is not None:
        raise ValueError(problem)
    shape = (qw.N, qw.K)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=qw.qweight.device)
    elif (out.shape != shape or out.dtype != dtype or out.device != qw.qweight.device or not out.is_contiguous()
          or out.data_ptr() % 16):
        raise ValueError(f"out must be a contiguous, 16-byte aligned {list(shape)} {dtype} tensor on "
                         f"{qw.qweight.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    return dequantizer(qw, dtype, qw.qweight.device.index)(out)


def linear_weight_only(x2d: torch.Tensor, qw, bias: torch.Tensor | None = None, act: int = 0, *,
                       strategy: str | None = None, out: torch.Tensor | None = None, config=None,
                       perm: torch.Tensor | None = None) -> torch.Tensor:
    """act(x2d @ dequantize(qw)^T + bias) -> [M, N] of x2d.dtype.

    Called by ``cutlass_ops.linear`` after its checks (x2d a CUDA [M, K] float16/bfloat16/float32
    tensor, qw a valid QuantizedWeight on its device, bias [N] or None, act 0 none / 1 relu / 2 relu6);
    this function checks only what the chosen kernel needs beyond that. bias of another dtype is
    converted to x2d.dtype. strategy: None (default dispatch) or one of ``STRATEGIES``; out: optional
    contiguous [M, N] tensor of x2d.dtype, 16-byte aligned, written in full. config: a kernel variant
    for the strategy (benchmarks and tests): GemmConfig for "gemm_mma" (None =
    ``default_gemm_config(M)``), GemvMmaConfig for "gemv_mma" (None = ``default_gemv_mma_config(M,
    bits, N, K, SMs)``), StreamConfig for "gemv_stream" (None = the defaults), GemmSmallMConfig for "gemm_small_m"
    (None = ``default_gemm_small_m_config(M, bits)``), GemmWgmmaConfig for "gemm_wgmma" (None =
    ``default_gemm_wgmma_config(M, bits)``). perm: act-order, an int32 contiguous
    tensor [K] on x2d's device with values in [0, K) (checked by the caller): the result is
    act(x2d[:, perm] @ dequantize(qw)^T + bias); gemv_mma on Hopper overlaps its gather kernel with the
    GEMV (programmatic dependent launch), the other cases gather x with ``index_select`` first.
    """
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be None or one of {list(STRATEGIES)}, got {strategy!r}")
    M, N = x2d.shape[0], qw.N
    if not x2d.is_contiguous() or x2d.data_ptr() % 16:  # the kernels' 16-byte activation loads
        x2d = x2d.contiguous() if x2d.data_ptr() % 16 == 0 else x2d.clone(memory_format=torch.contiguous_format)
    if bias is not None and (bias.dtype != x2d.dtype or not bias.is_contiguous()):
        bias = bias.to(x2d.dtype).contiguous()  # the kernels read bias as the activation type
    if out is None:
        out = torch.empty((M, N), dtype=x2d.dtype, device=x2d.device)
    elif (out.shape != (M, N) or out.dtype != x2d.dtype or out.device != x2d.device or not out.is_contiguous()
          or out.data_ptr() % 16):
        raise ValueError(f"out must be a contiguous, 16-byte aligned [{M}, {N}] {x2d.dtype} tensor on "
                         f"{x2d.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    if M == 0:
        return out
    if perm is None:
        plan = get_plan(qw, M, x2d.dtype, x2d.device.index, strategy, config)
        plan(x2d, bias if plan.bias_tensor else (0 if bias is None else bias.data_ptr()), act, out)
        return out
    plan = get_plan(qw, M, x2d.dtype, x2d.device.index, strategy, config, gather=True)
    bias_arg = bias if plan.bias_tensor else (0 if bias is None else bias.data_ptr())
    if getattr(plan, "gather", False):
        plan(x2d, bias_arg, act, out, perm.data_ptr())
    else:
        plan(x2d.index_select(1, perm), bias_arg, act, out)
    return out
