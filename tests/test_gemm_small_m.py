"""CPU tests of strategy "gemm_small_m" (custom_kernels/kernels/gemm_small_m.cu, cutlass_ops/weight_only/
gemm_small_m.py): the kernel builds with NVRTC (sm_80, sm_90a) in every variant and with plain nvcc, the host
mirrors the kernel's constants and parameters, and the config, shared-memory, launch-shape and dispatch
logic is right. No GPU needed (the GPU tests are tests/gpu/test_gemm_small_m_gpu.py).

Builds: all 18 (row_tiles, warps, stages) define combinations, each for one of the 8 (arch, element, bits)
targets in turn, plus every target at each row_tiles with the default warps and stages (the row tiles shape
the unrolled main loop; warps and stages only change loop bounds and buffer offsets): 39 modules, about 7 s
each on 2 cores.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from custom_kernels import compile_file
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops import weight_only as wo
from cutlass_ops.formats import quantize_weight
from cutlass_ops.weight_only import dispatch, gemm_small_m, variants
from cutlass_ops.weight_only.variants import GemmSmallMConfig
from _nvcc import nvcc_cubin

SOURCE = "gemm_small_m.cu"
ROOT = Path(__file__).resolve().parents[1]
TARGETS = [(arch, element, bits) for arch in ("80", "90a") for element in (0, 1) for bits in (4, 8)]
VARIANTS = [GemmSmallMConfig(row_tiles=r, warps=w, stages=s) for r in (1, 2, 4) for w in (4, 8) for s in (2, 3, 4)]


def _builds():
    builds = [(TARGETS[i % len(TARGETS)], cfg) for i, cfg in enumerate(VARIANTS)]
    builds += [(target, GemmSmallMConfig(row_tiles=r)) for r in (1, 2, 4) for target in TARGETS]
    unique = []
    for b in builds:
        if b not in unique:
            unique.append(b)
    return unique


def _entries(config: GemmSmallMConfig) -> list[str]:
    return [f"gemm_small_m_mt{mt}" for mt in (1, 2, 4, 8) if 8 * mt <= config.max_m]


def _build_id(build) -> str:
    (arch, element, bits), cfg = build
    return f"sm{arch}-{('f16', 'bf16')[element]}-int{bits}-r{cfg.row_tiles}w{cfg.warps}s{cfg.stages}"


def _has(data: bytes, name: str) -> bool:
    return b"\0" + name.encode() + b"\0" in data


# --------------------------------------------------------------------------------------------
# builds
# --------------------------------------------------------------------------------------------

def test_build_list_covers_every_variant_and_target():
    builds = _builds()
    assert {cfg for _, cfg in builds} >= set(VARIANTS)
    for r in (1, 2, 4):
        assert {t for t, cfg in builds if cfg.row_tiles == r} == set(TARGETS)
    assert {t for t, cfg in builds if cfg.warps != 8 or cfg.stages != 3} == set(TARGETS)


@pytest.mark.parametrize("build", _builds(), ids=_build_id)
def test_nvrtc_builds_every_variant(build):
    (arch, element, bits), cfg = build
    cubin = compile_file(SOURCE, arch, defines={"WO_ELEMENT": element, "WO_BITS": bits, **cfg.defines()})
    assert cubin.data[:4] == b"\x7fELF"
    missing = [e for e in _entries(cfg) if not _has(cubin.data, e)]
    assert not missing, f"{_build_id(build)}: cubin lacks {missing}"
    if cfg.row_tiles == 4:  # the 8-tile entry is not built with 4 row tiles (its accumulators would spill)
        assert not _has(cubin.data, "gemm_small_m_mt8")


def test_plain_nvcc_builds(tmp_path):
    cubin = nvcc_cubin(SOURCE, tmp_path)
    assert all(_has(cubin, e) for e in _entries(GemmSmallMConfig()))


# --------------------------------------------------------------------------------------------
# the host mirrors the kernel
# --------------------------------------------------------------------------------------------

def _source() -> str:
    return (KERNEL_DIR / SOURCE).read_text()


def _constant(name: str) -> int:
    match = re.search(rf"constexpr int {name} = (\d+);", _source()) or re.search(rf"#define {name} (\d+)\n", _source())
    assert match, f"{SOURCE} defines no constexpr int / #define {name}"
    return int(match.group(1))


def test_host_mirrors_kernel_constants():
    base = GemmSmallMConfig()
    assert base.row_tiles == _constant("GEMM_SMALL_M_ROW_TILES")
    assert base.warps == _constant("GEMM_SMALL_M_WARPS")
    assert base.stages == _constant("GEMM_SMALL_M_STAGES")
    assert base.defines() == {}
    assert variants.SMALL_M_STAGE_TRIPS == _constant("kStageTrips")


def act_slot(t: int, v: int) -> int:
    """gemm_small_m.cu's act_slot (the test below checks the source still says this)."""
    return 8 * (v >> 1) + 2 * t + (v & 1)


