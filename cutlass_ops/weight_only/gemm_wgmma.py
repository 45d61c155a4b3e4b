"""Strategy "gemm_wgmma": weight-only GEMM for M <= 128 on Hopper's wgmma (gemm_wgmma.cu
``gemm_wgmma_mt{1,2,4,8,16}``), fp16/bf16, sm_90a only. gemv_mma's swapped operands and converters, with the
dequantized weights as wgmma's register A operand and the activations staged (K-permuted, swizzled) in shared
memory as its B operand; each block's warpgroups share the staged activations; K is split across blocks when N
leaves SMs idle (splitk.py)."""
from __future__ import annotations

from custom_kernels.device import sm_count

from .gemm_small_m import build_staged
from .shared import ELEMENT, wo_defines
from .splitk import SplitKGemvPlan, reduce_kernel
from .variants import GemmWgmmaConfig, default_gemm_wgmma_config, gemm_wgmma_smem, wgmma_launch_shape, wgmma_tiles

__all__ = ["GemmWgmmaPlan", "SOURCE"]

SOURCE = "gemm_wgmma.cu"


class GemmWgmmaPlan(SplitKGemvPlan):
    strategy = "gemm_wgmma"
    config_type = GemmWgmmaConfig

    @staticmethod
    def kernels(M: int, dtype, bits: int, config: GemmWgmmaConfig | None = None) -> tuple:
        """(source, kernel, defines) of every kernel the plan for M rows may load, with the split-K reduction."""
        config = config or default_gemm_wgmma_config(M, bits)
        return ((SOURCE, f"gemm_wgmma_mt{wgmma_tiles(M)}", wo_defines(dtype, bits, config)),
                reduce_kernel(ELEMENT[dtype]))

    def __init__(self, qw, M: int, dtype, device: int, config: GemmWgmmaConfig | None = None):
        config = config or default_gemm_wgmma_config(M, qw.bits)
        m_tiles = wgmma_tiles(M)
        build_staged(self, qw, M, dtype, device, config, source=SOURCE, name=f"gemm_wgmma_mt{m_tiles}",
                     smem=gemm_wgmma_smem(m_tiles, config.stages, config.cluster * config.warpgroups),
                     threads=128 * config.warpgroups, cluster_sum=bool(config.cluster),
                     launch_shape=lambda occupancy, max_clusters: wgmma_launch_shape(
                         qw.N, qw.K, qw.bits, sm_count(device), config, occupancy, max_clusters))
