"""Tile selection of the CUTLASS int8 GEMMs (no GPU): M buckets, the float_out override, the tuner's
choice, and emission of every configured kernel and every tuner candidate.

Emission only, except one slow test that compiles the int8-output kernel of the new medium bucket
(Sm90, about a minute on 2 cores).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import epilogues
from cutlass_ops import cutlass as gemm_api
from cutlass_ops.cutlass import build as gemm_build
from cutlass_ops.cutlass import tuning
from cutlass_ops.cutlass.emit import emit

REPO = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
FLOAT = ("f16", "bf16", "f32")


def _load_tuner():
    spec = importlib.util.spec_from_file_location("tune_int8_gemm", REPO / "scripts" / "tune_int8_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tuner = _load_tuner()


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    """A copy of the tuning tables the test may edit; the table cache is cleared around it."""
    directory = tmp_path / "tuning"
    shutil.copytree(tuning.TUNING_DIR, directory)
    monkeypatch.setattr(tuning, "TUNING_DIR", directory)
    tuning.table.cache_clear()
    yield directory
    tuning.table.cache_clear()


def _edit(path: Path, change) -> None:
    table = json.loads(path.read_text())
    change(table)
    path.write_text(json.dumps(table))


# -- M buckets ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_name", [None, H100])
@pytest.mark.parametrize("M,bucket", [(1, "small"), (64, "small"), (65, "medium"), (128, "medium"),
                                      (256, "medium"), (257, "large"), (4096, "large")])
def test_bucket_boundaries(gpu_name, M, bucket):
    table = tuning.table(gpu_name)
    assert (table["small_m_max"], table["medium_m_max"]) == (64, 256)
    assert gemm_api.bucket_for(M, gpu_name) == bucket
    assert gemm_api.BUCKETS.index(bucket) == (0 if M <= 64 else 1 if M <= 256 else 2)


def test_bucket_limits_come_from_the_gpu_table(tuning_dir):
    (tuning_dir / "Test_GPU.json").write_text(json.dumps({"small_m_max": 32, "medium_m_max": 512}))
    assert [gemm_api.bucket_for(M, "Test GPU") for M in (32, 33, 512, 513)] == ["small", "medium", "medium", "large"]
    assert gemm_api.bucket_for(33) == "small"  # default.json unchanged


@pytest.mark.parametrize("limits", [{"medium_m_max": 32}, {"small_m_max": 0}, {"medium_m_max": "256"}])
def test_bad_bucket_limits_are_named(tuning_dir, limits):
    (tuning_dir / "Test_GPU.json").write_text(json.dumps(limits))
    with pytest.raises(ValueError, match="small_m_max.*medium_m_max"):
        tuning.table("Test GPU")


def test_every_generation_has_every_bucket():
    for gpu_name in (None, H100):
        table = tuning.table(gpu_name)
        for cc in ("75", "80", "90"):
            assert set(gemm_api.BUCKETS) <= set(table[cc]), (gpu_name, cc)


def test_medium_defaults():
    sm90 = gemm_api.kernel_spec(90, "90a", "dequant", "f16", "medium")
    assert sm90.threadblock_shape == (128, 128, 128) and sm90.cluster_shape == (1, 1, 1)
    assert sm90.kernel_schedule == sm90.epilogue_schedule == "TmaWarpSpecializedCooperative"
    sm80 = gemm_api.kernel_spec(80, "90", "requant", "s8", "medium")
    assert (sm80.threadblock_shape, sm80.stages) == ((64, 128, 64), 6)
    sm75 = gemm_api.kernel_spec(75, "90", "none", "s32", "medium")
    assert (sm75.threadblock_shape, sm75.stages) == ((64, 128, 64), 2)
    # The H100 table does not tune medium: default.json's entries apply.
    assert gemm_api.kernel_spec(90, "90a", "dequant", "f16", "medium", H100) == sm90
    with pytest.raises(ValueError, match="bucket"):
        gemm_api.kernel_spec(90, "90a", "none", "s32", "huge")


def test_configured_specs_take_the_buckets_asked_for():
    medium = gemm_api.configured_specs(90, buckets=("medium",))
    assert {s.threadblock_shape for s in medium if s.kernel_cc == 90} == {(128, 128, 128)}
    every = gemm_api.configured_specs(90)
    assert set(medium) <= set(every)
    assert len(every) == len(set(every)) == len({s.name for s in every})
    # Sm80 small and medium share default.json's tile: one kernel for both (besides the any-N kernel).
    sm80_none = [s for s in every if s.kernel_cc == 80 and s.epilogue == "none" and s.alignment_D > 1]
    assert sorted(s.threadblock_shape for s in sm80_none) == [(64, 128, 64), (256, 128, 128)]


def test_build_kernels_lists_the_medium_bucket():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build_kernels.py"), "--arch", "90",
                             "--bucket", "medium", "--gpu-name", H100, "--list"],
                            env=env, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [s.name for s in gemm_api.configured_specs(90, buckets=("medium",),
                                                                               gpu_name=H100)]


# -- float_out ---------------------------------------------------------------------------------


@pytest.mark.parametrize("epilogue,element_D", [
    ("dequant", "f16"), ("dequant", "bf16"), ("dequant_relu6", "f32"), ("kblock_accumulate", "f32"),
    ("requant", "s8"), ("requant_clamp", "s8"), ("none", "s32"),
])
def test_float_out_applies_to_float_outputs_only(epilogue, element_D):
    spec = gemm_api.kernel_spec(80, "90", epilogue, element_D, "small", H100)
    if element_D in FLOAT:
        assert (spec.threadblock_shape, spec.stages, spec.warp_count) == ((64, 64, 128), 4, (2, 2, 1))
    else:  # 64x64x128 does not build for int8 D; int32 D keeps the all-outputs tile too
        assert (spec.threadblock_shape, spec.stages) == ((64, 128, 64), 6)
    # Not in default.json, nor in the H100 table's other buckets and generations.
    assert gemm_api.kernel_spec(80, "90", epilogue, element_D, "small").threadblock_shape == (64, 128, 64)
    assert gemm_api.kernel_spec(80, "90", epilogue, element_D, "large", H100).threadblock_shape == (128, 256, 128)
    assert gemm_api.kernel_spec(90, "90a", epilogue, element_D, "small", H100).threadblock_shape == (64, 64, 128)


def test_float_out_is_a_whole_tile_and_a_gpu_entry_replaces_the_default(tuning_dir):
    """float_out keys are not merged with the entry's (a stale warp_count or stages would leak)."""
    sm90_small = {"threadblock_shape": [64, 128, 128], "cluster_shape": [1, 1, 1],
                  "kernel_schedule": "TmaWarpSpecializedPingpong", "epilogue_schedule": "TmaWarpSpecialized",
                  "float_out": {"threadblock_shape": [64, 64, 128]}}
    (tuning_dir / "Test_GPU.json").write_text(json.dumps({"90": {"small": sm90_small}}))
    f16 = gemm_api.kernel_spec(90, "90a", "dequant", "f16", "small", "Test GPU")
    assert f16.threadblock_shape == (64, 64, 128) and f16.kernel_schedule is None and f16.cluster_shape == (1, 1, 1)
    s8 = gemm_api.kernel_spec(90, "90a", "requant", "s8", "small", "Test GPU")
    assert s8.threadblock_shape == (64, 128, 128) and s8.kernel_schedule == "TmaWarpSpecializedPingpong"
    large = gemm_api.kernel_spec(90, "90a", "dequant", "f16", "large", "Test GPU")
    assert large.threadblock_shape == (128, 256, 128)  # untouched buckets keep default.json's
    assert {s.threadblock_shape for s in gemm_api.configured_specs(90, ["dequant", "requant"], ("small",), "Test GPU")
            if s.kernel_cc == 90} == {(64, 64, 128), (64, 128, 128)}