def slot_chunk(s: int) -> int:
    return (s >> 1) & 3


def slot_vector(s: int) -> int:
    return ((s >> 3) << 1) | (s & 1)


def test_act_slot_mirror_matches_the_source():
    assert "return 8 * (v >> 1) + 2 * t + (v & 1);" in _source()
    assert "slot_chunk(int s) { return (s >> 1) & 3; }" in _source()
    assert "slot_vector(int s) { return ((s >> 3) << 1) | (s & 1); }" in _source()


@pytest.mark.parametrize("bits", [4, 8])
def test_activation_slots_are_a_permutation_and_bank_conflict_free(bits):
    """Each trip's (chunk t, vector v) pairs fill its slots exactly once, and every quarter warp of a 16-byte
    shared load (rows 2q, 2q + 1 x chunks 0..3 at one v, rows kRowBytes apart) touches 8 distinct 16-byte
    bank groups."""
    vecs_per_chunk = 16 // bits  # 8-element vectors per 16-byte chunk: 4 (int4) / 2 (int8)
    slots = sorted(act_slot(t, v) for t in range(4) for v in range(vecs_per_chunk))
    assert slots == list(range(4 * vecs_per_chunk))
    for t in range(4):  # the producer's inverse (slot -> chunk, vector)
        for v in range(vecs_per_chunk):
            assert (slot_chunk(act_slot(t, v)), slot_vector(act_slot(t, v))) == (t, v)
    stage_k = variants.SMALL_M_STAGE_TRIPS * 4 * variants.chunk_elems(bits)
    row_bytes = 2 * stage_k + 16
    assert variants.gemm_small_m_smem(1, bits, 1) == 8 * row_bytes
    for trip in range(variants.SMALL_M_STAGE_TRIPS):
        for v in range(vecs_per_chunk):
            for q in range(4):
                groups = {((2 * q + dg) * row_bytes + (trip * 4 * vecs_per_chunk + act_slot(t, v)) * 16) // 16 % 8
                          for dg in (0, 1) for t in range(4)}
                assert len(groups) == 8, (bits, trip, v, q)


# --------------------------------------------------------------------------------------------
# config, shared memory, launch shape
# --------------------------------------------------------------------------------------------

def test_config_validates_and_names_its_defines():
    assert GemmSmallMConfig(row_tiles=4, warps=4, stages=2).defines() == {
        "GEMM_SMALL_M_ROW_TILES": 4, "GEMM_SMALL_M_WARPS": 4, "GEMM_SMALL_M_STAGES": 2}
    assert GemmSmallMConfig(splits=3).defines() == {}  # splits is a launch choice, not a build
    assert GemmSmallMConfig().rows_per_block == 256 and GemmSmallMConfig(row_tiles=1, warps=4).rows_per_block == 64
    assert GemmSmallMConfig(row_tiles=4).max_m == 32 and GemmSmallMConfig().max_m == 64
    for kwargs in ({"row_tiles": 3}, {"warps": 2}, {"stages": 5}, {"splits": 0}, {"splits": True}, {"splits": 1.5}):
        with pytest.raises(ValueError, match="GemmSmallMConfig"):
            GemmSmallMConfig(**kwargs)


def test_m_tiles():
    assert [variants.small_m_tiles(M) for M in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="M=65"):
        variants.small_m_tiles(65)


# (SMs, shared memory per SM, opt-in per block, reserved per block)
H100 = (132, 233472, 232448, 1024)
A100 = (108, 167936, 166912, 1024)
SM86 = (84, 102400, 101376, 1024)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m_tiles", [1, 2, 4, 8])
def test_shared_memory_fits(bits, m_tiles):
    """Every stage count fits the A100 / H100 per-block maximum; 3 stages still fit sm_86/89 at M = 64."""
    for stages in (2, 3, 4):
        assert wo.gemm_small_m_smem(m_tiles, bits, stages) <= A100[2]
    assert wo.gemm_small_m_smem(m_tiles, bits, 3) <= SM86[2]


