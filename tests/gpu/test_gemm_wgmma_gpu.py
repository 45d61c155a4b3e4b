"""Strategy "gemm_wgmma" on a Hopper GPU (forced with strategy="gemm_wgmma"), against the float64 reference
(cutlass_ops.reference.linear_reference), outputs poisoned (NaN) before the launch so that unwritten elements
fail. Tolerance: test_weight_only_gpu's tensor-core tolerance (dequantization in the activation type, fp32
accumulation, one output rounding), which this kernel's numerics share with gemv_mma.

Shapes: M = 1, 9, 17, 33, 64, 65, 128 (every M-tile entry, at and off its boundaries: rows past M are zero rows
of the staged tile); N = 16 (one warpgroup, most of its rows past N), 200 (the second warpgroup of the block has
no rows) and 4096 + 16 (the last block's rows end inside its first warp); K = 4160 / 4224 (not a whole number of
128-element stages) and 96 (less than one trip); int4 / int8, block 32 / 64 / 128 / per-channel, fp16 / bf16,
bias and activation, K split across blocks (splits=3) and not (splits=1), and every GemmWgmmaConfig field.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from custom_kernels.device import capability, sm_count, target_arch
from custom_kernels.launch import load_kernel
from custom_kernels.nvrtc import compile_file
from cutlass_ops import weight_only as wo
from cutlass_ops.formats import QuantizedWeight
from cutlass_ops.weight_only import dispatch
from cutlass_ops.weight_only.gemm_wgmma import SOURCE
from cutlass_ops.weight_only.shared import wo_defines
from cutlass_ops.weight_only.variants import GemmWgmmaConfig, default_gemm_wgmma_config, wgmma_launch_shape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_weight_only_gpu import _check, _check_graph_replay, _dtype_id, _inputs, _weight  # noqa: E402  (helpers)

pytestmark = pytest.mark.gpu

STRATEGY = "gemm_wgmma"
HALF = (torch.float16, torch.bfloat16)
M_VALUES = (1, 9, 17, 33, 64, 65, 128)
N_VALUES = (16, 200, 4096 + 16)
K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4224, None: 4160}
VARIANTS = (GemmWgmmaConfig(warpgroups=1, stages=2), GemmWgmmaConfig(overlap=1, prefetch=4, stages=3),
            GemmWgmmaConfig(warpgroups=4, stages=4),
            GemmWgmmaConfig(stages=6, prefetch=8), GemmWgmmaConfig(stages=3, min_blocks=2),
            GemmWgmmaConfig(overlap=1, stages=5, warpgroups=1), GemmWgmmaConfig(warpgroups=4, stages=3, cluster=1),
            GemmWgmmaConfig(stages=3, min_blocks=2, cluster=1))


@pytest.fixture(scope="module", autouse=True)
def _hopper_and_modules():
    """Skip off sm_90 (wgmma); compile every module these tests use in parallel first (NVRTC, cached)."""
    if not torch.cuda.is_available() or capability() != 90:
        pytest.skip("gemm_wgmma needs sm_90 (wgmma)")
    arch = target_arch()
    jobs = [("splitk_reduce.cu", {"WO_ELEMENT": wo.ELEMENT[d]}) for d in HALF]
    configs = {GemmWgmmaConfig(), default_gemm_wgmma_config(1), default_gemm_wgmma_config(128), *VARIANTS}
    for d in HALF:
        for bits in (4, 8):
            for cfg in configs:
                jobs.append(("gemm_wgmma.cu", {"WO_ELEMENT": wo.ELEMENT[d], "WO_BITS": bits, **cfg.defines()}))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda job: compile_file(job[0], arch, defines=job[1]), jobs))


def _main_cases():
    cases = []
    for bits in (4, 8):
        for dtype in HALF:
            for i, M in enumerate(M_VALUES):
                for j, N in enumerate(N_VALUES):
                    block_size = (32, 64, 128, None)[(i + j + bits // 8) % 4]
                    cases.append((bits, dtype, M, N, block_size, (i + j) % 2 == 0))
    return cases


@pytest.mark.parametrize("case", _main_cases(),
                         ids=lambda c: f"int{c[0]}-{_dtype_id(c[1])}-M{c[2]}-N{c[3]}-bs{c[4] or 'pc'}-"
                                       f"{'split' if c[5] else 'nosplit'}")
def test_matches_reference(case):
    bits, dtype, M, N, block_size, split = case
    K = K_FOR_BLOCK[block_size]
    qw = _weight(N, K, bits, block_size, False)  # asymmetric: exercises the offsets
    x, bias = _inputs(M, K, N, dtype, seed=30)
    config = GemmWgmmaConfig(splits=3 if split else 1)
    plan = wo.get_plan(qw, M, dtype, torch.cuda.current_device(), STRATEGY, config)
    assert plan.splits == (3 if split else 1)
    _check(x, qw, None if M == 9 else bias, (M + N) % 3, STRATEGY, config=config)


@pytest.mark.parametrize("config", VARIANTS,
                         ids=lambda c: f"g{c.warpgroups}s{c.stages}p{c.prefetch}b{c.min_blocks}o{c.overlap}c{c.cluster}")
@pytest.mark.parametrize("bits, dtype", [(4, torch.float16), (8, torch.bfloat16)], ids=["int4-f16", "int8-bf16"])
@pytest.mark.parametrize("M", [9, 64, 100])
def test_every_variant(config, bits, dtype, M):
    qw = _weight(4096 + 16, 4160, bits, 64, True)
    x, bias = _inputs(M, 4160, qw.N, dtype, seed=31)
    _check(x, qw, bias, M % 3, STRATEGY, config=config)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("M", [1, 33, 128])
def test_k_shorter_than_a_trip(bits, M):
    """K = 96: 3 int4 / 6 int8 chunks, a single partial trip and stage (a forced 5-way split is capped to it)."""
    qw = _weight(48, 96, bits, 32, False)
    x, bias = _inputs(M, 96, 48, torch.float16, seed=32)
    for config in (None, GemmWgmmaConfig(splits=5)):
        _check(x, qw, bias, 1, STRATEGY, config=config)


def test_default_split_is_deterministic():
    qw = _weight(4096 + 16, 4224, 4, 128, False)
    x, bias = _inputs(40, qw.K, qw.N, torch.float16, seed=33)
    first = _check(x, qw, bias, 0, STRATEGY)
    assert wo.get_plan(qw, 40, torch.float16, torch.cuda.current_device(), STRATEGY).splits > 1
    assert torch.equal(first, wo.linear_weight_only(x, qw, bias, 0, strategy=STRATEGY))


def test_it_is_the_hopper_default():
    """A fresh weight's default plan (no tuned entry for its shape) is gemm_wgmma for GEMM_WGMMA_MIN_M <= M <=
    GEMM_WGMMA_LIMIT_M, and the public call gives the reference's result."""
    cached = _weight(1040, 2048, 4, 64, False)
    qw = QuantizedWeight(cached.qweight.clone(), cached.scale.clone(), cached.offset.clone(), 4, 64, 1040, 2048,
                         symmetric=False)  # a fresh weight: no default plan cached yet
    dev = torch.cuda.current_device()
    assert wo.get_plan(qw, dispatch.GEMM_WGMMA_MIN_M, torch.float16, dev).strategy == STRATEGY
    assert wo.get_plan(qw, dispatch.GEMM_WGMMA_LIMIT_M, torch.float16, dev).strategy == STRATEGY
    assert wo.get_plan(qw, dispatch.GEMM_WGMMA_MIN_M - 1, torch.float16, dev).strategy != STRATEGY
    x, bias = _inputs(96, 2048, 1040, torch.bfloat16, seed=34)
    _check(x, qw, bias, 1, None)


