"""The GPU tests of the rule-based gemv_mma dispatch (tests/gpu/test_weight_only_gpu.py: SMALL_M_CASES, MID_M_CASES)
assert that each case's shape reaches its module through the default dispatch; checked here on the CPU for the SM
counts of the GPUs the rules target, on Hopper and Ampere, so that a dispatch change which moves a case elsewhere
fails here first (a case at K = 2112 kept asserting gemv_mma on the H200 after the mid-width, mid-K int8 weights went
back to gemm_wgmma, until the GPU tests ran again)."""
from __future__ import annotations

import functools
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cutlass_ops import weight_only as wo
from cutlass_ops.formats import QuantizedWeight

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from test_weight_only_gpu import MID_M_CASES, RULE_MODULES, SMALL_M_CASES, rule_case_N  # noqa: E402

SM_COUNTS = (132, 114, 108, 78)  # H100 SXM / PCIe, A100, H20
CCS = (90, 80)


@functools.lru_cache(maxsize=4)  # up to 70 MB each (int8 16384 x 4251): keep a few
def _weight(N: int, K: int, bits: int) -> QuantizedWeight:
    """A real QuantizedWeight of the GPU test's format (block 64, asymmetric); the dispatch reads its shape only."""
    packed = K if bits == 8 else K // 2
    return QuantizedWeight(qweight=torch.zeros(N, packed, dtype=torch.int8 if bits == 8 else torch.uint8),
                           scale=torch.ones(N, K // 64), offset=torch.zeros(N, K // 64), bits=bits, block_size=64,
                           N=N, K=K, symmetric=False)


def _cases():
    for bits, per_sm, extra, K, module in SMALL_M_CASES:
        for M in (1, 3):
            yield M, bits, per_sm, extra, K, module
    yield from MID_M_CASES


@pytest.mark.parametrize("sms", SM_COUNTS)
@pytest.mark.parametrize("cc", CCS)
@pytest.mark.parametrize("M, bits, per_sm, extra, K, module", list(_cases()),
                         ids=[f"m{c[0]}-w{c[1]}-{c[5]}-K{c[4]}" for c in _cases()])
def test_gpu_rule_case_reaches_its_module(M, bits, per_sm, extra, K, module, cc, sms):
    N = rule_case_N(per_sm, extra, sms)
    assert wo.default_gemv_mma_config(M, bits, N, K, sms) == replace(RULE_MODULES[module], splits=1)
    for dtype in (torch.float16, torch.bfloat16):
        assert wo.choose_strategy(M, dtype, _weight(N, K, bits), cc) == "gemv_mma"


def test_the_mid_shape_window_would_be_caught():
    """The case this file exists for: int8 at M = 20 on 4251 x 2112 (132 SMs) is a gemm_wgmma problem on Hopper."""
    assert wo.choose_strategy(20, torch.float16, _weight(rule_case_N(2, 2, 132), 2112, 8), 90) == "gemm_wgmma"
