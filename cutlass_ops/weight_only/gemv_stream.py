"""Strategy "gemv_stream": CUDA-core GEMV for M <= 8 built for memory-level parallelism (gemv_stream.cu
``gemv_stream_m{1..8}``), fp16/bf16, any arch: activations staged in shared memory, about one wave
of persistent blocks, K split when the activations do not fit or N leaves warp slots idle."""
from __future__ import annotations

import logging
import math

from custom_kernels.device import sm_count, smem_limits
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .dispatch import _is_pow2
from .shared import ELEMENT, aligned_qweight, derived, scale_offset_words, wo_defines
from .splitk import SplitKGemvPlan, reduce_kernel
from .variants import StreamConfig, chunk_elems, stream_launch_shape

log = logging.getLogger(__name__)

__all__ = ["GemvStreamArgs", "GemvStreamPlan"]


class GemvStreamArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale_offset", Ptr), ("bias", Ptr), ("D", Ptr), ("workspace", Ptr),
                ("N", I32), ("K", I32), ("G", I32), ("group_shift", I32), ("chunks_per_group", I32),
                ("chunks_per_split", I32), ("act", I32)]


class GemvStreamPlan(SplitKGemvPlan):
    strategy = "gemv_stream"
    config_type = StreamConfig

    @staticmethod
    def kernels(M: int, dtype, bits: int, config: StreamConfig | None = None) -> tuple:
        """(source, kernel, defines) of every kernel the plan for M rows may load (the split-K reduction
        where the activations do not fit in shared memory or N leaves warp slots idle)."""
        return (("gemv_stream.cu", f"gemv_stream_m{M}", wo_defines(dtype, bits, config or StreamConfig())),
                reduce_kernel(ELEMENT[dtype]))

    def __init__(self, qw, M: int, dtype, device: int, config: StreamConfig | None = None):
        config = config or StreamConfig()
        defines = wo_defines(dtype, qw.bits, config)
        ce = chunk_elems(qw.bits)
        K, N, G = qw.K, qw.N, qw.num_groups
        qweight = aligned_qweight(qw)
        chunks_per_group = qw.block_size // ce
        group_shift = 30 if G == 1 else (int(math.log2(chunks_per_group)) if _is_pow2(chunks_per_group) else -1)
        name = f"gemv_stream_m{M}"
        kernel = load_kernel("gemv_stream.cu", name, defines, device=device)
        sm = sm_count(device)
        limits = smem_limits(device)
        shape = stream_launch_shape(M, N, K, qw.bits, sm, *limits, config=config)
        kernel.set_max_dynamic_smem(shape.smem)
        threads = 32 * config.warps
        occupancy = kernel.max_active_blocks(threads, shape.smem, device)
        if occupancy < 1:
            raise RuntimeError(f"{name} cannot run with {shape.smem} bytes of shared memory on device {device}")
        if occupancy != config.min_blocks:
            log.debug("%s: %d blocks per SM (expected %d)", name, occupancy, config.min_blocks)
            shape = stream_launch_shape(M, N, K, qw.bits, sm, *limits, blocks_per_sm=occupancy, config=config)
        so = scale_offset_words(qw, dtype)
        args = GemvStreamArgs(B=qweight.data_ptr(), scale_offset=so.data_ptr(), N=N, K=K, G=G,
                              group_shift=group_shift, chunks_per_group=chunks_per_group,
                              chunks_per_split=shape.chunks_per_split)
        gemv = Launch(kernel, LaunchConfig.of((shape.grid_x, shape.splits), threads, smem=shape.smem), args, device)
        super().__init__(gemv, shape.splits, M, N, ELEMENT[dtype], device,
                         keep=(so, derived(qweight, qw.qweight)))