@pytest.mark.parametrize("splits, K", [(2, 4160), (3, 4160), (8, 4096)])
@pytest.mark.parametrize("bits, dtype, M", [(4, torch.float16, 64), (8, torch.bfloat16, 17), (4, torch.bfloat16, 128)],
                         ids=["int4-f16-M64", "int8-bf16-M17", "int4-bf16-M128"])
def test_cluster_sums_the_k_splits(splits, K, bits, dtype, M):
    """GemmWgmmaConfig.cluster: the K splits of a block of rows run as one cluster that sums them in the kernel (one
    launch, no workspace, no splitk_reduce); ragged N (few enough blocks that every forced count fits one wave of
    clusters), every M tile width, against the reference."""
    qw = _weight(1024 + 16, K, bits, 64, False)
    x, bias = _inputs(M, K, qw.N, dtype, seed=36)
    config = GemmWgmmaConfig(warpgroups=4 if M > 64 else 2, stages=3, cluster=1, splits=splits)
    plan = wo.get_plan(qw, M, dtype, torch.cuda.current_device(), STRATEGY, config)
    assert plan.splits == splits and plan.reduce is None and plan.gemv.shape.cluster == (1, splits, 1)
    _check(x, qw, bias, M % 3, STRATEGY, config=config)


@pytest.mark.parametrize("min_blocks", [1, 2])
def test_cluster_grid_fits_one_wave(min_blocks):
    """The cluster form takes no more splits than leave its clusters all resident at once (the driver's
    cuOccupancyMaxActiveClusters, no larger than the SMs' block slots allow), and the result is still right."""
    dev = torch.cuda.current_device()
    qw = _weight(4096, 4096, 4, 128, False)
    x, bias = _inputs(64, 4096, qw.N, torch.float16, seed=37)
    config = GemmWgmmaConfig(stages=3, min_blocks=min_blocks, cluster=1)
    plan = wo.get_plan(qw, 64, torch.float16, dev, STRATEGY, config)
    kernel = load_kernel(SOURCE, plan.gemv.shape.name, wo_defines(torch.float16, 4, config))
    threads, smem = 128 * config.warpgroups, plan.gemv.shape.smem
    splits, blocks_n = plan.splits, plan.shape.blocks_n
    clusters = kernel.max_active_clusters(threads, smem, (1, splits, 1), dev)
    assert 1 < splits <= wgmma_launch_shape(qw.N, qw.K, 4, sm_count(dev), config, plan.occupancy).splits
    assert blocks_n <= clusters <= sm_count(dev) * plan.occupancy // splits
    assert plan.gemv.shape.cluster == (1, splits, 1)
    _check(x, qw, bias, 0, STRATEGY, config=config)


