"""Strategy "gemm_simt": the CUDA-core GEMM that runs anything (gemm_simt.cu ``gemm_simt``): 64 x 64
tiles, weights dequantized to fp32 in shared memory, fp32 arithmetic with the fp32 scale / offset."""
from __future__ import annotations

from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import SingleLaunchPlan, block_shift, wo_defines

__all__ = ["GemmSimtArgs", "GemmSimtPlan"]

TILE = 64      # kSimtBM = kSimtBN
THREADS = 256  # kSimtThreads


class GemmSimtArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("D", Ptr), ("M", I32),
                ("N", I32), ("K", I32), ("G", I32), ("block_size", I32), ("block_shift", I32), ("act", I32)]


class GemmSimtPlan(SingleLaunchPlan):
    strategy = "gemm_simt"

    @staticmethod
    def kernels(M: int, dtype, bits: int, config=None) -> tuple:
        """(source, kernel, defines) of the kernel the plan loads (one for every M)."""
        return (("gemm_simt.cu", "gemm_simt", wo_defines(dtype, bits)),)

    def __init__(self, qw, M: int, dtype, device: int, config=None):
        (kernel,) = self.kernels(M, dtype, qw.bits)
        kernel = load_kernel(*kernel, device=device)
        args = GemmSimtArgs(B=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(), offset=qw.offset.data_ptr(),
                            M=M, N=qw.N, K=qw.K, G=qw.num_groups, block_size=qw.block_size,
                            block_shift=block_shift(qw))
        config = LaunchConfig.of((-(-qw.N // TILE), -(-M // TILE)), THREADS)
        self.launch = Launch(kernel, config, args, device)
