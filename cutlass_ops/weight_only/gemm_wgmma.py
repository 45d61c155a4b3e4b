"""Strategy "gemm_wgmma": weight-only GEMM for M <= 128 on Hopper's wgmma (gemm_wgmma.cu
``gemm_wgmma_mt{1,2,4,8,16}``), fp16/bf16, sm_90a only. gemv_mma's swapped operands and converters, with the
dequantized weights as wgmma's register A operand and the activations staged (K-permuted, swizzled) in shared
memory as its B operand; each block's warpgroups share the staged activations; K is split across blocks when N
leaves SMs idle (splitk.py)."""
from __future__ import annotations

import logging
import math

from custom_kernels.device import sm_count
from custom_kernels.launch import Launch, LaunchConfig, load_kernel

from .gemm_small_m import GemmSmallMArgs
from .shared import ELEMENT, aligned_qweight, derived, scale_offset_words, wo_defines
from .splitk import SplitKGemvPlan, reduce_kernel
from .variants import (
    GemmWgmmaConfig, chunk_elems, default_gemm_wgmma_config, gemm_wgmma_smem, wgmma_launch_shape, wgmma_tiles,
)

log = logging.getLogger(__name__)

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
        K, N, G = qw.K, qw.N, qw.num_groups
        group_shift = 30 if G == 1 else int(math.log2(qw.block_size // chunk_elems(qw.bits)))
        smem = gemm_wgmma_smem(m_tiles, config.stages)
        name = f"gemm_wgmma_mt{m_tiles}"
        kernel = load_kernel(SOURCE, name, wo_defines(dtype, qw.bits, config), device=device)
        kernel.set_max_dynamic_smem(smem)
        threads = 128 * config.warpgroups
        occupancy = kernel.max_active_blocks(threads, smem, device)
        if occupancy < 1:
            raise RuntimeError(f"{name} {config} cannot run with {smem} bytes of shared memory on device {device}")
        shape = wgmma_launch_shape(N, K, qw.bits, sm_count(device), config, occupancy)
        qweight = aligned_qweight(qw)
        so = scale_offset_words(qw, dtype)
        args = GemmSmallMArgs(B=qweight.data_ptr(), scale_offset=so.data_ptr(), M=M, N=N, K=K, G=G,
                              group_shift=group_shift, chunks_per_split=shape.chunks_per_split)
        gemm = Launch(kernel, LaunchConfig.of((shape.blocks_n, shape.splits), threads, smem=smem), args, device)
        super().__init__(gemm, shape.splits, M, N, ELEMENT[dtype], device, keep=(so, derived(qweight, qw.qweight)))
        self.config, self.shape, self.occupancy = config, shape, occupancy  # what ran (benchmarks report it)
