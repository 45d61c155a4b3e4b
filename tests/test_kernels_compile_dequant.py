"""CPU tests for the bandwidth strategies of the weight-only linear ("dequant_cublas", "gemv_stream"):
the kernels build with NVRTC (sm_75/80/90) and plain nvcc and export their entry points, the host
mirrors the kernels' launch constants, and the dispatch and launch-shape arithmetic are right.
No GPU needed."""
from __future__ import annotations

import math
import re

import pytest
import torch

from custom_kernels import compile_file
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops.formats import quantize_weight
from cutlass_ops import weight_only as wo
from cutlass_ops.weight_only import dequant_cublas, dispatch, gemm_mma, gemv_dp4a, variants
from _nvcc import nvcc_cubin

GEMV_STREAM = [f"gemv_stream_m{m}" for m in range(1, 9)]
ELEMENT_BITS = [(e, b) for e in (0, 1, 2) for b in (4, 8)]


def _has(data: bytes, name: str) -> bool:
    return name.encode() + b"\0" in data


# --------------------------------------------------------------------------------------------
# builds
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", [75, 80, 90])
def test_dequant_nvrtc_builds_each_arch(arch):
    cubin = compile_file("dequant_weight.cu", arch, defines={"WO_ELEMENT": 0, "WO_BITS": 4})
    assert cubin.data[:4] == b"\x7fELF"
    assert _has(cubin.data, "dequant_weight")


@pytest.mark.parametrize("element, bits", ELEMENT_BITS)
def test_dequant_nvrtc_builds_every_element_and_width(element, bits):
    cubin = compile_file("dequant_weight.cu", "90a", defines={"WO_ELEMENT": element, "WO_BITS": bits})
    assert _has(cubin.data, "dequant_weight")


@pytest.mark.parametrize("arch", [75, 80, 90])
@pytest.mark.parametrize("element, bits", [(0, 4), (1, 8)])
def test_gemv_stream_entries_each_arch(arch, element, bits):
    cubin = compile_file("gemv_stream.cu", arch, defines={"WO_ELEMENT": element, "WO_BITS": bits})
    missing = [e for e in GEMV_STREAM if not _has(cubin.data, e)]
    assert not missing, f"sm_{arch} {element}/{bits}: cubin lacks {missing}"


@pytest.mark.parametrize("element, bits", [(0, 8), (1, 4)])
def test_gemv_stream_entries_other_widths(element, bits):
    cubin = compile_file("gemv_stream.cu", "90a", defines={"WO_ELEMENT": element, "WO_BITS": bits})
    missing = [e for e in GEMV_STREAM if not _has(cubin.data, e)]
    assert not missing


@pytest.mark.parametrize("name, entries", [("dequant_weight.cu", ["dequant_weight"]), ("gemv_stream.cu", GEMV_STREAM)])
def test_plain_nvcc_builds(name, entries, tmp_path):
    cubin = nvcc_cubin(name, tmp_path)
    assert all(_has(cubin, e) for e in entries)


def _constant(filename: str, name: str) -> int:
    """A ``constexpr int name = value;`` or an overridable ``#define name value`` default of a kernel file."""
    text = (KERNEL_DIR / filename).read_text()
    match = re.search(rf"constexpr int {name} = (\d+);", text) or re.search(rf"#define {name} (\d+)\n", text)
    assert match, f"{filename} defines no constexpr int / #define {name}"
    return int(match.group(1))