def test_default_config_falls_back_to_fewer_stages(monkeypatch):
    monkeypatch.setattr(gemm_small_m, "smem_limits", lambda device: SM86[1:])
    four = GemmSmallMConfig(stages=4)
    assert gemm_small_m._fitting_config(four, False, 8, 4, 0) == GemmSmallMConfig(stages=3)
    assert gemm_small_m._fitting_config(four, False, 2, 4, 0) is four  # small tiles fit as they are
    with pytest.raises(ValueError, match="shared memory"):
        gemm_small_m._fitting_config(four, True, 8, 4, 0)  # a forced config is refused, not changed
    monkeypatch.setattr(gemm_small_m, "smem_limits", lambda device: (1024, 1024, 0))
    with pytest.raises(ValueError, match="shared memory"):
        gemm_small_m._fitting_config(GemmSmallMConfig(), False, 1, 4, 0)


def test_launch_shape_llama_8b_on_h100():
    """One wave where N alone leaves SMs idle: N = 4096 gives 16 blocks of 256 rows, so K splits 8 ways."""
    assert wo.small_m_launch_shape(4096, 4096, 4, 132) == wo.SmallMShape(blocks_n=16, splits=8, chunks_per_split=16)
    assert wo.small_m_launch_shape(28672, 4096, 4, 132).splits == 1  # 112 blocks: splitting would not balance it
    assert wo.small_m_launch_shape(4096, 4096, 4, 132, blocks_per_sm=2).splits == 8  # capped: 2 stages per split
    assert wo.small_m_launch_shape(16, 4096, 4, 132, GemmSmallMConfig(splits=1)).splits == 1
    assert wo.small_m_launch_shape(16, 96, 4, 132, GemmSmallMConfig(splits=5)) == wo.SmallMShape(1, 1, 8)


