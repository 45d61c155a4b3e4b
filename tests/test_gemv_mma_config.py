"""The default gemv_mma variant and launch choices at small M (pure arithmetic, no GPU)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cutlass_ops.weight_only.variants import (
    LONG_K_CHAINS_GEMV_MMA, M16_INT8_GEMV_MMA, M16_WIDE_GEMV_MMA, M32_INT8_GEMV_MMA, MID_M_GEMV_MMA,
    NARROW_4W_GEMV_MMA, NARROW_CHAINS_GEMV_MMA, NARROW_GEMV_MMA, SHORT_K_GEMV_MMA, SMALL_M_FULL_GEMV_MMA,
    SMALL_M_CHAINS_GEMV_MMA, SMALL_M_GEMV_MMA, GemvMmaConfig, default_gemv_mma_config, default_gemv_mma_configs,
)

H100_SMS = 132


@pytest.mark.parametrize("bits, N, K, expected", [
    # narrow (fewer 16-row tiles than half the SMs): two accumulator sets; eight trips at 8 warps once K is long
    (4, 896, 896, NARROW_CHAINS_GEMV_MMA),          # Qwen2.5-0.5B o: 1.00x the fastest (NARROW_GEMV_MMA 1.14x)
    (4, 1024, 4096, NARROW_CHAINS_GEMV_MMA),        # 128 chunks
    (4, 1024, 8192, LONG_K_CHAINS_GEMV_MMA),        # 70B k: 1.01x (NARROW_GEMV_MMA 1.10x)
    (8, 896, 896, SHORT_K_GEMV_MMA),       # int8 at <= 64 chunks: 4 warps (8: 1.13x)
    (8, 1024, 4096, LONG_K_CHAINS_GEMV_MMA),        # 8B k int8: 1.00x (NARROW_GEMV_MMA 1.24x)
    # under 2 tiles per SM: one tile at 2 blocks per SM with full batches; eight trips from 192 chunks
    (4, 4096, 4096, NARROW_GEMV_MMA),      # 8B o: 1.00x (SMALL_M_GEMV_MMA 1.24x)
    (4, 2048, 2048, NARROW_GEMV_MMA),      # 128 tiles: under one per SM, 8 warps
    (4, 3072, 2048, SHORT_K_GEMV_MMA),     # 1B qkv, 64 chunks and >= a tile per SM: 4 warps (8: 1.31x)
    (4, 4096, 14336, SMALL_M_FULL_GEMV_MMA),  # 8B down
    (8, 2048, 2048, NARROW_CHAINS_GEMV_MMA),        # int8, <= 128 chunks
    (8, 4096, 4096, SMALL_M_FULL_GEMV_MMA),
    # >= 2 tiles per SM
    (8, 28672, 4096, SHORT_K_GEMV_MMA),    # every int8 weight there but the longest
    (8, 8192, 28672, GemvMmaConfig()),     # 70B down int8, 1792 chunks: 1.00-1.03x (4 warps, two sets 1.04-1.11x)
    (4, 16384, 2048, SHORT_K_GEMV_MMA),    # 1B gate_up, 64 chunks: 1.05x (SMALL_M_GEMV_MMA 1.51x)
    (4, 6144, 4096, SMALL_M_CHAINS_GEMV_MMA),   # 8B qkv: 1.00x (SMALL_M_GEMV_MMA 1.36x)
    (4, 12287, 4096, SMALL_M_CHAINS_GEMV_MMA),  # 768 tiles: under 6 per SM
    (4, 12800, 4096, SMALL_M_GEMV_MMA),         # 800 tiles: the plain form
    (4, 9216, 3072, SMALL_M_GEMV_MMA),     # Phi-3 qkv, 96 chunks: 1.00x (two sets 1.26x)
    (4, 8192, 8192, MID_M_GEMV_MMA),       # 70B o: 256 32-row blocks, one wave at 2 per SM: 1.00x (1.31x)
    (4, 8192, 28672, MID_M_GEMV_MMA),
    (4, 10240, 8192, SMALL_M_GEMV_MMA),    # 70B qkv: 320 blocks of 32 rows, a second wave
    (4, 28672, 4096, SMALL_M_GEMV_MMA),    # wide
])
@pytest.mark.parametrize("M", [1, 4])
def test_small_m_rule(M, bits, N, K, expected):
    """The M <= 4 variant by row tiles per SM and chunks per row (the reason of each case: its comment; H200
    times relative to the fastest of 24 variants); always among the modules ``default_gemv_mma_configs`` names,
    K whole from a 16-row tile per four SMs."""
    cfg = default_gemv_mma_config(M, bits, N, K, H100_SMS)
    assert cfg == replace(expected, splits=1)
    assert any(cfg.defines() == c.defines() for c in default_gemv_mma_configs(M, bits))


@pytest.mark.parametrize("M, bits, N, K, expected", [
    # short K (<= 64 chunks) from M = 5 (H200, M = 8 / 16, relative to the fastest of the tuner's candidates)
    (8, 4, 3072, 2048, SHORT_K_GEMV_MMA),      # 1B qkv int4: 1.00x (two row tiles 1.35x)
    (8, 4, 16384, 2048, SHORT_K_GEMV_MMA),     # 1B gate_up: 1.02x (1.46x)
    (8, 4, 2048, 2048, NARROW_GEMV_MMA),       # 1B o, under a 32-row block per two SMs: narrow first (1.00x)
    (16, 4, 3072, 2048, M16_INT8_GEMV_MMA),    # 1B qkv at M = 16: r2u2 1.03x (two row tiles, four trips 1.44x)
    (16, 4, 9728, 896, M16_INT8_GEMV_MMA),     # Qwen2.5-0.5B gate_up: 1.00x (four row tiles 1.19x)
    (16, 4, 16384, 2048, M16_WIDE_GEMV_MMA),   # >= 6 tiles per SM: four row tiles stay (1.00x, r2u2 1.13x)
    (8, 8, 9728, 896, SHORT_K_GEMV_MMA),       # int8 at M = 8 as at M <= 4: 1.00x (the default 1.61x)
    (8, 8, 1152, 896, SHORT_K_GEMV_MMA),
    (16, 8, 1152, 896, NARROW_4W_GEMV_MMA),  # Qwen2.5-0.5B qkv int8 M = 16: 1.01x (8 warps 1.25x)
    (16, 8, 9728, 896, NARROW_4W_GEMV_MMA),  # 1.00x (r2u2 1.07x)
])
def test_short_k_rule_from_m5(M, bits, N, K, expected):
    cfg = default_gemv_mma_config(M, bits, N, K, H100_SMS)
    assert cfg == replace(expected, splits=1)
    assert any(cfg.defines() == c.defines() for c in default_gemv_mma_configs(M, bits))


@pytest.mark.parametrize("N, K, expected", [
    (896, 896, NARROW_4W_GEMV_MMA),     # Qwen2.5-0.5B o, 56 chunks: 1.01x the fastest (wgmma 2.4x)
    (1024, 4096, NARROW_GEMV_MMA),                     # 8B k: 1.00x (wgmma 1.19x)
    (3072, 3072, NARROW_4W_GEMV_MMA),   # 3B o: 1.00x (wgmma 1.23x)
    (4096, 14336, MID_M_GEMV_MMA),                     # 8B down, 896 chunks: 1.00x (wgmma 1.17x)
    (8192, 8192, M32_INT8_GEMV_MMA),                   # 70B o: 1.00x (wgmma 1.31x)
    (57344, 8192, M32_INT8_GEMV_MMA),                  # 70B gate_up: 1.00x (wgmma 1.24x)
])
@pytest.mark.parametrize("M", [17, 32])
def test_int8_rule_m17_to_32(M, N, K, expected):
    cfg = default_gemv_mma_config(M, 8, N, K, H100_SMS)
    assert cfg == replace(expected, splits=1)
    assert any(cfg.defines() == c.defines() for c in default_gemv_mma_configs(M, 8))


def test_small_m_modules():
    """M <= 4 needs three modules for both widths (two sets at one or eight trips, eight trips with full batches),
    int4 three more (one trip at full batches, two row tiles, the plain eight-trip form), int8 the M = 64 default;
    M = 5 takes the M = 5..8 rule."""
    modules = lambda M, bits: {frozenset(c.defines().items()) for c in default_gemv_mma_configs(M, bits)}
    assert len(modules(1, 8)) == 4 and len(modules(4, 4)) == 6 and len(modules(1, 8) & modules(1, 4)) == 3
    assert frozenset(SMALL_M_GEMV_MMA.defines().items()) in modules(1, 4)
    assert default_gemv_mma_config(5, 4, 6144, 4096, H100_SMS) == replace(MID_M_GEMV_MMA, splits=1)
    assert default_gemv_mma_config(1, 4, 512, 4096, H100_SMS).splits is None  # 32 tiles: K split (the plan's rule)


@pytest.mark.parametrize("M, bits, N, module, splits", [
    (5, 4, 4096, MID_M_GEMV_MMA, 1),
    (8, 4, 2112, MID_M_GEMV_MMA, 1),       # 66 blocks of 32 rows: half the SMs
    (8, 4, 2048, NARROW_GEMV_MMA, 1),      # 64: one row tile (2048 x 2048 W4 4.4 -> 3.5 us)
    (8, 8, 4224, SHORT_K_GEMV_MMA, 1),     # int8 at M = 5..8 from a 16-row tile per SM: the M <= 4 rule
    (8, 8, 4096, SMALL_M_FULL_GEMV_MMA, 1),
    (8, 8, 2048, NARROW_GEMV_MMA, 1),      # under a tile per SM: one row tile (below a 32-row block per SM)
    (32, 8, 4096, NARROW_GEMV_MMA, 1),     # int8 at M = 17..32: one row tile (at 4 warps) below 2 tiles per SM
    (32, 8, 8448, M32_INT8_GEMV_MMA, 1),   # from 2 tiles per SM four row tiles, two trips
    (32, 8, 4096 + 16, NARROW_GEMV_MMA, 1),
    (40, 8, 4096, GemvMmaConfig(), 1),     # above M = 32 the default
    (8, 4, 512, NARROW_GEMV_MMA, None),
    (16, 4, 8192, MID_M_GEMV_MMA, 1),      # 128 blocks of 64 rows: too few for four row tiles
    (9, 4, 8448, M16_WIDE_GEMV_MMA, 1),    # 132 blocks of 64 rows: one per SM
    (16, 4, 28672, M16_WIDE_GEMV_MMA, 1),
    (16, 8, 28672, M16_INT8_GEMV_MMA, 1),  # int8: r2u2 at M = 9..16 from 4224 rows
    (16, 8, 1000, NARROW_GEMV_MMA, 1),
    (16, 8, 4096, NARROW_GEMV_MMA, 1),     # int8 at M = 9..16: one row tile below a 32-row block per SM
    (17, 4, 4096, GemvMmaConfig(), 1),     # above M = 16 the default module, K whole too
    (64, 8, 1024, NARROW_GEMV_MMA, 1),
])
def test_rule_from_m5(M, bits, N, module, splits):
    """The rule's module depends on M, bits and N, always among the modules ``default_gemv_mma_configs`` (and so
    ``kernels()``) names; K splits only below a 16-row tile per four SMs."""
    cfg = default_gemv_mma_config(M, bits, N, 4096, H100_SMS)
    assert cfg.defines() == module.defines() and cfg.splits == splits
    assert module in default_gemv_mma_configs(M, bits)


def test_chains_and_full_batches_reach_the_kernel():
    """The two loop knobs become NVRTC defines only when set (the defaults compile the module as before), and
    out-of-range values are refused naming the field."""
    assert GemvMmaConfig(chains=2, full_batches=1).defines() == {"GEMV_MMA_CHAINS": 2, "GEMV_MMA_FULL_BATCHES": 1}
    assert GemvMmaConfig(chains=1, full_batches=0).defines() == {}
    with pytest.raises(ValueError, match="GemvMmaConfig.chains must be one of"):
        GemvMmaConfig(chains=3)
    with pytest.raises(ValueError, match="GemvMmaConfig.full_batches must be one of"):
        GemvMmaConfig(full_batches=2)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("M", [1, 4, 5, 8, 9, 16, 17, 32, 33, 64])
def test_module_lists_are_exact(M, bits):
    """``default_gemv_mma_configs`` names every module the rule picks over a grid of shapes and SM counts, and no
    module it never picks (the list is what the wheel ships and the tuner precompiles)."""
    listed = {frozenset(c.defines().items()) for c in default_gemv_mma_configs(M, bits)}
    picked = {frozenset(default_gemv_mma_config(M, bits, N, K, sms).defines().items())
              for sms in (78, 108, 132) for N in range(256, 60000, 400)
              for K in (512, 896, 1024, 1088, 2048, 3072, 3584, 4096, 6208, 8192, 16384, 28672)}
    assert picked == listed