def test_host_mirrors_kernel_constants():
    assert variants._STREAM_ROWS == _constant("gemv_stream.cu", "GEMV_STREAM_ROWS")
    assert variants._STREAM_WARPS == _constant("gemv_stream.cu", "GEMV_STREAM_WARPS")
    assert variants._STREAM_MIN_BLOCKS == _constant("gemv_stream.cu", "GEMV_STREAM_MIN_BLOCKS")
    defaults = wo.GemvMmaConfig()
    assert defaults.row_tiles == _constant("gemv_mma.cu", "GEMV_MMA_ROW_TILES")
    assert defaults.unroll == _constant("gemv_mma.cu", "GEMV_MMA_UNROLL")
    assert defaults.min_blocks == _constant("gemv_mma.cu", "GEMV_MMA_MIN_BLOCKS")
    assert defaults.chains == _constant("gemv_mma.cu", "GEMV_MMA_CHAINS")
    assert defaults.full_batches == _constant("gemv_mma.cu", "GEMV_MMA_FULL_BATCHES")
    assert wo.GemvMmaConfig().defines() == {} and wo.StreamConfig().defines() == {}
    assert dequant_cublas.WARPS == _constant("dequant_weight.cu", "kWarps")
    assert dequant_cublas.BLOCKS_PER_SM == _constant("dequant_weight.cu", "kMinBlocks")
    assert dequant_cublas.WORDS_PER_TILE == _constant("dequant_weight.cu", "kWordsPerTile")
    assert gemm_mma.BLOCK_N == _constant("gemm_mma.cu", "kBN")
    assert gemm_mma.THREADS == _constant("gemm_mma.cu", "kThreads")
    assert gemv_dp4a.Q_BLOCK == _constant("gemv_dp4a.cu", "kQBlock")


# --------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------

def _qw(N=64, K=256, bits=4, block_size=64):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    return quantize_weight(w, bits=bits, block_size=block_size)


@pytest.mark.parametrize("N, K, M, expected", [
    (4112, 1088, 24, "gemm_wgmma"),   # mid width and mid K: int8 keeps gemm_wgmma (GEMM_WGMMA_INT8_KEEP_N / _K)
    (4096, 1088, 24, "gemv_mma"),     # the bounds are exclusive
    (4112, 1024, 24, "gemv_mma"),
    (4112, 4096, 32, "gemv_mma"),
    (4096, 1024, 33, "gemm_wgmma"),   # from GEMM_WGMMA_INT8_MIN_M every int8 weight
])
def test_int8_wgmma_from_m33_but_mid_shapes(N, K, M, expected):
    assert wo.choose_strategy(M, torch.float16, _qw(N=N, K=K, bits=8, block_size=64), 90) == expected


def test_strategies_name_every_planner():
    assert set(wo.STRATEGIES) == set(wo.PLANS)
    assert {"gemv_stream", "dequant_cublas"} <= set(wo.STRATEGIES)
    assert len(set(wo.STRATEGIES)) == len(wo.STRATEGIES)


@pytest.mark.parametrize("M, dtype, cc, bits, block_size, expected", [
    (wo.DEQUANT_CUBLAS_MIN_M, torch.float16, 80, 4, 64, "dequant_cublas"),
    (wo.DEQUANT_CUBLAS_MIN_M - 1, torch.float16, 80, 4, 64, "gemm_mma"),
    (dispatch.GEMM_WGMMA_LIMIT_M, torch.float16, 90, 4, 64, "gemm_wgmma"),   # Hopper: wgmma up to its limit
    (dispatch.GEMM_WGMMA_LIMIT_M + 1, torch.float16, 90, 4, 64, "dequant_cublas"),
    (dispatch.GEMM_WGMMA_MIN_M, torch.bfloat16, 90, 8, 128, "gemv_mma"),  # int8 below GEMM_WGMMA_INT8_MIN_M
    (dispatch.GEMM_WGMMA_INT8_MIN_M, torch.bfloat16, 90, 8, 128, "gemm_wgmma"),
    (dispatch.GEMM_WGMMA_MIN_M, torch.bfloat16, 90, 4, 128, "gemm_wgmma"),
    (dispatch.GEMM_WGMMA_MIN_M - 1, torch.float16, 90, 4, 128, "gemv_mma"),  # a narrow weight, below wgmma
    (96, torch.float16, 90, 4, 16, "gemm_mma"),           # block 16 < one int4 chunk: wgmma refuses it
    (96, torch.float32, 90, 4, 64, "gemm_simt"),          # wgmma takes fp16 / bf16 only
    (4096, torch.bfloat16, 80, 8, 128, "dequant_cublas"),
    (512, torch.float16, 75, 4, 64, "dequant_cublas"),    # fp16 cuBLAS runs on sm_75
    (512, torch.bfloat16, 75, 4, 64, "gemm_simt"),        # bf16 GEMM needs sm_80
    (512, torch.float32, 90, 4, 64, "gemm_simt"),         # fp32 stays off the dequant path by default
    (256, torch.float16, 90, 8, 2, "gemm_simt"),          # int8 block 2: no 32-bit word per group
    (1, torch.float16, 90, 4, 64, "gemv_mma"),            # SMALL_M_GEMV default
    (7, torch.bfloat16, 90, 8, 64, "gemv_mma"),
    (17, torch.bfloat16, 80, 4, 64, "gemm_small_m"),      # GEMM_SMALL_M_MIN_M (a narrow int4 weight)
    (16, torch.bfloat16, 80, 4, 64, "gemv_mma"),          # below it
    (32, torch.bfloat16, 80, 8, 64, "gemv_mma"),          # int8: from GEMM_SMALL_M_INT8_MIN_M
    (1, torch.float16, 75, 4, 64, "gemv_simt"),           # the table applies on sm_80+ only
])
def test_default_strategy(M, dtype, cc, bits, block_size, expected):
    assert wo.choose_strategy(M, dtype, _qw(bits=bits, block_size=block_size), cc) == expected