@pytest.mark.parametrize("device", [H100, A100, SM86], ids=["h100", "a100", "sm86"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("config", [GemmSmallMConfig(), GemmSmallMConfig(row_tiles=1, warps=4),
                                    GemmSmallMConfig(splits=3)], ids=["default", "r1w4", "splits3"])
@pytest.mark.parametrize("N, K", [(16, 96), (48, 1056), (4112, 4160), (4096, 4096), (6144, 4096), (28672, 4096),
                                  (4096, 14336), (57344, 8192), (2048, 8192)])
def test_launch_shape_invariants(device, bits, config, N, K):
    sms = device[0]
    if K % variants.chunk_elems(bits):
        pytest.skip("K is not a whole number of chunks")
    shape = wo.small_m_launch_shape(N, K, bits, sms, config)
    chunks = K // variants.chunk_elems(bits)
    stage_chunks = 4 * variants.SMALL_M_STAGE_TRIPS
    assert shape.blocks_n == -(-N // config.rows_per_block)
    assert shape.chunks_per_split % stage_chunks == 0                   # splits start on a stage
    assert shape.splits * shape.chunks_per_split >= chunks              # every chunk covered
    assert (shape.splits - 1) * shape.chunks_per_split < chunks         # no empty split
    if config.splits is None:
        assert shape.splits == 1 or shape.blocks_n < sms                # split only where SMs would idle
        assert shape.splits == 1 or shape.blocks_n * shape.splits <= sms  # ... and then at most one wave
        assert shape.splits == 1 or shape.chunks_per_split >= variants.SMALL_M_MIN_SPLIT_STAGES * stage_chunks
    else:
        assert shape.splits <= config.splits


# --------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------

def _qw(N=64, K=256, bits=4, block_size=64):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    return quantize_weight(w, bits=bits, block_size=block_size)


def test_registered_as_a_strategy():
    assert "gemm_small_m" in wo.STRATEGIES and wo.PLANS["gemm_small_m"] is wo.GemmSmallMPlan
    assert wo.GemmSmallMPlan.config_type is GemmSmallMConfig
    assert wo.GemmSmallMPlan.per_m and not wo.GemmSmallMPlan.bias_tensor


def test_strategy_problem_names_the_constraint():
    qw = _qw()
    assert wo.strategy_problem("gemm_small_m", 64, torch.float16, qw, 80) is None
    assert wo.strategy_problem("gemm_small_m", 1, torch.bfloat16, _qw(bits=8, block_size=32), 90) is None
    assert wo.strategy_problem("gemm_small_m", 9, torch.float16, _qw(block_size=None), 90) is None  # per-channel
    assert "float32" in wo.strategy_problem("gemm_small_m", 9, torch.float32, qw, 90)
    assert "sm_80" in wo.strategy_problem("gemm_small_m", 9, torch.float16, qw, 75)
    assert "M <= 64" in wo.strategy_problem("gemm_small_m", 65, torch.float16, qw, 90)
    assert "K % 32" in wo.strategy_problem("gemm_small_m", 9, torch.float16, _qw(K=264, block_size=8), 90)
    assert "block_size" in wo.strategy_problem("gemm_small_m", 9, torch.float16, _qw(K=384, block_size=96), 90)


@pytest.mark.parametrize("M, N, dtype, cc, block_size, expected", [
    (1, 4096, torch.float16, 90, 64, "gemv_mma"),       # below GEMM_SMALL_M_MIN_M
    (16, 4096, torch.float16, 80, 64, "gemv_mma"),      # narrow weight below GEMM_SMALL_M_MIN_M = 17
    (17, 4096, torch.float16, 80, 64, "gemm_small_m"),  # narrow weight: from M = 17
    (8, 6144, torch.float16, 90, 64, "gemv_mma"),       # wide weight below GEMM_SMALL_M_WIDE_MIN_M
    (31, 28672, torch.float16, 80, 64, "gemv_mma"),     # (sm_90 takes gemm_wgmma from M = 17)
    (32, 28672, torch.bfloat16, 80, 64, "gemm_small_m"),  # wide weight from M = 32
    (64, 6144, torch.float16, 80, None, "gemm_small_m"),
    (32, 4096, torch.float16, 80, 64, "gemm_small_m"),
    (65, 4096, torch.float16, 80, 64, "gemm_mma"),
    (17, 28672, torch.float16, 90, 64, "gemm_wgmma"),
    (9, 4096, torch.float32, 90, 64, "gemm_simt"),
    (9, 4096, torch.float16, 75, 64, "gemm_simt"),
    (9, 4096, torch.float16, 90, 96, "gemm_mma"),        # 96 / 32 is no power of two: the order goes on
])
def test_default_dispatch(M, N, dtype, cc, block_size, expected):
    qw = _qw(N=N, K=384 if block_size == 96 else 256, block_size=block_size)  # int4
    assert wo.choose_strategy(M, dtype, qw, cc) == expected


@pytest.mark.parametrize("M, expected", [(8, "gemv_mma"), (32, "gemv_mma"), (33, "gemm_small_m"), (64, "gemm_small_m")])
def test_int8_weights_from_m_33(M, expected):
    assert wo.choose_strategy(M, torch.float16, _qw(N=4096, bits=8), 80) == expected


@pytest.mark.parametrize("M", [8, 17, 33, 64])
def test_the_switch_turns_it_off(monkeypatch, M):
    monkeypatch.setattr(dispatch, "GEMM_SMALL_M_DEFAULT", False)
    assert wo.choose_strategy(M, torch.float16, _qw(N=4096), 80) == "gemv_mma"


# --------------------------------------------------------------------------------------------
# compute-sanitizer coverage
# --------------------------------------------------------------------------------------------

def test_sanitize_cases_reach_every_entry():
    """scripts/sanitize_kernels.py has default cases for every gemm_small_m entry point, its filters
    match them, and its coverage check of all kernels passes."""
    script = ROOT / "scripts" / "sanitize_kernels.py"
    listed = subprocess.run([sys.executable, str(script), "--list", "--family", "gemm_small_m"],
                            capture_output=True, text=True, cwd=ROOT)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    for entry in _entries(GemmSmallMConfig()):
        assert entry in listed.stdout, entry
    coverage = subprocess.run([sys.executable, str(script), "--check-coverage"], capture_output=True, text=True,
                              cwd=ROOT)
    assert coverage.returncode == 0, coverage.stdout + coverage.stderr
    assert re.search(r"gemm_small_m\.cu\s+4 /\s+4 reached", coverage.stdout), coverage.stdout
