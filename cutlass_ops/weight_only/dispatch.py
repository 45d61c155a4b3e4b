"""Which weight-only strategy runs a problem: the eligibility rules of each kernel and the default order.

Pure Python on the weight's fields (``bits``, ``K``, ``block_size``, ``N``): no GPU needed.
"""
from __future__ import annotations

import torch

from .variants import chunk_elems

__all__ = ["STRATEGIES", "GEMV_MMA_MAX_M", "DEQUANT_CUBLAS_MIN_M", "SMALL_M_GEMV", "strategy_problem",
           "choose_strategy", "dequant_problem"]

# Every strategy name (benchmarks and tests iterate over this).
STRATEGIES = ("gemv_mma", "gemv_stream", "gemv_simt", "gemv_dp4a", "gemm_mma", "dequant_cublas", "gemm_simt")
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
    if strategy in ("gemv_mma", "gemm_mma"):
        if dtype == torch.float32:
            return f"{strategy} needs float16/bfloat16 activations, got float32"
        if cc < 80:
            return f"{strategy} needs sm_80+ (mma.m16n8k16), this GPU is sm_{cc}"
    if strategy == "gemv_mma":
        if M > GEMV_MMA_LIMIT_M:
            return f"gemv_mma takes M <= {GEMV_MMA_LIMIT_M}, got M={M}"
        if K % ce:
            return f"gemv_mma needs K % {ce} == 0 for {bits}-bit weights, got K={K}"
        if not per_channel and not (bs % ce == 0 and _is_pow2(bs // ce)):
            return f"gemv_mma needs block_size = {ce} * 2^j or per-channel, got block_size={bs}"
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


def choose_strategy(M: int, dtype: torch.dtype, qw, cc: int) -> str:
    """The default strategy for this problem: the first that applies of
    dequant_cublas (fp16/bf16, M >= ``DEQUANT_CUBLAS_MIN_M``), ``SMALL_M_GEMV[M]`` (fp16/bf16, sm_80+),
    gemv_mma (fp16/bf16, sm_80+, M <= ``GEMV_MMA_MAX_M``), gemv_simt (M <= 8), gemm_mma (fp16/bf16,
    sm_80+), gemm_simt."""
    tensor_cores = dtype != torch.float32 and cc >= 80
    order = ["dequant_cublas"] if dtype != torch.float32 and M >= DEQUANT_CUBLAS_MIN_M else []
    if tensor_cores and M in SMALL_M_GEMV:
        if SMALL_M_GEMV[M] not in ("gemv_mma", "gemv_stream"):
            raise ValueError(f"SMALL_M_GEMV[{M}] must be 'gemv_mma' or 'gemv_stream', got {SMALL_M_GEMV[M]!r}")
        order.append(SMALL_M_GEMV[M])
    order += ["gemv_mma"] if tensor_cores and M <= GEMV_MMA_MAX_M else []
    order += ["gemv_simt"] if M <= GEMV_MAX_M else []
    order += ["gemm_mma"] if tensor_cores else []
    order += ["gemm_simt"]
    for strategy in order:
        if strategy_problem(strategy, M, dtype, qw, cc) is None:
            return strategy
    return "gemm_simt"