def test_small_m_table_flips_the_default(monkeypatch):
    qw = _qw(bits=4, block_size=64)
    monkeypatch.setitem(wo.SMALL_M_GEMV, 3, "gemv_stream")
    assert wo.choose_strategy(3, torch.float16, qw, 90) == "gemv_stream"
    assert wo.choose_strategy(2, torch.float16, qw, 90) == "gemv_mma"
    # Where gemv_stream cannot run (int4 block 16 < 32 elements per chunk), the order goes on.
    assert wo.choose_strategy(3, torch.float16, _qw(bits=4, block_size=16), 90) == "gemm_mma"
    monkeypatch.setitem(wo.SMALL_M_GEMV, 3, "gemv_fast")
    with pytest.raises(ValueError, match="SMALL_M_GEMV"):
        wo.choose_strategy(3, torch.float16, qw, 90)


def test_threshold_moves_the_dispatch(monkeypatch):
    qw = _qw()
    monkeypatch.setattr(dispatch, "DEQUANT_CUBLAS_MIN_M", 64)
    assert wo.choose_strategy(64, torch.float16, qw, 80) == "dequant_cublas"
    assert wo.choose_strategy(63, torch.float16, qw, 80) == "gemm_small_m"


def test_wgmma_switch_and_thresholds_move_the_hopper_dispatch(monkeypatch):
    qw = _qw(bits=4, block_size=128)
    assert wo.choose_strategy(64, torch.float16, qw, 90) == "gemm_wgmma"
    assert wo.choose_strategy(64, torch.float16, qw, 80) == "gemm_small_m"  # sm_80 has no wgmma
    monkeypatch.setattr(dispatch, "GEMM_WGMMA_MIN_M", 65)
    assert wo.choose_strategy(64, torch.float16, qw, 90) == "gemm_small_m"
    assert wo.choose_strategy(65, torch.float16, qw, 90) == "gemm_wgmma"
    monkeypatch.setattr(dispatch, "GEMM_WGMMA_DEFAULT", False)
    assert wo.choose_strategy(65, torch.float16, qw, 90) == "gemm_mma"
    assert dispatch.candidates_constant_from() > dispatch.GEMM_WGMMA_LIMIT_M


def test_wgmma_problem_names_the_constraint():
    qw4 = _qw(bits=4, block_size=64)
    assert "sm_90" in wo.strategy_problem("gemm_wgmma", 32, torch.float16, qw4, 80)
    assert "float32" in wo.strategy_problem("gemm_wgmma", 32, torch.float32, qw4, 90)
    assert "M <= 128" in wo.strategy_problem("gemm_wgmma", 129, torch.float16, qw4, 90)
    assert "block_size" in wo.strategy_problem("gemm_wgmma", 32, torch.float16, _qw(bits=4, block_size=16), 90)
    assert wo.strategy_problem("gemm_wgmma", 128, torch.bfloat16, qw4, 90) is None


