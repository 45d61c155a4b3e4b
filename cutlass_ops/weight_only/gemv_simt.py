"""Strategy "gemv_simt": CUDA-core GEMV for M <= 8, any activation type and arch (gemv_simt.cu
``gemv_simt_m{1..8}``): one warp per output row, fp32 arithmetic with the fp32 scale / offset."""
from __future__ import annotations

from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import SingleLaunchPlan, wo_defines

__all__ = ["GemvSimtArgs", "GemvSimtPlan"]

ROWS_PER_BLOCK = 4  # warps per block of 128 threads (the kernel's __launch_bounds__)


class GemvSimtArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("D", Ptr),
                ("N", I32), ("K", I32), ("G", I32), ("block_size", I32), ("act", I32)]


class GemvSimtPlan(SingleLaunchPlan):
    strategy = "gemv_simt"

    @staticmethod
    def kernels(M: int, dtype, bits: int, config=None) -> tuple:
        """(source, kernel, defines) of the kernel the plan for M rows loads."""
        return (("gemv_simt.cu", f"gemv_simt_m{M}", wo_defines(dtype, bits)),)

    def __init__(self, qw, M: int, dtype, device: int, config=None):
        (kernel,) = self.kernels(M, dtype, qw.bits)
        kernel = load_kernel(*kernel, device=device)
        args = GemvSimtArgs(B=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(), offset=qw.offset.data_ptr(),
                            N=qw.N, K=qw.K, G=qw.num_groups, block_size=qw.block_size)
        config = LaunchConfig.of(-(-qw.N // ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK)
        self.launch = Launch(kernel, config, args, device)
