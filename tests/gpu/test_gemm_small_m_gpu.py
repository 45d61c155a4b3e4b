"""Strategy "gemm_small_m" on a GPU (forced with strategy="gemm_small_m"), against the float64 reference
(cutlass_ops.reference.linear_reference), outputs poisoned (NaN) before the launch so that unwritten elements
fail. Tolerance: test_weight_only_gpu's tensor-core tolerance (dequantization in the activation type, fp32
accumulation, one output rounding), which this kernel's numerics share with gemv_mma.

Shapes: M = 1, 7, 9, 17, 33, 64 (every M-tile entry, at and off its boundaries); N = 16, 48 (one block, most
warps without rows) and 4096 + 16 (the last block's rows end inside its first warp); K = 4160 / 4224 (not a
whole number of K stages: the last trip and stage are partial) and 96 (less than one trip); int4 / int8,
block 32 / 64 / 128 / per-channel, fp16 / bf16, bias and activation, split-K on (the default wherever N
leaves SMs idle) and off (splits=1), and every GemmSmallMConfig variant family.
"""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from custom_kernels.device import capability, target_arch
from custom_kernels.nvrtc import compile_file
from cutlass_ops import weight_only as wo
from cutlass_ops.formats import QuantizedWeight
from cutlass_ops.reference import linear_reference
from cutlass_ops.weight_only import dispatch
from cutlass_ops.weight_only.variants import GemmSmallMConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_weight_only_gpu import _check, _check_graph_replay, _dtype_id, _inputs, _weight  # noqa: E402  (helpers)

pytestmark = pytest.mark.gpu

STRATEGY = "gemm_small_m"
HALF = (torch.float16, torch.bfloat16)
M_VALUES = (1, 7, 9, 17, 33, 64)
N_VALUES = (16, 48, 4096 + 16)
K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4224, None: 4160}  # 130 / 132 int4 chunks: 16.25 / 16.5 stages
NO_SPLIT = GemmSmallMConfig(splits=1)
VARIANTS = (GemmSmallMConfig(row_tiles=1, warps=4, stages=2), GemmSmallMConfig(row_tiles=4, warps=4),
            GemmSmallMConfig(stages=4), GemmSmallMConfig(row_tiles=1), GemmSmallMConfig(warps=4, stages=2))


@pytest.fixture(scope="module", autouse=True)
def _sm80_and_modules():
    """Skip below sm_80; compile every module these tests use in parallel first (NVRTC, cached), instead
    of one by one at first use."""
    if not torch.cuda.is_available() or capability() < 80:
        pytest.skip("gemm_small_m needs sm_80+")
    arch = target_arch()
    jobs = [("splitk_reduce.cu", {"WO_ELEMENT": wo.ELEMENT[d]}) for d in HALF]
    for d in HALF:
        for bits in (4, 8):
            for cfg in (GemmSmallMConfig(),) + VARIANTS:
                jobs.append(("gemm_small_m.cu", {"WO_ELEMENT": wo.ELEMENT[d], "WO_BITS": bits, **cfg.defines()}))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda job: compile_file(job[0], arch, defines=job[1]), jobs))


def _plan(qw, M, dtype, config=None):
    return wo.get_plan(qw, M, dtype, torch.cuda.current_device(), STRATEGY, config)