@pytest.mark.parametrize("cluster", [0, 1], ids=["workspace", "cluster"])
def test_cuda_graph_capture_and_replay(cluster):
    """Split-K (a fresh workspace per call from the graph's pool, or the cluster sum) under capture and replay."""
    qw = _weight(4096 + 16, 4160, 4, 64, False)
    x, bias = _inputs(64, 4160, qw.N, torch.float16, seed=35)
    config = GemmWgmmaConfig(splits=2, stages=3, cluster=cluster)
    _check_graph_replay(x, lambda x: wo.linear_weight_only(x, qw, bias, 1, strategy=STRATEGY, config=config))


def test_refusals_name_the_problem():
    qw = _weight(4096 + 16, 4160, 4, 64, False)
    with pytest.raises(ValueError, match="float32"):
        wo.linear_weight_only(torch.zeros(9, 4160, device="cuda"), qw, strategy=STRATEGY)
    with pytest.raises(ValueError, match="M <= 128"):
        wo.linear_weight_only(torch.zeros(129, 4160, dtype=torch.float16, device="cuda"), qw, strategy=STRATEGY)
    with pytest.raises(TypeError, match="GemmWgmmaConfig"):
        wo.linear_weight_only(torch.zeros(9, 4160, dtype=torch.float16, device="cuda"), qw, strategy=STRATEGY,
                              config=wo.GemvMmaConfig())