def test_strategy_problem_names_the_constraint():
    qw4 = _qw(bits=4, block_size=64)
    assert "float32" in wo.strategy_problem("gemv_stream", 1, torch.float32, qw4, 90)
    assert "M <= 8" in wo.strategy_problem("gemv_stream", 9, torch.float16, qw4, 90)
    assert "block_size" in wo.strategy_problem("gemv_stream", 1, torch.float16, _qw(bits=4, block_size=16), 90)
    assert wo.strategy_problem("gemv_stream", 8, torch.bfloat16, qw4, 75) is None
    assert "sm_80" in wo.strategy_problem("dequant_cublas", 512, torch.bfloat16, qw4, 75)
    assert "block_size" in wo.strategy_problem("dequant_cublas", 512, torch.float16, _qw(bits=8, block_size=2), 90)
    assert wo.strategy_problem("dequant_cublas", 1, torch.float32, qw4, 75) is None
    assert wo.strategy_problem("dequant_cublas", 1, torch.float16, _qw(bits=4, block_size=8), 90) is None


def test_dequantize_weight_validates_before_any_launch():
    qw = _qw()
    with pytest.raises(TypeError, match="dtype"):
        wo.dequantize_weight(qw, torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        wo.dequantize_weight(qw, torch.float16)


# --------------------------------------------------------------------------------------------
# gemv_stream launch shape
# --------------------------------------------------------------------------------------------

# (SMs, shared memory per SM, opt-in per block, reserved per block)
H100 = (132, 233472, 232448, 1024)
A100 = (108, 167936, 166912, 1024)
SM86 = (84, 102400, 101376, 1024)
T4 = (40, 65536, 65536, 0)


def _budget(device) -> int:
    _, per_sm, per_block, reserved = device
    return min(per_block, per_sm // variants._STREAM_MIN_BLOCKS - reserved) - variants._STREAM_STATIC_SMEM


def test_stream_shape_h100_main_case():
    """N = K = 8192 int4, M = 1: one split (2048 row groups fill 2048 of 2112 warp slots), one wave."""
    shape = wo.stream_launch_shape(1, 8192, 8192, 4, *H100)
    assert shape == wo.StreamShape(splits=1, chunks_per_split=256, grid_x=256, smem=256 * 68)


def test_stream_shape_small_n_splits_k():
    shape = wo.stream_launch_shape(1, 256, 8192, 4, *H100)
    assert shape.splits == 4 and shape.chunks_per_split == 64  # floor(2112 / 64) = 33, capped at 256 // 64


def test_stream_shape_long_k_splits_for_shared_memory():
    shape = wo.stream_launch_shape(8, 8192, 16384, 4, *H100)
    assert shape.splits == math.ceil(512 / (_budget(H100) // (8 * 68)))
    assert shape.smem <= _budget(H100)


@pytest.mark.parametrize("device", [H100, A100, SM86, T4], ids=["h100", "a100", "sm86", "t4"])
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("N, K", [(1, 1056), (77, 1056), (4097, 4160), (8192, 8192), (28672, 8192),
                                  (256, 16384), (1031, 16384)])
def test_stream_shape_invariants(device, M, bits, N, K):
    shape = wo.stream_launch_shape(M, N, K, bits, *device)
    chunks = K // (32 if bits == 4 else 16)
    assert shape.splits * shape.chunks_per_split >= chunks             # every chunk covered
    assert (shape.splits - 1) * shape.chunks_per_split < chunks        # no empty split
    assert shape.smem == M * shape.chunks_per_split * (2 * (128 // bits) + 4)
    assert shape.smem <= _budget(device)                               # two blocks per SM fit
    assert 1 <= shape.grid_x <= max(1, math.ceil(math.ceil(N / variants._STREAM_ROWS) / variants._STREAM_WARPS))
    assert shape.grid_x * shape.splits <= device[0] * variants._STREAM_MIN_BLOCKS + shape.splits


def test_stream_shape_rejects_impossible_budget():
    with pytest.raises(ValueError, match="shared memory"):
        wo.stream_launch_shape(8, 64, 1024, 4, 1, 1024, 1024, 0)  # 448 bytes < one 544-byte chunk
