"""Which weight-only strategy runs a problem: the eligibility rules of each kernel and the default order.

Pure Python on the weight's fields (``bits``, ``K``, ``block_size``, ``N``): no GPU needed.
"""
from __future__ import annotations

import torch

from .variants import chunk_elems

__all__ = [
    "STRATEGIES", "GEMV_MMA_MAX_M", "DEQUANT_CUBLAS_MIN_M", "SMALL_M_GEMV", "GEMM_SMALL_M_DEFAULT",
    "GEMM_SMALL_M_MIN_M", "GEMM_SMALL_M_WIDE_MIN_M", "GEMM_SMALL_M_NARROW_N", "GEMM_SMALL_M_INT8_MIN_M",
    "GEMM_WGMMA_DEFAULT", "GEMM_WGMMA_MIN_M", "GEMM_WGMMA_INT8_MIN_M", "GEMM_WGMMA_INT8_KEEP_N",
    "GEMM_WGMMA_INT8_KEEP_K", "GEMM_WGMMA_LIMIT_M",
    "strategy_problem", "candidate_strategies", "candidates_constant_from", "choose_strategy",
    "dequant_problem"
]

# Every strategy name (benchmarks and tests iterate over this).
STRATEGIES = ("gemv_mma", "gemm_small_m", "gemm_wgmma", "gemv_stream", "gemv_simt", "gemv_dp4a", "gemm_mma", "dequant_cublas",
              "gemm_simt")
