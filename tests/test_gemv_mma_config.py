"""The default gemv_mma variant and launch choices at small M (pure arithmetic, no GPU)."""
from __future__ import annotations

import pytest

from cutlass_ops.weight_only.variants import (
    M16_INT8_GEMV_MMA, M16_WIDE_GEMV_MMA, MID_M_GEMV_MMA, NARROW_GEMV_MMA, SMALL_M_GEMV_MMA, GemvMmaConfig,
    default_gemv_mma_config, default_gemv_mma_configs,
)

H100_SMS = 132


@pytest.mark.parametrize("bits", [4, 8])
def test_small_m_variant_is_one_module(bits):
    """Shape-aware choices change only launch parameters down to N = 8 x SMs: the compiled module (its defines)
    is the one ``kernels()`` names first from M and bits alone."""
    for N, K in [(4096, 4096), (4096, 14336), (2048, 2048), (6144, 4096), (1056, 16384)]:
        cfg = default_gemv_mma_config(1, bits, N, K, H100_SMS)
        assert cfg.defines() == default_gemv_mma_configs(1, bits)[0].defines() == SMALL_M_GEMV_MMA.defines()
    assert default_gemv_mma_configs(1, bits) == (SMALL_M_GEMV_MMA, NARROW_GEMV_MMA)


@pytest.mark.parametrize("M, bits, N, module, splits", [
    (1, 4, 1040, NARROW_GEMV_MMA, 1),      # 65 16-row tiles for 132 SMs: one row tile, 8 warps, K whole
    (4, 8, 512, NARROW_GEMV_MMA, None),    # 32 tiles: under a quarter of the SMs, K split (GemvMmaPlan's rule)
    (5, 4, 4096, MID_M_GEMV_MMA, 1),
    (8, 4, 2112, MID_M_GEMV_MMA, 1),       # 66 blocks of 32 rows: half the SMs
    (8, 4, 2048, NARROW_GEMV_MMA, 1),      # 64: one row tile (2048 x 2048 W4 4.4 -> 3.5 us)
    (8, 8, 4224, GemvMmaConfig(), 1),      # int8 at M = 5..8: 132 blocks of 32 rows, no full batches
    (8, 8, 4096, NARROW_GEMV_MMA, 1),      # int8 at M = 5..16: one row tile below a 32-row block per SM
    (32, 8, 4096, GemvMmaConfig(), 1),     # but not above M = 16
    (8, 4, 512, NARROW_GEMV_MMA, None),
    (16, 4, 8192, MID_M_GEMV_MMA, 1),      # 128 blocks of 64 rows: too few for four row tiles
    (9, 4, 8448, M16_WIDE_GEMV_MMA, 1),    # 132 blocks of 64 rows: one per SM
    (16, 4, 28672, M16_WIDE_GEMV_MMA, 1),
    (16, 8, 28672, M16_INT8_GEMV_MMA, 1),  # int8: r2u2 at M = 9..16 from 4224 rows
    (16, 8, 1000, NARROW_GEMV_MMA, 1),
    (17, 4, 4096, GemvMmaConfig(), 1),     # above M = 16 the default module, K whole too
    (64, 8, 1024, NARROW_GEMV_MMA, 1),
])
def test_rule_from_m5(M, bits, N, module, splits):
    """The rule's module depends on M, bits and N, always among the modules ``default_gemv_mma_configs`` (and so
    ``kernels()``) names; K splits only below a 16-row tile per four SMs."""
    cfg = default_gemv_mma_config(M, bits, N, 4096, H100_SMS)
    assert cfg.defines() == module.defines() and cfg.splits == splits
    assert module in default_gemv_mma_configs(M, bits)


@pytest.mark.parametrize("bits, N, K, warps, splits", [
    (4, 4096, 14336, 8, 1),   # 256 blocks, 448 chunks: 8 warps
    (8, 4096, 4096, 8, 1),    # 256 chunks of int8
    (4, 4096, 4096, 4, 1),    # 128 chunks: too few for 8 warps
    (4, 6144, 4096, 4, 1),    # 384 blocks > 2 per SM
    (4, 2048, 2048, 4, 1),    # 128 blocks: still no K split
    (8, 2048, 8192, 8, 1),
    (4, 1056, 16384, 8, 1),   # 66 blocks for 132 SMs: the last N of SMALL_M_GEMV_MMA
])
def test_small_m_launch_choices(bits, N, K, warps, splits):
    cfg = default_gemv_mma_config(1, bits, N, K, H100_SMS)
    assert (cfg.warps, cfg.splits) == (warps, splits)


def test_chains_and_full_batches_reach_the_kernel():
    """The two loop knobs become NVRTC defines only when set (the defaults compile the module as before), and
    out-of-range values are refused naming the field."""
    assert GemvMmaConfig(chains=2, full_batches=1).defines() == {"GEMV_MMA_CHAINS": 2, "GEMV_MMA_FULL_BATCHES": 1}
    assert GemvMmaConfig(chains=1, full_batches=0).defines() == {}
    with pytest.raises(ValueError, match="GemvMmaConfig.chains must be one of"):
        GemvMmaConfig(chains=3)
    with pytest.raises(ValueError, match="GemvMmaConfig.full_batches must be one of"):
        GemvMmaConfig(full_batches=2)
