"""gemv_mma's loop variants on a GPU (forced with strategy="gemv_mma" and a GemvMmaConfig), against the float64
reference (cutlass_ops.reference.linear_reference), outputs poisoned (NaN) before the launch.

The variants the tuner can choose: independent accumulator sets (``chains`` 2 / 4: trips add into set u % chains,
summed before the block reduction) and the unmasked copy of the batch loop (``full_batches``: taken only where a
whole batch of trips lies below the end of K, the masked loop finishing the rest). Shapes make both loops run in one
launch: K = 4224 / 4160 (132 / 130 int4 chunks: full batches, then a partial one), K = 96 (a single partial trip,
never a full batch); M = 1, 5, 16, 40 (gemv_mma_mt1 / mt2 / mt8); N = 48 (one block) and 4096 + 16 (the last
block's rows end inside its tile); int4 / int8, fp16 / bf16, block 32 / 64 / 128 / per-channel, K split across
blocks (the plan's default where N leaves SMs idle) and not; and the tuner's row-tile / unroll / blocks-per-SM
shapes for M = 9..32 (four row tiles at one trip in flight: M = 9..16).
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
from cutlass_ops.weight_only.variants import GemvMmaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_weight_only_gpu import _check, _dtype_id, _inputs, _weight  # noqa: E402  (shared helpers)

pytestmark = pytest.mark.gpu

STRATEGY = "gemv_mma"
VARIANTS = (GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4, chains=2, full_batches=1),
            GemvMmaConfig(row_tiles=1, unroll=4, min_blocks=2, warps=8, splits=1, full_batches=1),
            GemvMmaConfig(chains=2),
            GemvMmaConfig(chains=4, full_batches=1),
            GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8, full_batches=1),
            # the tuner's shapes for M = 9..32 (two trips in flight; one block per SM, 2 and 4 row tiles)
            GemvMmaConfig(row_tiles=2, unroll=2, min_blocks=2, warps=8, splits=1, full_batches=1),
            GemvMmaConfig(row_tiles=2, unroll=4, min_blocks=1, warps=8, splits=1, full_batches=1),
            GemvMmaConfig(row_tiles=4, unroll=2, min_blocks=1, warps=8, splits=1, full_batches=1),
            # and for M = 9..16: four row tiles, one trip in flight, two blocks per SM (4 warps: K split by the plan)
            GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=8, splits=1, full_batches=1),
            GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=4, full_batches=1))
BITS_DTYPES = ((4, torch.float16), (8, torch.bfloat16), (4, torch.bfloat16), (8, torch.float16))
K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4224, None: 4160}


def _label(c: GemvMmaConfig) -> str:
    return (f"r{c.row_tiles}u{c.unroll}b{c.min_blocks}w{c.warps}" + (f"k{c.splits}" if c.splits else "")
            + f"c{c.chains}" + ("f" if c.full_batches else ""))


@pytest.fixture(scope="module", autouse=True)
def _sm80_and_modules():
    """Skip below sm_80 (tensor-core mma); compile every module these tests use in parallel first."""
    if not torch.cuda.is_available() or capability() < 80:
        pytest.skip("gemv_mma needs sm_80+")
    plan = wo.plan_class(STRATEGY, capability())
    jobs = {(source, tuple(sorted(defines.items())))
            for cfg in VARIANTS for bits, dtype in BITS_DTYPES for M in (1, 16, 40)
            for source, _kernel, defines in plan.kernels(M, dtype, bits, cfg)}
    arch = target_arch()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda job: compile_file(job[0], arch, defines=dict(job[1])), sorted(jobs)))


def _cases():
    cases = []
    for v, cfg in enumerate(VARIANTS):
        for b, (bits, dtype) in enumerate(BITS_DTYPES):
            for i, M in enumerate((1, 5, 16, 40)):
                for j, N in enumerate((48, 4096 + 16)):
                    block_size = (32, 64, 128, None)[(v + b + i + j) % 4]
                    cases.append((cfg, bits, dtype, M, N, block_size))
    return cases


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{_label(c[0])}-int{c[1]}-{_dtype_id(c[2])}-M{c[3]}-"
                                                          f"N{c[4]}-bs{c[5] or 'pc'}")
def test_variant_matches_reference(case):
    cfg, bits, dtype, M, N, block_size = case
    K = K_FOR_BLOCK[block_size]
    qw = _weight(N, K, bits, block_size, False)  # asymmetric: exercises the offsets
    x, bias = _inputs(M, K, N, dtype, seed=31)
    _check(x, qw, bias if M != 5 else None, (M + N) % 3, STRATEGY, config=cfg)


@pytest.mark.parametrize("cfg", VARIANTS, ids=_label)
@pytest.mark.parametrize("bits", [4, 8])
def test_k_shorter_than_a_trip(cfg, bits):
    """K = 96: one partial trip, so only the masked loop runs (no full batch exists)."""
    qw = _weight(48, 96, bits, 32, False)
    x, bias = _inputs(3, 96, 48, torch.float16, seed=32)
    _check(x, qw, bias, 1, STRATEGY, config=cfg)