# Default switch from the tensor-core GEMV to the GEMM. H200, N = K = 8192, W4A16: gemv_mma 23 us at
# M = 16, 39 us at 32, 62 us at 64; gemm_mma 103-106 us at M = 16..64.
GEMV_MMA_MAX_M = 64
# From this M on, fp16/bf16 go through dequant_cublas. H200, N = K = 8192, W4A16 g128: gemm_mma 149 us
# at M = 256 and 2272 us at M = 4096 (0.37x fp16 cuBLAS: 54 / 808 us). Predicted dequant_cublas: the
# dequantization moves 32 MB + 128 MB (about 40-50 us at 4.25 TB/s), so ~105 us at M = 256 and
# ~860 us (0.94x cuBLAS) at M = 4096; at M = 64 gemv_mma (62 us) beats ~46 + 45 us. To be adjusted
# after measuring (gemm_mma measured 103-106 us at M = 16..64, so M = 65..127 may also gain).
DEQUANT_CUBLAS_MIN_M = 128
# Small-M GEMV per M on sm_80+ fp16/bf16: "gemv_mma" (tensor cores) or "gemv_stream" (CUDA cores).
# Timed side by side (scripts/sweep_gemv.py, H100, W4A16 g128, every variant of each): at M = 1 the
# best of each is within 1-2% (N = K = 8192: 21.9 vs 22.1 us; N = 28672: 56.5 vs 57.3 us), at M = 8
# gemv_stream is 2.4x slower (54.5 vs 22.4 us): gemv_mma everywhere. Default plans are cached per
# weight: a change here (or to DEQUANT_CUBLAS_MIN_M) applies to weights not yet called with that M.
SMALL_M_GEMV: dict[int, str] = {M: "gemv_mma" for M in range(1, 9)}
GEMV_MMA_LIMIT_M = 64   # kMTiles = 8 tiles of 8 rows
# "gemm_small_m" (warps split N and share one staged activation tile: gemm_small_m.cu) is the default for
# GEMM_SMALL_M_MIN_M <= M <= GEMM_SMALL_M_LIMIT_M on sm_80+ fp16/bf16, ahead of gemv_mma, except at
# M < GEMM_SMALL_M_WIDE_MIN_M on weights wider than GEMM_SMALL_M_NARROW_N. H100, W4A16 g128, 8B shapes
# (scripts/results/nvidia-h100/sweep_small_m.md, us): 4096 x 4096 M = 8 / 16 / 32 / 64: 9.3 / 10.5 / 12.7 /
# 17.5 vs gemv_mma 15.0 / 18.6 / 26.5 / 39.3; 6144 x 4096 M = 16: 14.0 vs 11.5 (gemv_mma keeps M < 32 there),
# M = 32 / 64: 17.7 / 23.8 vs 20.2 / 32.6; 28672 x 4096 M = 32 / 64: 48.9 / 71.4 vs 68.0 / 112.9.
# Below M = 17 gemv_mma's rule variants (variants.default_gemv_mma_config: full batches, no K split) took its place
# on the narrow int4 weights (thirtieth session, H200, fp16, us, gemm_small_m / gemv_mma): M = 8 4096 x 4096 8.9 / 6.0,
# 4096 x 14336 20.6 / 17.1, 2048 x 2048 6.7 / 4.4, 3072 x 3072 7.6 / 5.3; M = 16 10.3 / 7.8, 22.3 / 22.3, 7.4 / 5.9
# (2048 x 8192 M = 16 the one loss: 10.3 / 11.2).
# Read at each dispatch (``cutlass_ops.weight_only.dispatch.GEMM_SMALL_M_DEFAULT``, the module attribute);
# default plans already cached for a weight and M keep their strategy.
GEMM_SMALL_M_DEFAULT = True
GEMM_SMALL_M_MIN_M = 17
GEMM_SMALL_M_LIMIT_M = 64  # gemm_small_m_mt8: 8 tiles of 8 rows
GEMM_SMALL_M_WIDE_MIN_M = 32   # below it, only weights of N <= GEMM_SMALL_M_NARROW_N take gemm_small_m
GEMM_SMALL_M_NARROW_N = 4096
# int8 weights take gemm_small_m from this M only: at M = 32 it lost to gemv_mma on 12 of 34 Llama shapes
# (up to 1.34x, wide N / long K: 70B down, 8B qkv-12288), at M = 64 it wins on 27 of 34 (H100 llm_shapes).
GEMM_SMALL_M_INT8_MIN_M = 33
# "gemm_wgmma" (wgmma with the dequantized weights as the register A operand: gemm_wgmma.cu, sm_90 only) is the
# default for GEMM_WGMMA_MIN_M <= M <= GEMM_WGMMA_LIMIT_M there, ahead of gemm_small_m, gemv_mma and dequant_cublas.
# H200, W4A16 g128, the Llama-3-8B weights (us; 20th session, variants.default_gemm_wgmma_config), against the
# dispatch before it: M = 16 slower on 3 of 4 (qkv 6144 x 4096 12.3 vs 10.5), M = 32 faster on 3 and level on 1
# (gate 14336 x 4096 26.5 vs 29.1), M = 64 1.16-1.23x faster (gate 35.7 vs 42.8, down 4096 x 14336 30.6 vs 37.7),
# M = 96 2.2-4.5x faster than gemm_mma (down 51.5 vs 230.9), M = 128 1.15-1.41x faster than dequant_cublas on
# 3 of 4 (down 58.0 vs 81.7; qkv 36.1 vs 33.6).
GEMM_WGMMA_DEFAULT = True
GEMM_WGMMA_MIN_M = 17
# int8 weights take gemm_wgmma from this M only, but for the mid-width, mid-K ones below (thirty-first session, H200,
# the tuner's candidates on 29 weights at M = 24 / 32, fp16 and bf16; geometric mean of the time over the fastest):
# gemm_wgmma's default everywhere 1.23 / 1.21x (2.4x on Qwen2.5-0.5B o / qkv), gemv_mma's int8 rule everywhere
# (variants.M32_INT8_GEMV_MMA and the narrow forms) 1.07 / 1.06x but 1.23-1.37x on Phi-3 qkv 9216 x 3072 and
# Qwen2.5-7B qkv 4608 x 3584 (gemm_wgmma 1.00-1.03x there), both 1.05 / 1.04x.
GEMM_WGMMA_INT8_MIN_M = 33
GEMM_WGMMA_INT8_KEEP_N = (4096, 25344)  # exclusive: 2..12 16-row tiles per SM on 132 SMs
GEMM_WGMMA_INT8_KEEP_K = (1024, 4096)   # exclusive: 65..255 chunks
GEMM_WGMMA_LIMIT_M = 128  # gemm_wgmma_mt16: wgmma n = 128
GEMV_MAX_M = 8          # gemv_simt / gemv_stream / gemv_dp4a instantiate M = 1..8


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def dequant_problem(qw) -> str | None:
    """Why the dequant_weight kernel cannot handle ``qw`` (None if it can)."""
    word = 32 // qw.bits  # K elements per 32-bit word of qweight
    if qw.block_size % word:
        return f"dequant_cublas needs block_size % {word} == 0 for {qw.bits}-bit weights, got block_size={qw.block_size}"
    if qw.N * qw.K * qw.bits // 8 // 16 >= 2 ** 31:
        return f"dequant_cublas indexes 16-byte chunks with int32, N * K = {qw.N * qw.K} is too large"
    return None


