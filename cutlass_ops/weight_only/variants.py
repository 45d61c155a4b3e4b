"""Kernel variants and launch shapes of the weight-only kernels: pure data and arithmetic, no GPU.

``GemmConfig`` / ``GemvMmaConfig`` / ``StreamConfig`` / ``GemmSmallMConfig`` name a compiled variant of
gemm_mma, gemv_mma, gemv_stream and gemm_small_m (their NVRTC defines); ``default_*`` pick the variant the
default dispatch uses; ``stream_launch_shape`` / ``small_m_launch_shape`` size a gemv_stream / gemm_small_m
launch for a GPU. ``cutlass_ops.weight_only`` re-exports all of it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, ClassVar

__all__ = ["GemmConfig", "GEMM_CONFIGS", "default_gemm_config", "GemvMmaConfig", "SMALL_M_GEMV_MMA",
           "default_gemv_mma_config", "default_gemv_mma_configs", "StreamConfig", "StreamShape", "stream_launch_shape",
           "chunk_elems",
           "GemmSmallMConfig", "default_gemm_small_m_config", "small_m_tiles", "gemm_small_m_smem", "SmallMShape",
           "small_m_launch_shape", "staged_launch_shape", "GemmWgmmaConfig", "default_gemm_wgmma_config", "wgmma_tiles",
           "gemm_wgmma_smem", "wgmma_launch_shape"]


def chunk_elems(bits: int) -> int:
    """K elements in one 16-byte chunk of a weight row."""
    return 32 if bits == 4 else 16


@dataclass(frozen=True)
class GemmConfig:
    """A gemm_mma kernel variant (gemm_mma.cu ``gemm_mma_mt*``): m_tile = the CTA's M extent
    (64 or 128; the N extent is 128)."""

    m_tile: int = 128

    def __post_init__(self):
        if self.m_tile not in (64, 128):
            raise ValueError(f"GemmConfig.m_tile must be 64 or 128, got {self.m_tile!r}")

    def kernel_name(self) -> str:
        return f"gemm_mma_mt{self.m_tile // 16}"


GEMM_CONFIGS = (GemmConfig(64), GemmConfig(128))


@dataclass(frozen=True)
class GemvMmaConfig:
    """A gemv_mma kernel variant (gemv_mma.cu ``GEMV_MMA_*`` defines): ``row_tiles`` 16-row
    tiles of N per warp, ``unroll`` warp trips of weight loads issued before any use, ``min_blocks``
    the ``__launch_bounds__`` blocks per SM (M <= 16), ``warps`` the most warps splitting K in a block,
    ``splits`` the K splits across blocks (None: enough blocks for about 2 per SM), ``chains`` independent
    accumulator sets (consecutive trips' mma chains overlap), ``full_batches`` a second copy of the batch loop
    without the end-of-K masks, taken where a whole batch lies below the end (1 = on)."""

    row_tiles: int = 2
    unroll: int = 4
    min_blocks: int = 2
    warps: int = 8
    splits: int | None = None
    chains: int = 1
    full_batches: int = 0
    # the loop options: written to tuning files only when set, so entries older than them read as before
    json_when_set: ClassVar[tuple[str, ...]] = ("chains", "full_batches")

    def __post_init__(self):
        for name, allowed in (("row_tiles", (1, 2, 4)), ("unroll", (1, 2, 4, 8)), ("min_blocks", (1, 2, 3, 4)),
                              ("warps", (1, 2, 4, 8)), ("chains", (1, 2, 4)), ("full_batches", (0, 1))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GemvMmaConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.splits is not None and (not isinstance(self.splits, int) or self.splits < 1):
            raise ValueError(f"GemvMmaConfig.splits must be None or a positive int, got {self.splits!r}")

    def defines(self) -> dict[str, int]:
        """The NVRTC defines that differ from the kernel's defaults (defaults compile as before)."""
        base = GemvMmaConfig()
        return {f"GEMV_MMA_{k.upper()}": getattr(self, k)
                for k in ("row_tiles", "unroll", "min_blocks", *self.json_when_set)
                if getattr(self, k) != getattr(base, k)}


@dataclass(frozen=True)
class StreamConfig:
    """A gemv_stream kernel variant (gemv_stream.cu ``GEMV_STREAM_*`` defines): ``rows`` weight rows per warp,
    ``warps`` per block, ``min_blocks`` the ``__launch_bounds__`` blocks per SM."""

    rows: int = 4
    warps: int = 8
    min_blocks: int = 2

    def __post_init__(self):
        for name, allowed in (("rows", (1, 2, 4, 8)), ("warps", (2, 4, 8, 16)), ("min_blocks", (1, 2, 3, 4))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"StreamConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    def defines(self) -> dict[str, int]:
        """The NVRTC defines that differ from the kernel's defaults (defaults compile as before)."""
        base = StreamConfig()
        return {f"GEMV_STREAM_{k.upper()}": getattr(self, k) for k in ("rows", "warps", "min_blocks")
                if getattr(self, k) != getattr(base, k)}


def default_gemm_config(M: int) -> GemmConfig:
    """64-row tiles up to M = 64 (measured 1.3x faster than 128 at M = 16..32 on an H200), else 128."""
    return GemmConfig(64 if M <= 64 else 128)
# gemv_mma variants at M <= 4. SMALL_M_GEMV_MMA (one 16-row tile per warp, eight trips of loads in flight, 4 warps
# per block) was the one variant there until the thirty-first session (H100, W4A16 g128, M = 1: 21.9 vs 22.0 us at
# N = K = 8192 against the M = 64 default, 56.5 vs 61.1 at N = 28672; int8 8.5 vs 14.0 at 4096 x 4096, where the
# default's two-tile rows left fewer blocks than SMs and split K). It stays the choice on wide weights.
SMALL_M_GEMV_MMA = GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4)
_SMALL_M_MAX_M = 4
# Since the thirty-first session the variant at M <= 4 depends on the row tiles per SM (t = ceil(N / 16) / SMs)
# and the 16-byte chunks of a weight row (c = K / 32 int4, K / 16 int8). H200: all 24 M <= 4 candidates of the
# tuner (its 16 and the eight-trip forms with K whole) timed on 29 weights (the 18 of bench_llm_shapes and 11 of
# other models), M = 1 and 4, fp16 and bf16, through tune_weight_only's CUDA graphs; geometric mean of the
# chosen variant's time over the fastest's, int4 / int8: SMALL_M_GEMV_MMA alone (with 8 warps on long K and
# NARROW_GEMV_MMA on narrow weights) 1.166 / 1.118 (up to 1.67x: Qwen2.5-0.5B gate_up 9728 x 896), this rule
# 1.026 / 1.026 (up to 1.19x / 1.25x). The measured reasons, per branch:
# - two accumulator sets (chains = 2) on narrow weights (t < 1/2) and where a block's loop covers the row in a
#   few trips: 896 x 896 / 1152 x 896 / 1024 x 4096 int4 1.00-1.02x the fastest (NARROW_GEMV_MMA 1.12-1.14x);
#   int8 896 x 896 at 4 warps 1.00x (8 warps 1.13x);
# - eight trips of loads and 8 warps with two sets where a narrow weight is long (c > 128 int4, > 64 int8):
#   1024 x 8192 int4 1.01x, int8 1.00x (NARROW_GEMV_MMA 1.10 / 1.25x);
# - one tile per block row at 2 blocks per SM with full batches (NARROW_GEMV_MMA) where the rows give < 2 tiles
#   per SM and K is short: 4096 x 4096, 3072 x 3072, 3584 x 3584 int4 1.00x (SMALL_M_GEMV_MMA 1.19-1.29x);
#   8 warps, eight trips and full batches there once K is long (c >= 192): 3072 x 8192 / 4096 x 14336 1.00 /
#   1.02x; int8 at c <= 128 with two sets (2048 x 2048, 3072 x 2048: 1.01x);
# - 4 warps, two sets, 2 blocks per SM where K is short (c <= 64) and the rows give a tile per SM or more:
#   3072 x 2048 int4 1.00x (8 warps 1.31x), 16384 x 2048 1.05x (SMALL_M_GEMV_MMA 1.51x); the int8 choice on
#   every weight of >= 2 tiles per SM (9728 x 896 1.00x, 28672 x 4096 1.00x, 8B qkv 6144 x 4096 1.13x) and on
#   every short-K one (1152 x 896 1.00x; one tile, 8 warps, two sets 1.23x);
# - int4 at 2..6 tiles per SM with c = 112..128 (K = 3584..4096): eight trips, two sets, full batches (6144 x
#   4096, 12288 x 4096, 4608 x 3584 1.00x; SMALL_M_GEMV_MMA 1.06-1.36x); at c = 96 (9216 x 3072) the plain
#   form wins (1.00 vs 1.26x);
# - int4 with c >= 256 and one wave of 32-row blocks (N / 32 <= 2 per SM): MID_M_GEMV_MMA (8192 x 8192,
#   8192 x 28672 1.00x; SMALL_M_GEMV_MMA 1.31 / 1.36x); int8 there with >= 1024 chunks (8192 x 28672) the M = 64
#   default (1.00-1.03x; 4 warps with two sets 1.04-1.11x, 1.19x through the API at M = 4 bf16).
SMALL_M_CHAINS_GEMV_MMA = GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4, chains=2, full_batches=1)
SMALL_M_FULL_GEMV_MMA = GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8, full_batches=1)
SHORT_K_GEMV_MMA = GemvMmaConfig(row_tiles=1, unroll=4, min_blocks=2, warps=4, chains=2, full_batches=1)