# -- the tuner's choice ------------------------------------------------------------------------


A = {"threadblock_shape": [64, 128, 64], "stages": 6}
B = {"threadblock_shape": [64, 64, 128], "stages": 4, "warp_count": [2, 2, 1]}
C = {"threadblock_shape": [128, 64, 64], "stages": 4, "warp_count": [2, 2, 1]}


def test_tuner_makes_a_faster_float_only_candidate_float_out():
    entry = tuner.choose([(74.2, A, True), (67.7, B, False), (80.0, C, True)])
    assert entry == {**A, "float_out": B}
    assert entry["float_out"] is not B  # a copy: the candidate table is not aliased into the JSON


def test_tuner_ignores_a_slower_float_only_candidate():
    assert tuner.choose([(74.2, A, True), (75.0, B, False), (70.0, C, True)]) == C


def test_tuner_needs_an_all_outputs_candidate():
    assert tuner.choose([(67.7, B, False)]) is None
    assert tuner.choose([]) is None


def test_tuner_buckets_and_shapes():
    assert set(tuner.SHAPES) == set(gemm_api.BUCKETS)
    for bucket, shapes in tuner.SHAPES.items():  # each bucket is timed on M values that fall in it
        assert {gemm_api.bucket_for(M) for M in shapes} == {bucket}
    assert tuner.SHAPES["medium"] == [128, 256]
    for cc in ("80", "90"):
        assert set(tuner.CANDIDATES[cc]) == set(gemm_api.BUCKETS)


TUNER_CANDIDATES = [(cc, bucket, tile) for cc, buckets in tuner.CANDIDATES.items()
                    for bucket, tiles in buckets.items() for tile in tiles]