def strategy_problem(strategy: str, M: int, dtype: torch.dtype, qw, cc: int) -> str | None:
    """Why ``strategy`` cannot run this problem (None if it can)."""
    bits, K, bs = qw.bits, qw.K, qw.block_size
    ce = chunk_elems(bits)
    per_channel = bs == K
    if strategy in ("gemv_mma", "gemm_mma", "gemm_small_m"):
        if dtype == torch.float32:
            return f"{strategy} needs float16/bfloat16 activations, got float32"
        if cc < 80:
            return f"{strategy} needs sm_80+ (mma.m16n8k16), this GPU is sm_{cc}"
    if strategy == "gemm_wgmma":
        if dtype == torch.float32:
            return "gemm_wgmma needs float16/bfloat16 activations, got float32"
        if cc != 90:
            return f"gemm_wgmma needs sm_90 (wgmma), this GPU is sm_{cc}"
    if strategy in ("gemv_mma", "gemm_small_m", "gemm_wgmma"):  # one 16-byte chunk per lane and trip, one group shift
        limit = {"gemv_mma": GEMV_MMA_LIMIT_M, "gemm_small_m": GEMM_SMALL_M_LIMIT_M}.get(strategy, GEMM_WGMMA_LIMIT_M)
        if M > limit:
            return f"{strategy} takes M <= {limit}, got M={M}"
        if K % ce:
            return f"{strategy} needs K % {ce} == 0 for {bits}-bit weights, got K={K}"
        if not per_channel and not (bs % ce == 0 and _is_pow2(bs // ce)):
            return f"{strategy} needs block_size = {ce} * 2^j or per-channel, got block_size={bs}"
    elif strategy == "gemm_mma":
        if bs % 16:
            return f"gemm_mma needs block_size % 16 == 0, got block_size={bs}"
        if K % ce:
            return f"gemm_mma needs K % {ce} == 0 for {bits}-bit weights, got K={K}"
    elif strategy in ("gemv_simt", "gemv_stream"):
        if strategy == "gemv_stream" and dtype == torch.float32:
            return "gemv_stream needs float16/bfloat16 activations, got float32"
        if M > GEMV_MAX_M:
            return f"{strategy} takes M <= {GEMV_MAX_M}, got M={M}"
        if K % ce or bs % ce:
            return f"{strategy} needs K and block_size multiples of {ce}, got K={K}, block_size={bs}"
    elif strategy == "dequant_cublas":
        if dtype == torch.bfloat16 and cc < 80:
            return f"dequant_cublas in bfloat16 needs sm_80+ (cuBLAS bf16 GEMM), this GPU is sm_{cc}"
        return dequant_problem(qw)
    elif strategy == "gemv_dp4a":
        if bits != 8:
            return f"gemv_dp4a needs int8 weights, got bits={bits}"
        if M > GEMV_MAX_M:
            return f"gemv_dp4a takes M <= {GEMV_MAX_M}, got M={M}"
        if K % 32 or bs % 32:
            return f"gemv_dp4a needs K and block_size multiples of 32, got K={K}, block_size={bs}"
    elif strategy != "gemm_simt":
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    return None


def candidate_strategies(M: int, dtype: torch.dtype, cc: int) -> list[str]:
    """The default dispatch's candidates for M rows of ``dtype`` on sm_``cc``, in order (:func:`choose_strategy`
    takes the first that applies to the weight): gemm_wgmma (fp16/bf16, sm_90, ``GEMM_WGMMA_MIN_M`` <= M <=
    ``GEMM_WGMMA_LIMIT_M``, with ``GEMM_WGMMA_DEFAULT`` on), dequant_cublas (fp16/bf16, M >= ``DEQUANT_CUBLAS_MIN_M``),
    gemm_small_m (fp16/bf16, sm_80+, ``GEMM_SMALL_M_MIN_M`` <= M <= ``GEMM_SMALL_M_LIMIT_M``, with
    ``GEMM_SMALL_M_DEFAULT`` on; :func:`choose_strategy` skips it for wide weights below
    ``GEMM_SMALL_M_WIDE_MIN_M``), ``SMALL_M_GEMV[M]`` (fp16/bf16, sm_80+), gemv_mma (fp16/bf16, sm_80+, M <=
    ``GEMV_MMA_MAX_M``), gemv_simt (M <= 8), gemm_mma (fp16/bf16, sm_80+), gemm_simt."""
    tensor_cores = dtype != torch.float32 and cc >= 80
    order = ["gemm_wgmma"] if (tensor_cores and cc == 90 and GEMM_WGMMA_DEFAULT
                               and GEMM_WGMMA_MIN_M <= M <= GEMM_WGMMA_LIMIT_M) else []
    order += ["dequant_cublas"] if dtype != torch.float32 and M >= DEQUANT_CUBLAS_MIN_M else []
    if tensor_cores and GEMM_SMALL_M_DEFAULT and GEMM_SMALL_M_MIN_M <= M <= GEMM_SMALL_M_LIMIT_M:
        order.append("gemm_small_m")
    if tensor_cores and M in SMALL_M_GEMV:
        if SMALL_M_GEMV[M] not in ("gemv_mma", "gemv_stream"):
            raise ValueError(f"SMALL_M_GEMV[{M}] must be 'gemv_mma' or 'gemv_stream', got {SMALL_M_GEMV[M]!r}")
        order.append(SMALL_M_GEMV[M])
    order += ["gemv_mma"] if tensor_cores and M <= GEMV_MMA_MAX_M else []
    order += ["gemv_simt"] if M <= GEMV_MAX_M else []
    order += ["gemm_mma"] if tensor_cores else []
    order += ["gemm_simt"]
    return order


def candidates_constant_from() -> int:
    """The M from which :func:`candidate_strategies` returns the same list for every larger M (the
    thresholds above, read now: ``SMALL_M_GEMV`` and ``GEMM_SMALL_M_DEFAULT`` may have been changed)."""
    return max(DEQUANT_CUBLAS_MIN_M, GEMV_MMA_MAX_M + 1, GEMV_MAX_M + 1, GEMM_SMALL_M_LIMIT_M + 1, GEMM_WGMMA_LIMIT_M + 1,
               max(SMALL_M_GEMV, default=0) + 1)


def _gemv_mma_faster(strategy: str, M: int, qw) -> bool:
    """Whether gemv_mma, later in the order, streams this weight faster than ``strategy``: gemm_small_m below
    ``GEMM_SMALL_M_INT8_MIN_M`` rows for int8 and below ``GEMM_SMALL_M_WIDE_MIN_M`` on wide int4 weights (see
    ``GEMM_SMALL_M_DEFAULT``); gemm_wgmma below ``GEMM_WGMMA_INT8_MIN_M`` rows for int8 but on mid-width, mid-K
    weights (``GEMM_WGMMA_INT8_KEEP_N`` / ``_K``)."""
    if strategy == "gemm_small_m":
        return M < GEMM_SMALL_M_INT8_MIN_M if qw.bits == 8 else (M < GEMM_SMALL_M_WIDE_MIN_M
                                                                  and qw.N > GEMM_SMALL_M_NARROW_N)
    if strategy == "gemm_wgmma":
        mid = (GEMM_WGMMA_INT8_KEEP_N[0] < qw.N < GEMM_WGMMA_INT8_KEEP_N[1]
               and GEMM_WGMMA_INT8_KEEP_K[0] < qw.K < GEMM_WGMMA_INT8_KEEP_K[1])
        return qw.bits == 8 and M < GEMM_WGMMA_INT8_MIN_M and not mid
    return False


def choose_strategy(M: int, dtype: torch.dtype, qw, cc: int) -> str:
    """The default strategy for this problem: the first of :func:`candidate_strategies` that applies and that
    gemv_mma does not beat on this weight (:func:`_gemv_mma_faster`)."""
    for strategy in candidate_strategies(M, dtype, cc):
        if not _gemv_mma_faster(strategy, M, qw) and strategy_problem(strategy, M, dtype, qw, cc) is None:
            return strategy
    return "gemm_simt"
