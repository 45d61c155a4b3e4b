"""Strategy "gemm_mma": tensor-core GEMM for any M (gemm_mma.cu ``gemm_mma_mt{4,8}``), fp16/bf16,
sm_80+: a 4-stage cp.async pipeline, weights dequantized in registers into mma.m16n8k16 fragments."""
from __future__ import annotations

from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import SingleLaunchPlan, block_shift, scale_offset_words, wo_defines
from .variants import GemmConfig, default_gemm_config

__all__ = ["GemmMmaArgs", "GemmMmaPlan", "gemm_mma_smem"]

BLOCK_N = 128  # kBN: N per CTA
THREADS = 256  # kThreads: 8 warps


def gemm_mma_smem(m_tile: int, bits: int) -> int:
    """Dynamic shared memory of the gemm_mma kernels: 4 stages of A, B and (scale, offset) tiles."""
    bn, bk, stages = BLOCK_N, 64, 4
    return stages * (m_tile * bk * 2 + bn * bk * bits // 8 + bn * (bk // 16) * 4)


class GemmMmaArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale_offset", Ptr), ("bias", Ptr), ("D", Ptr), ("M", I32), ("N", I32),
                ("K", I32), ("G", I32), ("block_size", I32), ("block_shift", I32), ("act", I32)]


class GemmMmaPlan(SingleLaunchPlan):
    strategy = "gemm_mma"
    config_type = GemmConfig

    @staticmethod
    def kernels(M: int, dtype, bits: int, config: GemmConfig | None = None) -> tuple:
        """(source, kernel, defines) of the kernel the plan for M rows loads (the config picks the entry
        point, not the module)."""
        return (("gemm_mma.cu", (config or default_gemm_config(M)).kernel_name(), wo_defines(dtype, bits)),)

    def __init__(self, qw, M: int, dtype, device: int, config: GemmConfig | None = None):
        config = config or default_gemm_config(M)
        smem = gemm_mma_smem(config.m_tile, qw.bits)
        (kernel,) = self.kernels(M, dtype, qw.bits, config)
        kernel = load_kernel(*kernel, device=device)
        kernel.set_max_dynamic_smem(smem)
        tiles = -(-M // config.m_tile) * -(-qw.N // BLOCK_N)
        so = scale_offset_words(qw, dtype)
        args = GemmMmaArgs(B=qw.qweight.data_ptr(), scale_offset=so.data_ptr(), M=M, N=qw.N, K=qw.K,
                           G=qw.num_groups, block_size=qw.block_size, block_shift=block_shift(qw))
        self.launch = Launch(kernel, LaunchConfig.of(tiles, THREADS, smem=smem), args, device)
        self._keep = so