@pytest.mark.parametrize("cc,bucket,tile", TUNER_CANDIDATES,
                         ids=[f"{bucket}-{tuner.spec_for(cc, tile, '90').name}" for cc, bucket, tile in TUNER_CANDIDATES])
def test_tuner_candidates_are_valid_cutlass_configs(cc, bucket, tile):
    """The interface accepts every candidate (f16 and int8 output); nvcc may still refuse the latter."""
    for spec in (tuner.spec_for(cc, tile, "90"), tuner.int8_out_spec(cc, tile, "90")):
        emitted = emit(spec)
        assert emitted.kernel_name in emitted.device_source
        assert "x".join(map(str, spec.threadblock_shape)) in spec.name


# -- every configured kernel emits -------------------------------------------------------------


def _configured() -> list:
    specs = dict.fromkeys([*gemm_api.configured_specs(90), *gemm_api.configured_specs(90, gpu_name=H100)])
    return list(specs)


CONFIGURED = _configured()


@pytest.mark.parametrize("spec", CONFIGURED, ids=[s.name for s in CONFIGURED])
def test_every_configured_kernel_emits(spec):
    emitted = emit(spec)
    assert f"{emitted.kernel_name}(" in emitted.device_source
    tb = spec.threadblock_shape
    if spec.kernel_cc == 90:
        per_cta = (tb[0] // spec.cluster_shape[0], tb[1] // spec.cluster_shape[1], tb[2])
        assert "cute::Shape<cute::_{}, cute::_{}, cute::_{}>".format(*per_cta) in emitted.device_source
    else:
        assert f"cutlass::gemm::GemmShape<{tb[0]}, {tb[1]}, {tb[2]}>" in emitted.device_source
    assert epilogues.OUTPUT_DTYPES[spec.element_D] is not None


def test_configured_kernels_cover_every_cc_bucket_epilogue_and_output():
    keys = set()
    for gpu_name in (None, H100):
        for cc in (90, 80, 75):
            for bucket in gemm_api.BUCKETS:
                for name in epilogues.names():
                    for element_D in epilogues.get(name).output_dtypes:
                        spec = gemm_api.kernel_spec(cc, "90a" if cc == 90 else "90", name, element_D, bucket, gpu_name)
                        assert spec in CONFIGURED, spec.name
                        keys.add((cc, bucket, name, element_D))
    assert len(keys) == 3 * 3 * sum(len(epilogues.get(n).output_dtypes) for n in epilogues.names())


# -- one compile (slow) ------------------------------------------------------------------------


@pytest.mark.slow
def test_medium_int8_output_kernel_compiles():
    """The medium bucket's Sm90 tile with int8 D (the output that refuses some tiles) builds."""
    spec = gemm_api.kernel_spec(90, "90a", "requant", "s8", "medium")
    artifact, _ = gemm_build.build(spec)
    assert artifact.cubin_path.read_bytes()[:4] == b"\x7fELF"
    assert artifact.meta["kernel_name"] in artifact.cubin_path.read_bytes().decode("latin-1")
    assert gemm_build.lookup(spec).directory == artifact.directory


# -- on a GPU: the per-call path picks the bucket's kernel ----------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M", [64, 65, 256, 257])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.int32])
def test_int8_gemm_launches_the_bucket_kernel(M, out_dtype):
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    cc, gpu_name = 10 * major + minor, torch.cuda.get_device_name(device)
    try:
        kernel_cc = gemm_api.resolve_arch(None, cc)
    except ValueError as exc:
        pytest.skip(str(exc))
    N, K = 256, 128
    # |A @ B^T| <= 4 * K = 512: exact in f16
    A = torch.randint(-2, 3, (M, K), dtype=torch.int8, device="cuda")
    B = torch.randint(-2, 3, (N, K), dtype=torch.int8, device="cuda")
    if out_dtype is torch.int32:
        out = gemm_api.int8_gemm(A, B, "none")
        expected = (A.cpu().int() @ B.cpu().int().T)
        assert torch.equal(out.cpu(), expected)
        element_D, epilogue = "s32", "none"
    else:
        s_row, s_col = torch.ones(M, device="cuda"), torch.ones(N, device="cuda")
        out = gemm_api.int8_gemm(A, B, "dequant", out_dtype=out_dtype, scale_row=s_row, scale_col=s_col)
        assert torch.equal(out.cpu().float(), (A.cpu().int() @ B.cpu().int().T).float())
        element_D, epilogue = "f16", "dequant"
    plan = gemm_api.plan_for(M, device, epilogue, None, None if out_dtype is torch.int32 else out_dtype)
    assert plan.spec == gemm_api.kernel_spec(kernel_cc, gemm_api.target_arch_for(kernel_cc, cc), epilogue, element_D,
                                             gemm_api.bucket_for(M, gpu_name), gpu_name)
