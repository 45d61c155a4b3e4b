"""Strategy "gemm_small_m": tensor-core GEMM for M <= 64 (gemm_small_m.cu ``gemm_small_m_mt{1,2,4,8}``),
fp16/bf16, sm_80+. gemv_mma's swapped-operand mma and converters, but the warps of a block split N and
share one activation tile that cp.async stages in shared memory (gemv_mma's warps split K, so each of its
blocks re-reads all of x); K is split across blocks when N leaves SMs idle (splitk.py)."""
from __future__ import annotations

import dataclasses
import logging
import math

from custom_kernels.device import sm_count, smem_limits
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import ELEMENT, aligned_qweight, derived, scale_offset_words, wo_defines
from .splitk import SplitKGemvPlan, reduce_kernel
from .variants import (
    GemmSmallMConfig, chunk_elems, default_gemm_small_m_config, gemm_small_m_smem, small_m_launch_shape, small_m_tiles,
)

log = logging.getLogger(__name__)

__all__ = ["GemmSmallMArgs", "GemmSmallMPlan", "build_staged"]


class GemmSmallMArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale_offset", Ptr), ("bias", Ptr), ("D", Ptr), ("workspace", Ptr),
                ("M", I32), ("N", I32), ("K", I32), ("G", I32), ("group_shift", I32), ("chunks_per_split", I32),
                ("act", I32)]


def _fitting_config(config: GemmSmallMConfig, forced: bool, m_tiles: int, bits: int, device: int) -> GemmSmallMConfig:
    """``config``, or the default with fewer stages where its activation tile exceeds the GPU's shared
    memory per block (a forced config is refused instead)."""
    return fitting_config(config, forced, m_tiles, bits, smem_limits(device)[1], device)


def fitting_config(config: GemmSmallMConfig, forced: bool, m_tiles: int, bits: int, per_block: int,
                   device: int | str = "?") -> GemmSmallMConfig:
    """:func:`_fitting_config` for a GPU allowing ``per_block`` bytes of shared memory per block (no GPU)."""
    if gemm_small_m_smem(m_tiles, bits, config.stages) <= per_block:
        return config
    if not forced:
        for stages in range(config.stages - 1, 1, -1):
            if gemm_small_m_smem(m_tiles, bits, stages) <= per_block:
                log.info("gemm_small_m: %d stages do not fit in %d bytes of shared memory per block; using %d",
                         config.stages, per_block, stages)
                return dataclasses.replace(config, stages=stages)
    raise ValueError(f"gemm_small_m: {config} needs {gemm_small_m_smem(m_tiles, bits, config.stages)} bytes of "
                     f"shared memory per block (M tiles {m_tiles}, {bits}-bit), device {device} allows {per_block}")


class GemmSmallMPlan(SplitKGemvPlan):
    strategy = "gemm_small_m"
    config_type = GemmSmallMConfig

    @staticmethod
    def kernels(M: int, dtype, bits: int, config: GemmSmallMConfig | None = None,
                smem_per_block: int | None = None) -> tuple:
        """(source, kernel, defines) of every kernel the plan for M rows may load on a GPU allowing
        ``smem_per_block`` bytes of shared memory per block (None: any GPU, so the default config with
        each stage count the plan may fall back to), with the split-K reduction."""
        m_tiles = small_m_tiles(M)
        default = default_gemm_small_m_config(M, bits)
        if smem_per_block is not None:
            configs = [fitting_config(config or default, config is not None, m_tiles, bits, smem_per_block)]
        else:  # a forced config runs as it is (or is refused)
            configs = [config] if config is not None else [
                dataclasses.replace(default, stages=s) for s in range(default.stages, 1, -1)]
        return (*(("gemm_small_m.cu", f"gemm_small_m_mt{m_tiles}", wo_defines(dtype, bits, c)) for c in configs),
                reduce_kernel(ELEMENT[dtype]))

    def __init__(self, qw, M: int, dtype, device: int, config: GemmSmallMConfig | None = None):
        forced = config is not None
        config = config or default_gemm_small_m_config(M, qw.bits)
        if M > config.max_m:
            raise ValueError(f"gemm_small_m: {config} takes M <= {config.max_m} (row_tiles=4 builds no 8-tile "
                             f"entry), got M={M}")
        m_tiles = small_m_tiles(M)
        config = _fitting_config(config, forced, m_tiles, qw.bits, device)
        smem = gemm_small_m_smem(m_tiles, qw.bits, config.stages)
        build_staged(self, qw, M, dtype, device, config, source="gemm_small_m.cu", name=f"gemm_small_m_mt{m_tiles}",
                     smem=smem, threads=32 * config.warps,
                     launch_shape=lambda occupancy, _clusters: small_m_launch_shape(
                         qw.N, qw.K, qw.bits, sm_count(device), config, occupancy))


def build_staged(plan: SplitKGemvPlan, qw, M: int, dtype, device: int, config, *, source: str, name: str, smem: int,
                 threads: int, launch_shape, cluster_sum: bool = False) -> None:
    """Build a plan of the kernels whose blocks stage the activations in ``smem`` bytes of dynamic shared memory
    (gemm_small_m, gemm_wgmma; their parameters are GemmSmallMArgs'): load ``name`` of ``source`` with the
    config's defines, check that a block of ``threads`` fits, size the grid with ``launch_shape(blocks per SM,
    max_clusters)`` (a SmallMShape; ``max_clusters(S)``: the clusters of S splits resident at once, None without
    ``cluster_sum``), pack the weight's words and initialize ``plan``'s launch, split-K reduction and
    ``config`` / ``shape`` / ``occupancy`` (what ran: benchmarks report them). ``cluster_sum``: the kernel sums its
    K splits itself, launched as clusters of (1, splits, 1) blocks (gemm_wgmma's ``cluster``)."""
    K, N, G = qw.K, qw.N, qw.num_groups
    group_shift = 30 if G == 1 else int(math.log2(qw.block_size // chunk_elems(qw.bits)))
    kernel = load_kernel(source, name, wo_defines(dtype, qw.bits, config), device=device)
    kernel.set_max_dynamic_smem(smem)
    occupancy = kernel.max_active_blocks(threads, smem, device)
    if occupancy < 1:
        raise RuntimeError(f"{name} {config} cannot run with {smem} bytes of shared memory on device {device}")
    max_clusters = (lambda splits: kernel.max_active_clusters(threads, smem, (1, splits, 1), device)) \
        if cluster_sum else None
    shape = launch_shape(occupancy, max_clusters)
    qweight = aligned_qweight(qw)
    so = scale_offset_words(qw, dtype)
    args = GemmSmallMArgs(B=qweight.data_ptr(), scale_offset=so.data_ptr(), M=M, N=N, K=K, G=G,
                          group_shift=group_shift, chunks_per_split=shape.chunks_per_split)
    in_kernel = cluster_sum and shape.splits > 1
    gemm = Launch(kernel, LaunchConfig.of((shape.blocks_n, shape.splits), threads, smem=smem,
                                          cluster=(1, shape.splits, 1) if in_kernel else (1, 1, 1)), args, device)
    SplitKGemvPlan.__init__(plan, gemm, shape.splits, M, N, ELEMENT[dtype], device,
                            keep=(so, derived(qweight, qw.qweight)), summed=in_kernel)
    plan.config, plan.shape, plan.occupancy = config, shape, occupancy