def _main_cases():
    cases = []
    for bits in (4, 8):
        for dtype in HALF:
            for i, M in enumerate(M_VALUES):
                for j, N in enumerate(N_VALUES):
                    block_size = (32, 64, 128)[(i + j + bits // 8) % 3]
                    for split in (True, False):
                        cases.append((bits, dtype, M, N, block_size, split))
    return cases


@pytest.mark.parametrize("case", _main_cases(),
                         ids=lambda c: f"int{c[0]}-{_dtype_id(c[1])}-M{c[2]}-N{c[3]}-bs{c[4]}-"
                                       f"{'split' if c[5] else 'nosplit'}")
def test_matches_reference(case):
    bits, dtype, M, N, block_size, split = case
    K = K_FOR_BLOCK[block_size]
    qw = _weight(N, K, bits, block_size, False)  # asymmetric: exercises the offsets
    x, bias = _inputs(M, K, N, dtype, seed=20)
    config = None if split else NO_SPLIT
    plan = _plan(qw, M, dtype, config)
    assert (plan.splits > 1) == split, f"splits={plan.splits}"  # every shape here splits K by default on >= 17 SMs
    _check(x, qw, None if M == 7 else bias, (M + N) % 3, STRATEGY, config=config)


@pytest.mark.parametrize("block_size", [32, 64, 128, None], ids=lambda b: f"bs{b or 'pc'}")
@pytest.mark.parametrize("bits, dtype", [(4, torch.float16), (8, torch.bfloat16), (4, torch.bfloat16),
                                         (8, torch.float16)], ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("M", [1, 17, 64])
def test_every_block_size_and_per_channel(block_size, bits, dtype, M):
    K = K_FOR_BLOCK[block_size]
    qw = _weight(4096 + 16, K, bits, block_size, block_size == 64)
    x, bias = _inputs(M, K, qw.N, dtype, seed=21)
    _check(x, qw, bias, 2, STRATEGY)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("M", [1, 9, 64])
@pytest.mark.parametrize("config", [None, NO_SPLIT, GemmSmallMConfig(splits=5)], ids=["default", "split1", "split5"])
def test_k_shorter_than_a_trip(bits, M, config):
    """K = 96: 3 int4 / 6 int8 chunks, a single partial trip (and split 5 is capped to the one stage)."""
    qw = _weight(48, 96, bits, 32, False)
    x, bias = _inputs(M, 96, 48, torch.float16, seed=22)
    _check(x, qw, bias, 1, STRATEGY, config=config)


@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: f"r{c.row_tiles}w{c.warps}s{c.stages}")
@pytest.mark.parametrize("bits, dtype", [(4, torch.float16), (8, torch.bfloat16)], ids=["int4-f16", "int8-bf16"])
@pytest.mark.parametrize("M", [9, 32, 64])
@pytest.mark.parametrize("split", [True, False], ids=["split", "nosplit"])
def test_every_variant(config, bits, dtype, M, split):
    if M > config.max_m:
        with pytest.raises(ValueError, match="M <= 32"):
            _plan(_weight(4096 + 16, 4160, bits, 64, False), M, dtype, config)
        return
    if not split:
        config = GemmSmallMConfig(config.row_tiles, config.warps, config.stages, splits=1)
    qw = _weight(4096 + 16, 4160, bits, 64, False)
    x, bias = _inputs(M, 4160, qw.N, dtype, seed=23)
    _check(x, qw, bias, M % 3, STRATEGY, config=config)


@pytest.mark.parametrize("bits", [4, 8])
def test_split_k_is_deterministic(bits):
    block_size = 128 if bits == 8 else 64
    qw = _weight(4096 + 16, K_FOR_BLOCK[block_size], bits, block_size, False)
    x, bias = _inputs(33, qw.K, qw.N, torch.float16, seed=24)
    first = _check(x, qw, bias, 0, STRATEGY)
    assert _plan(qw, 33, torch.float16).splits > 1
    assert torch.equal(first, wo.linear_weight_only(x, qw, bias, 0, strategy=STRATEGY))


def test_it_is_the_default(monkeypatch):
    """With dispatch.GEMM_SMALL_M_DEFAULT on (the default), a narrow weight's default plan for 8 <= M <= 64 is
    gemm_small_m where gemm_wgmma (Hopper's default from M = 17, which comes first) is off."""
    cached = _weight(1024, 1024, 4, 64, False)
    qw = QuantizedWeight(cached.qweight.clone(), cached.scale.clone(), cached.offset.clone(), 4, 64, 1024, 1024,
                         symmetric=False)  # a fresh weight: no default plan cached yet
    monkeypatch.setattr(dispatch, "GEMM_SMALL_M_DEFAULT", True)
    monkeypatch.setattr(dispatch, "GEMM_WGMMA_DEFAULT", False)
    dev = torch.cuda.current_device()
    assert wo.get_plan(qw, 17, torch.float16, dev).strategy == STRATEGY
    assert wo.get_plan(qw, 7, torch.float16, dev).strategy == "gemv_mma"
    x, bias = _inputs(17, 1024, 1024, torch.float16, seed=25)
    _check(x, qw, bias, 0, None)


def test_act_order_gathers_first():
    """perm= with the strategy forced: x[:, perm] by index_select, then this kernel."""
    qw = _weight(4096 + 16, 4160, 4, 64, False)
    x, bias = _inputs(17, 4160, qw.N, torch.float16, seed=26)
    perm = torch.randperm(4160, generator=torch.Generator().manual_seed(26)).int().cuda()
    out = wo.linear_weight_only(x, qw, bias, 0, strategy=STRATEGY, perm=perm)
    expected = wo.linear_weight_only(x.index_select(1, perm), qw, bias, 0, strategy=STRATEGY)
    assert torch.equal(out, expected)
    torch.testing.assert_close(out.double(), linear_reference(x.index_select(1, perm), qw, bias, 0),
                               rtol=2e-2, atol=2e-2)


def test_cuda_graph_capture_and_replay():
    """Split-K (a fresh workspace per call from the graph's pool) under capture and replay."""
    qw = _weight(4096 + 16, 4160, 4, 64, False)
    x, bias = _inputs(33, 4160, qw.N, torch.float16, seed=27)
    _check_graph_replay(x, lambda x: wo.linear_weight_only(x, qw, bias, 1, strategy=STRATEGY))
    assert _plan(qw, 33, torch.float16).splits > 1


def test_refusals_name_the_problem():
    qw = _weight(4096 + 16, 4160, 4, 64, False)
    with pytest.raises(ValueError, match="float32"):
        wo.linear_weight_only(torch.zeros(9, 4160, device="cuda"), qw, strategy=STRATEGY)
    with pytest.raises(ValueError, match="M <= 64"):
        wo.linear_weight_only(torch.zeros(65, 4160, dtype=torch.float16, device="cuda"), qw, strategy=STRATEGY)
    with pytest.raises(TypeError, match="GemmSmallMConfig"):
        wo.linear_weight_only(torch.zeros(9, 4160, dtype=torch.float16, device="cuda"), qw, strategy=STRATEGY,
                              config=wo.GemvMmaConfig())
