"""The default gemv_mma variant and launch choices at small M (pure arithmetic, no GPU)."""
from __future__ import annotations

import pytest

from cutlass_ops.weight_only.variants import SMALL_M_GEMV_MMA, GemvMmaConfig, default_gemv_mma_config

H100_SMS = 132


@pytest.mark.parametrize("bits", [4, 8])
def test_small_m_variant_is_one_module(bits):
    """Shape-aware choices change only launch parameters: the compiled module (its defines) is the one
    ``kernels()`` names from M and bits alone."""
    for N, K in [(4096, 4096), (4096, 14336), (2048, 2048), (6144, 4096), (1024, 16384)]:
        cfg = default_gemv_mma_config(1, bits, N, K, H100_SMS)
        assert cfg.defines() == default_gemv_mma_config(1, bits).defines() == SMALL_M_GEMV_MMA.defines()
    assert default_gemv_mma_config(5, bits, 4096, 4096, H100_SMS) == GemvMmaConfig()


@pytest.mark.parametrize("bits, N, K, warps, splits", [
    (4, 4096, 14336, 8, 1),   # 256 blocks, 448 chunks: 8 warps
    (8, 4096, 4096, 8, 1),    # 256 chunks of int8
    (4, 4096, 4096, 4, 1),    # 128 chunks: too few for 8 warps
    (4, 6144, 4096, 4, 1),    # 384 blocks > 2 per SM
    (4, 2048, 2048, 4, 1),    # 128 blocks: still no K split
    (8, 2048, 8192, 8, 1),
    (4, 1024, 16384, 8, None),  # 64 blocks for 132 SMs: GemvMmaPlan's rule splits K
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