# The rule beyond the above (thirtieth session; H200, every tune_weight_only candidate timed on the 18 Llama weights
# and 6 narrow ones, fp16 and bf16, W4 and W8, then the rule through the public API on 28 weights; design.md
# section 4):
# - K is split across blocks only where N gives fewer 16-row tiles than a quarter of the SMs: the split's
#   workspace and reduction cost more than the idle SMs on every weight measured down to N = 896 (56 tiles for 132
#   SMs; 8B k 1024 x 4096 W4 M = 1 6.5 us split, 3.3 whole; 1B o 2048 x 2048 W4 M = 8 7.3 -> 4.4);
# - NARROW_GEMV_MMA (one row tile, 8 warps, 2 blocks per SM, full batches) where two row tiles leave SMs idle: from
#   M = 5 on fewer 32-row blocks than half the SMs, at M = 5..16 for int8 than the SMs (at M <= 4 the rule above;
#   0.40-0.93x the time of the rule before on six weights of N = 896-1152, 0.71-0.91x on N = 2048-4096 int8 at
#   M = 8 / 16; at M = 32 / 64 1.13-1.38x slower than two row tiles there, 0.64-1.02x at N = 2048);
# - int4 from M = 5 with full batches (0.92-0.95x the time without at M = 5..16, geometric mean; int8 at M = 5..8
#   1.00x, up to 1.13x slower on wide weights, so int8 keeps the default there);
# - M = 9..16: int8 weights take 2 trips of loads in flight (r2u2: 0.65x the time of the rule before, every weight
#   faster); int4 weights four row tiles where that still gives a block per SM (half the activation loads per weight
#   load: 8B gate_up 28672 x 4096 M = 16 41.4 -> 32.8 us), else MID_M_GEMV_MMA.
# - thirty-first session (H200, the tuner's candidates on the 29 weights at M = 8 and 16, fp16 and bf16; geometric mean
#   of the rule's time over the fastest, int4 / int8, M = 8: 1.069 / 1.133 -> 1.044 / 1.038, M = 16: 1.058 / 1.043 ->
#   1.040 / 1.025): int8 at M = 5..8 takes the M <= 4 rule from a 16-row tile per SM and on short K (one M tile of 8
#   rows either way: the same modules; 9728 x 896 1.61 -> 1.00x, 3072 x 3072 1.11 -> 1.02x); short K (<= 64 chunks)
#   takes 4 warps: int4 at M = 5..8 SHORT_K_GEMV_MMA (3072 x 2048 1.35 -> 1.00x, 16384 x 2048 1.46 -> 1.02x), int4
#   at M = 9..16 under 6 tiles per SM two trips of two row tiles (M16_INT8_GEMV_MMA: 3072 x 2048 1.44 -> 1.03x, 9728 x
#   896 1.19 -> 1.00x; at 16384 x 2048 four row tiles stay, 1.00 vs 1.13x), int8 at M = 9..16 one row tile at 4
#   warps (1152 x 896 1.25 -> 1.01x).
NARROW_GEMV_MMA = GemvMmaConfig(row_tiles=1, unroll=4, min_blocks=2, warps=8, full_batches=1)
MID_M_GEMV_MMA = GemvMmaConfig(row_tiles=2, unroll=4, min_blocks=2, warps=8, full_batches=1)
M16_INT8_GEMV_MMA = GemvMmaConfig(row_tiles=2, unroll=2, min_blocks=2, warps=8, full_batches=1)
M16_WIDE_GEMV_MMA = GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=8, full_batches=1)
_MID_M_MAX_M = 16
# int8 at M = 17..32 (thirty-first session; on sm_90 gemv_mma takes these from gemm_wgmma,
# dispatch.GEMM_WGMMA_INT8_MIN_M): H200, the tuner's candidates on the 29 weights at M = 24 and 32, fp16 and bf16:
# gemm_wgmma's default variant was 1.23 / 1.21x the fastest by geometric mean (2.4x on Qwen2.5-0.5B o / qkv), this
# rule 1.07 / 1.06x. Four row tiles with two trips in flight where the rows give >= 2 tiles per SM (70B o / down /
# gate_up, 8B gate 1.00x, wgmma 1.10-1.32x; every x element loaded once per four weight rows); one row tile at 4
# warps on short K (<= 64 chunks: 1.01-1.14x) and below two tiles per SM unless K is long (3072 x 3072 1.00x, wgmma
# 1.23x); two row tiles, four trips from 384 chunks there (4096 x 14336 1.00x). Left at 1.2-1.37x: qkv-like
# weights of 2-6 tiles per SM and 192-256 chunks (Phi-3 qkv 9216 x 3072, Qwen2.5-7B qkv, 8B qkv-12288), where
# gemm_wgmma (kept there by the dispatch) or gemm_small_m lead.
M32_INT8_GEMV_MMA = GemvMmaConfig(row_tiles=4, unroll=2, min_blocks=1, warps=8, full_batches=1)
_INT8_MID_MAX_M = 32
# Launch and loop variants of the modules above (warps is a launch choice, chains a define of its own module)
NARROW_CHAINS_GEMV_MMA = replace(NARROW_GEMV_MMA, chains=2)
NARROW_4W_GEMV_MMA = replace(NARROW_GEMV_MMA, warps=4)
LONG_K_CHAINS_GEMV_MMA = replace(SMALL_M_CHAINS_GEMV_MMA, warps=8)


def _splits(N: int, sm_count: int) -> int | None:
    """1 (K whole) unless N gives fewer 16-row tiles than a quarter of the SMs (None: GemvMmaPlan's split rule,
    which stays as it was: the tuned entries without ``splits`` were timed with it)."""
    return 1 if 4 * -(-N // 16) >= sm_count else None


def _narrow(M: int, bits: int, N: int, sm_count: int) -> bool:
    """Whether NARROW_GEMV_MMA takes the weight at M = 5..64: fewer 32-row blocks than half the SMs (than the SMs for
    int8 at M = 5..16)."""
    return (1 if bits == 8 and M <= _MID_M_MAX_M else 2) * -(-N // 32) < sm_count


def _small_m_config(bits: int, tiles: int, chunks: int, sm_count: int) -> GemvMmaConfig:
    """The M <= 4 variant for a weight of ``tiles`` 16-row tiles and ``chunks`` 16-byte chunks per row, also int8's at
    M = 5..8 from a tile per SM or on short K (the branches and their measurements: the comments above)."""
    if bits == 8 and chunks <= 64:
        return SHORT_K_GEMV_MMA
    if 2 * tiles < sm_count:  # narrow
        return NARROW_CHAINS_GEMV_MMA if bits == 4 and chunks <= 128 else LONG_K_CHAINS_GEMV_MMA
    if tiles < 2 * sm_count:
        if bits == 8:
            return NARROW_CHAINS_GEMV_MMA if chunks <= 128 else SMALL_M_FULL_GEMV_MMA
        if chunks >= 192:
            return SMALL_M_FULL_GEMV_MMA
        return SHORT_K_GEMV_MMA if chunks <= 64 and tiles >= sm_count else NARROW_GEMV_MMA
    if bits == 8 and chunks >= 1024:
        return GemvMmaConfig()
    if bits == 8 or chunks <= 64:
        return SHORT_K_GEMV_MMA
    if 112 <= chunks <= 128 and tiles < 6 * sm_count:
        return SMALL_M_CHAINS_GEMV_MMA
    if chunks >= 256 and -(-tiles // 2) <= 2 * sm_count:  # 32-row blocks
        return MID_M_GEMV_MMA
    return SMALL_M_GEMV_MMA


def default_gemv_mma_configs(M: int, bits: int) -> tuple[GemvMmaConfig, ...]:
    """Every compiled variant (module) :func:`default_gemv_mma_config` may pick for M rows of ``bits``-bit
    weights, whatever the shape and GPU: what the default dispatch can load."""
    if M <= _SMALL_M_MAX_M:
        return (SHORT_K_GEMV_MMA, NARROW_CHAINS_GEMV_MMA, LONG_K_CHAINS_GEMV_MMA, SMALL_M_FULL_GEMV_MMA) + (
            (NARROW_GEMV_MMA, SMALL_M_CHAINS_GEMV_MMA, MID_M_GEMV_MMA, SMALL_M_GEMV_MMA) if bits == 4 else
            (GemvMmaConfig(),))
    if M <= 8:
        return ((MID_M_GEMV_MMA, NARROW_GEMV_MMA, SHORT_K_GEMV_MMA) if bits == 4 else
                (SHORT_K_GEMV_MMA, NARROW_CHAINS_GEMV_MMA, SMALL_M_FULL_GEMV_MMA, NARROW_GEMV_MMA, GemvMmaConfig()))
    if M <= _MID_M_MAX_M:
        return (M16_INT8_GEMV_MMA, NARROW_GEMV_MMA) if bits == 8 else (MID_M_GEMV_MMA, M16_WIDE_GEMV_MMA,
                                                                        NARROW_GEMV_MMA, M16_INT8_GEMV_MMA)
    if bits == 8 and M <= _INT8_MID_MAX_M:
        return M32_INT8_GEMV_MMA, NARROW_GEMV_MMA, MID_M_GEMV_MMA
    return GemvMmaConfig(), NARROW_GEMV_MMA


def default_gemv_mma_config(M: int, bits: int, N: int, K: int, sm_count: int) -> GemvMmaConfig:
    """The gemv_mma variant the default dispatch uses for M rows of a ``bits``-bit N x K weight on a GPU of
    ``sm_count`` SMs, with its warps per block and K splits (:func:`default_gemv_mma_configs` names every module
    it may pick)."""
    return replace(_rule_variant(M, bits, N, K, sm_count), splits=_splits(N, sm_count))


def _rule_variant(M: int, bits: int, N: int, K: int, sm_count: int) -> GemvMmaConfig:
    """:func:`default_gemv_mma_config` before its K splits."""
    tiles, chunks = -(-N // 16), K // chunk_elems(bits)
    if M <= _SMALL_M_MAX_M or (bits == 8 and M <= 8 and (tiles >= sm_count or chunks <= 64)):
        return _small_m_config(bits, tiles, chunks, sm_count)
    if bits == 8 and M <= _INT8_MID_MAX_M and chunks <= 64:
        return NARROW_4W_GEMV_MMA
    if _narrow(M, bits, N, sm_count):  # int8 at M = 5..8 ends here at the latest (under a tile per SM)
        return NARROW_GEMV_MMA
    if bits == 4 and M <= _MID_M_MAX_M:
        if chunks <= 64 and (M <= 8 or tiles < 6 * sm_count):
            return SHORT_K_GEMV_MMA if M <= 8 else M16_INT8_GEMV_MMA
        return M16_WIDE_GEMV_MMA if M > 8 and -(-N // 64) >= sm_count else MID_M_GEMV_MMA
    if bits == 8 and M <= _MID_M_MAX_M:
        return M16_INT8_GEMV_MMA
    if bits == 8 and M <= _INT8_MID_MAX_M:
        if tiles < 2 * sm_count:
            return NARROW_4W_GEMV_MMA if chunks < 384 else MID_M_GEMV_MMA
        return M32_INT8_GEMV_MMA
    return GemvMmaConfig()


_STREAM_ROWS = StreamConfig().rows              # GEMV_STREAM_ROWS default: weight rows per warp
_STREAM_WARPS = StreamConfig().warps            # GEMV_STREAM_WARPS default: warps per block
_STREAM_MIN_BLOCKS = StreamConfig().min_blocks  # GEMV_STREAM_MIN_BLOCKS default: __launch_bounds__ blocks per SM
_STREAM_STATIC_SMEM = 64  # the kernel's static shared memory (amax_bits[8]), rounded up


@dataclass(frozen=True)
class StreamShape:
    """gemv_stream launch: ``splits`` K ranges (gridDim.y) of ``chunks_per_split`` 16-byte chunks,
    ``grid_x`` persistent blocks per split, ``smem`` bytes of dynamic shared memory per block."""

    splits: int
    chunks_per_split: int
    grid_x: int
    smem: int


def stream_launch_shape(M: int, N: int, K: int, bits: int, sm_count: int, smem_per_sm: int, smem_per_block: int,
                        smem_reserved: int, blocks_per_sm: int | None = None,
                        config: StreamConfig = StreamConfig()) -> StreamShape:
    """The gemv_stream launch for one problem on one GPU (pure arithmetic, no GPU needed).

    A block stages its K range of the M activation rows (2 bytes per element, plus an fp32 sum per
    chunk) in shared memory, which must leave room for ``config.min_blocks`` blocks per SM: K is
    split when it does not fit, and further when the row groups (``config.rows`` rows each) fill at
    most half of the warp slots (floor(slots / row groups) splits, each keeping >= 64 chunks).
    ``blocks_per_sm`` (the measured occupancy; None: ``config.min_blocks``) sizes the persistent grid:
    about one wave.
    """
    ce = chunk_elems(bits)
    chunks = K // ce
    row_groups = -(-N // config.rows)
    budget = min(smem_per_block, smem_per_sm // config.min_blocks - smem_reserved) - _STREAM_STATIC_SMEM
    chunk_bytes = M * (2 * ce + 4)
    cap = budget // chunk_bytes
    if cap < 1:
        raise ValueError(f"gemv_stream: {budget} bytes of shared memory per block cannot hold one chunk of "
                         f"M={M} activation rows")
    splits = -(-chunks // cap)
    slots = sm_count * config.min_blocks * config.warps
    splits = max(splits, min(slots // row_groups, chunks // 64))
    per_split = -(-chunks // splits)
    splits = -(-chunks // per_split)
    blocks_per_sm = config.min_blocks if blocks_per_sm is None else blocks_per_sm
    grid_x = max(1, min(-(-row_groups // config.warps), -(-sm_count * max(1, blocks_per_sm) // splits)))
    return StreamShape(splits, per_split, grid_x, M * per_split * (2 * ce + 4))


# ---------------------------------------------------------------------------------------------
# gemm_small_m (gemm_small_m.cu): warps split N, one shared activation tile per block
# ---------------------------------------------------------------------------------------------

SMALL_M_STAGE_TRIPS = 2      # kStageTrips: trips (4 chunks of K) per cp.async stage
SMALL_M_MIN_SPLIT_STAGES = 2  # a K split keeps at least this many stages (prologue and drain amortized)


@dataclass(frozen=True)
class GemmSmallMConfig:
    """A gemm_small_m kernel variant (gemm_small_m.cu ``GEMM_SMALL_M_*`` defines): ``row_tiles`` 16-row
    tiles of N per warp (4 only for M <= 32: the mt8 entry is not built with it), ``warps`` per block
    (they split N: a block covers 16 row_tiles warps rows), ``stages`` of the activation tile in shared
    memory, ``splits`` the K splits across blocks (None: :func:`small_m_launch_shape`'s rule)."""

    row_tiles: int = 2
    warps: int = 8
    stages: int = 3
    splits: int | None = None

    def __post_init__(self):
        for name, allowed in (("row_tiles", (1, 2, 4)), ("warps", (4, 8)), ("stages", (2, 3, 4))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GemmSmallMConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.splits is not None and (isinstance(self.splits, bool) or not isinstance(self.splits, int)
                                        or self.splits < 1):
            raise ValueError(f"GemmSmallMConfig.splits must be None or a positive int, got {self.splits!r}")

    @property
    def rows_per_block(self) -> int:
        """Rows of N per block."""
        return 16 * self.row_tiles * self.warps

    @property
    def max_m(self) -> int:
        """The largest M the variant's entry points take (8 x the largest M tile count built)."""
        return 32 if self.row_tiles == 4 else 64

    def defines(self) -> dict[str, int]:
        """The NVRTC defines that differ from the kernel's defaults (defaults compile as the plain file)."""
        base = GemmSmallMConfig()
        return {f"GEMM_SMALL_M_{k.upper()}": getattr(self, k) for k in ("row_tiles", "warps", "stages")
                if getattr(self, k) != getattr(base, k)}


def default_gemm_small_m_config(M: int, bits: int) -> GemmSmallMConfig:
    """The gemm_small_m variant the default dispatch uses: 2 activation stages (r2w8s2), the fastest or
    within 2% of it on every 8B shape at M = 32 / 64 in scripts/results/nvidia-h100/sweep_small_m.md."""
    return GemmSmallMConfig(stages=2)


def small_m_tiles(M: int) -> int:
    """M tiles of 8 rows of the entry point that runs M rows: gemm_small_m_mt{1,2,4,8}."""
    if not 1 <= M <= 64:
        raise ValueError(f"gemm_small_m takes 1 <= M <= 64, got M={M}")
    return next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)


def gemm_small_m_smem(m_tiles: int, bits: int, stages: int) -> int:
    """Dynamic shared memory of a gemm_small_m block: ``stages`` x 8 m_tiles activation rows, each the
    stage's K elements (2 bytes each) plus 16 bytes of bank padding (Geometry::kRowBytes)."""
    stage_k = SMALL_M_STAGE_TRIPS * 4 * chunk_elems(bits)
    return stages * 8 * m_tiles * (2 * stage_k + 16)


@dataclass(frozen=True)
class SmallMShape:
    """gemm_small_m launch: a grid of ``blocks_n`` x ``splits`` blocks, each split ``chunks_per_split``
    16-byte chunks of K (a multiple of the stage's chunks; the last split may be shorter)."""

    blocks_n: int
    splits: int
    chunks_per_split: int


def small_m_launch_shape(N: int, K: int, bits: int, sm_count: int, config: GemmSmallMConfig = GemmSmallMConfig(),
                         blocks_per_sm: int = 1) -> SmallMShape:
    """The gemm_small_m grid for one problem on one GPU (pure arithmetic, no GPU needed): :func:`staged_launch_shape`
    with its stages of ``SMALL_M_STAGE_TRIPS`` trips, each split keeping at least ``SMALL_M_MIN_SPLIT_STAGES``."""
    return staged_launch_shape(N, K, sm_count, config.rows_per_block, 4 * SMALL_M_STAGE_TRIPS * chunk_elems(bits),
                               chunk_elems(bits), SMALL_M_MIN_SPLIT_STAGES, config.splits, blocks_per_sm)


def staged_launch_shape(N: int, K: int, sm_count: int, rows_per_block: int, stage_elems: int, chunk: int,
                        min_split_stages: int, splits: int | None, blocks_per_sm: int = 1,
                        max_splits: int | None = None) -> SmallMShape:
    """The grid of a kernel whose blocks stage the activations (gemm_small_m, gemm_wgmma) for one problem on one GPU.

    N alone gives ceil(N / rows_per_block) blocks. When that leaves SMs without a block, K is split so that the
    grid is about one full wave of resident blocks (``blocks_per_sm``, the measured occupancy), each split a whole
    number of stages of ``stage_elems`` K elements (``chunk`` per 16-byte weight chunk) and at least
    ``min_split_stages`` of them; ``splits`` forces the count (capped at one stage per split); ``max_splits`` caps
    either."""
    chunks = K // chunk
    stage_chunks = stage_elems // chunk
    blocks_n = -(-N // rows_per_block)
    if splits is not None:
        splits = min(splits, -(-chunks // stage_chunks))
    elif blocks_n >= sm_count:
        splits = 1
    else:
        splits = min(max(1, sm_count * max(1, blocks_per_sm) // blocks_n),
                     max(1, chunks // (min_split_stages * stage_chunks)))
    if max_splits is not None:
        splits = min(splits, max_splits)
    per_split = -(-(-(-chunks // splits)) // stage_chunks) * stage_chunks
    return SmallMShape(blocks_n, -(-chunks // per_split), per_split)


# ---------------------------------------------------------------------------------------------
# gemm_wgmma (gemm_wgmma.cu, sm_90a): wgmma with the dequantized weights as the register A operand
# ---------------------------------------------------------------------------------------------

WGMMA_STAGE_ELEMS = 128      # kStageElems: K elements per activation stage (two 128-byte swizzle rows)
WGMMA_MIN_SPLIT_STAGES = 2   # a K split keeps at least this many stages
WGMMA_M_TILES = (1, 2, 4, 8, 16)  # entry points gemm_wgmma_mt{MT}: wgmma n = 8 MT
WGMMA_MAX_CLUSTER = 8        # the portable cluster size: K splits summed in one cluster (GemmWgmmaConfig.cluster)


@dataclass(frozen=True)
class GemmWgmmaConfig:
    """A gemm_wgmma kernel variant (gemm_wgmma.cu ``GEMM_WGMMA_*`` defines): ``warpgroups`` per block (each
    64 rows of N; they share the staged activations), ``stages`` of the activation tile in shared memory,
    ``prefetch`` weight trips in flight per lane, ``min_blocks`` the ``__launch_bounds__`` blocks per SM, ``overlap``
    (1) a trip's dequantization while the previous trip's wgmmas run (two fragment sets, stages >= 3),
    ``splits`` the K splits across blocks (None: :func:`wgmma_launch_shape`'s rule), ``cluster`` (1) the K splits of
    a block of rows launched as one thread-block cluster that sums them through distributed shared memory (at most
    ``WGMMA_MAX_CLUSTER`` splits; no fp32 workspace, no splitk_reduce launch)."""

    warpgroups: int = 2
    stages: int = 4
    prefetch: int = 2
    min_blocks: int = 1
    overlap: int = 0
    splits: int | None = None
    cluster: int = 0

    def __post_init__(self):
        for name, allowed in (("warpgroups", (1, 2, 4)), ("stages", (2, 3, 4, 5, 6)), ("prefetch", (2, 4, 8)),
                              ("min_blocks", (1, 2, 3, 4)), ("overlap", (0, 1)), ("cluster", (0, 1))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GemmWgmmaConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.splits is not None and (isinstance(self.splits, bool) or not isinstance(self.splits, int)
                                        or self.splits < 1):
            raise ValueError(f"GemmWgmmaConfig.splits must be None or a positive int, got {self.splits!r}")
        if self.overlap and self.stages < 3:
            raise ValueError(f"GemmWgmmaConfig.stages must be >= 3 with overlap=1 (one more stage buffer stays "
                             f"unwritten), got {self.stages}")

    @property
    def rows_per_block(self) -> int:
        """Rows of N per block."""
        return 64 * self.warpgroups

    def defines(self) -> dict[str, int]:
        """The NVRTC defines that differ from the kernel's defaults (defaults compile as the plain file)."""
        base = GemmWgmmaConfig()
        return {f"GEMM_WGMMA_{k.upper()}": getattr(self, k) for k in ("warpgroups", "stages", "prefetch", "min_blocks",
                                                                      "overlap", "cluster")
                if getattr(self, k) != getattr(base, k)}


def default_gemm_wgmma_config(M: int, bits: int = 4) -> GemmWgmmaConfig:
    """The gemm_wgmma variant the default dispatch uses (H200, block 128, us; twentieth session): 2 warpgroups per
    block, 3 stages and 2 blocks per SM (128 registers) up to M = 32 for int4 and M = 64 for int8, else 4 warpgroups
    per block (256 rows of N share one staged activation tile; 1 block of 512 threads at <= 128 registers) and 3
    stages. ``tune_weight_only.md`` (the 18 Llama weights, 5 variants among 25 candidates): the fastest candidate
    was a 2-warpgroup gemm_wgmma on 13 int4 weights at M = 32 (a 4-warpgroup one on none; 8B gate 14336 x 4096
    26.9 vs 30.0 us), a 4-warpgroup one on 14 int4 weights at M = 64 (2-warpgroup: 4), and a 2-warpgroup one on 16
    int8 weights at M = 64 (4-warpgroup: none). M = 128: down 4096 x 14336 W8 51.2 vs 70.8 with 2 warpgroups and
    4 stages. A trip's dequantization overlapped with the previous trip's wgmmas (``overlap=1``: two
    fragment sets, 255 registers, one block per SM) and 4 trips of weight loads in flight were slower on every
    8B weight at M = 16..128."""
    if wgmma_tiles(M) <= (8 if bits == 8 else 4):
        return GemmWgmmaConfig(stages=3, min_blocks=2)
    return GemmWgmmaConfig(warpgroups=4, stages=3)


def wgmma_tiles(M: int) -> int:
    """M tiles of 8 rows of the entry point that runs M rows: gemm_wgmma_mt{1,2,4,8,16}."""
    if not 1 <= M <= 8 * WGMMA_M_TILES[-1]:
        raise ValueError(f"gemm_wgmma takes 1 <= M <= {8 * WGMMA_M_TILES[-1]}, got M={M}")
    return next(mt for mt in WGMMA_M_TILES if M <= 8 * mt)


def gemm_wgmma_smem(m_tiles: int, stages: int, cluster_warpgroups: int = 0) -> int:
    """Dynamic shared memory of a gemm_wgmma block: ``stages`` x 8 m_tiles activation rows of 128 K elements
    (2 bytes each), at least the fp32 accumulators of ``cluster_warpgroups`` warpgroups (the cluster sum of
    ``GemmWgmmaConfig.cluster`` puts them there: 64 rows x 8 m_tiles each), plus 1024 bytes to align the stages
    to the swizzle's 1024-byte period."""
    return max(stages * 8 * m_tiles * 2 * WGMMA_STAGE_ELEMS, cluster_warpgroups * 64 * 8 * m_tiles * 4) + 1024


def wgmma_launch_shape(N: int, K: int, bits: int, sm_count: int, config: GemmWgmmaConfig = GemmWgmmaConfig(),
                       blocks_per_sm: int = 1, max_clusters: Callable[[int], int] | None = None) -> SmallMShape:
    """The gemm_wgmma grid for one problem on one GPU (pure arithmetic, no GPU needed): :func:`staged_launch_shape`
    with its stages of ``WGMMA_STAGE_ELEMS``, each split keeping at least ``WGMMA_MIN_SPLIT_STAGES``.

    The cluster sum (``config.cluster``) takes at most ``WGMMA_MAX_CLUSTER`` splits, and fewer while the
    ``blocks_n`` clusters of S splits would not all be resident at once: ``max_clusters(S)``, the device's count
    (``Kernel.max_active_clusters``), is below SMs x blocks per SM / S when clusters do not tile the SMs of each GPC,
    and a cluster launch past it runs a second wave."""
    def shape(max_splits):
        return staged_launch_shape(N, K, sm_count, config.rows_per_block, WGMMA_STAGE_ELEMS, chunk_elems(bits),
                                   WGMMA_MIN_SPLIT_STAGES, config.splits, blocks_per_sm, max_splits)

    if not config.cluster:
        return shape(None)
    fitted = shape(WGMMA_MAX_CLUSTER)
    while max_clusters is not None and fitted.splits > 1 and fitted.blocks_n > max_clusters(fitted.splits):
        fitted = shape(fitted.splits - 1)
    return fitted
