"""The tuned weight-only dispatch table (cutlass_ops.weight_only.tuned) and the pure helpers of its tuner
(scripts/tune_weight_only.py): loading, M range lookup, validation errors, the env switch, the shipped files.
No GPU: the files are temporary, the device name is faked."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cutlass_ops.cutlass.tuning import TUNING_DIR as INT8_TUNING_DIR, gpu_file_name
from cutlass_ops.weight_only import tuned
from cutlass_ops.weight_only.variants import (
    GemmSmallMConfig, GemmWgmmaConfig, GemvMmaConfig, default_gemv_mma_config, default_gemv_mma_configs,
)

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
GPU = "NVIDIA Test GPU 80GB"
SHAPE = {"N": 4096, "K": 14336, "bits": 4, "block_size": 128}
GEMV = {**SHAPE, "M": [1, 4], "strategy": "gemv_mma",
        "config": {"row_tiles": 1, "unroll": 8, "min_blocks": 1, "warps": 8}}
SMALL_M = {**SHAPE, "M": [5, 64], "strategy": "gemm_small_m", "config": {"stages": 2}}


def _load_script(name: str):
    if str(SCRIPTS) not in sys.path:  # the scripts import their siblings (_timing, bench_llm_shapes)
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    """tuned reads its per-GPU files from a fresh directory (its table cache emptied around the test)."""
    monkeypatch.setattr(tuned, "TUNING_DIR", tmp_path)
    monkeypatch.delenv(tuned.ENV_SWITCH, raising=False)
    tuned.table.cache_clear()
    yield tmp_path
    tuned.table.cache_clear()


def _write(directory: Path, section, gpu: str = GPU, **other) -> Path:
    path = directory / gpu_file_name(gpu)
    path.write_text(json.dumps({**other, **({} if section is None else {"weight_only": section})}))
    return path


def test_the_directory_and_file_names_are_the_int8_tiles_ones():
    assert tuned.TUNING_DIR == INT8_TUNING_DIR
    assert tuned.tuning_file("NVIDIA H100 80GB HBM3") == INT8_TUNING_DIR / "NVIDIA_H100_80GB_HBM3.json"
    assert tuned.tuning_file("NVIDIA H200").name == "NVIDIA_H200.json"


def test_lookup_by_shape_and_inclusive_M_range(tuning_dir):
    _write(tuning_dir, {"_source": "test", "entries": [SMALL_M, GEMV]})
    for M in (1, 4):
        assert tuned.tuned_choice(GPU, M, 4096, 14336, 4, 128) == (
            "gemv_mma", GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8))
    for M in (5, 16, 64):
        assert tuned.tuned_choice(GPU, M, 4096, 14336, 4, 128) == ("gemm_small_m", GemmSmallMConfig(stages=2))
    # another M, N, K, bits or block size: no entry
    for args in ((65, 4096, 14336, 4, 128), (1, 4096, 4096, 4, 128), (1, 14336, 4096, 4, 128),
                 (1, 4096, 14336, 8, 128), (1, 4096, 14336, 4, 64)):
        assert tuned.tuned_choice(GPU, *args) is None
    assert tuned.tuned_choice("Another GPU", 1, 4096, 14336, 4, 128) is None  # no file


def test_an_entry_for_one_activation_type_wins_for_that_type_only(tuning_dir):
    """"dtype": "bf16" entries apply to bf16 alone and win over type-less ones covering the same M; fp16 (and a
    lookup naming no type) keeps the type-less entries; ranges overlap freely across types, not within one."""
    bf16 = {**GEMV, "M": [1, 16], "dtype": "bf16", "config": {"row_tiles": 2, "unroll": 4}}
    _write(tuning_dir, {"entries": [GEMV, SMALL_M, bf16]})
    rule = ("gemv_mma", GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8))
    for M in (1, 4):
        assert tuned.tuned_choice(GPU, M, 4096, 14336, 4, 128, "fp16") == rule
        assert tuned.tuned_choice(GPU, M, 4096, 14336, 4, 128) == rule
        assert tuned.tuned_choice(GPU, M, 4096, 14336, 4, 128, "bf16") == ("gemv_mma", GemvMmaConfig(2, 4))
    assert tuned.tuned_choice(GPU, 16, 4096, 14336, 4, 128, "bf16") == ("gemv_mma", GemvMmaConfig(2, 4))
    assert tuned.tuned_choice(GPU, 16, 4096, 14336, 4, 128, "fp16")[0] == "gemm_small_m"
    assert tuned.tuned_choice(GPU, 17, 4096, 14336, 4, 128, "bf16")[0] == "gemm_small_m"  # type-less beyond 16
    qw = SimpleNamespace(N=4096, K=14336, bits=4, block_size=128)
    tuned._gpu_names[0] = GPU
    try:
        assert tuned.tuned_for(qw, 2, torch.bfloat16, 0, 90) == ("gemv_mma", GemvMmaConfig(2, 4))
        assert tuned.tuned_for(qw, 2, torch.float16, 0, 90) == rule
    finally:
        del tuned._gpu_names[0]
    _write(tuning_dir, {"entries": [bf16, {**bf16, "M": [16, 20]}]})
    tuned.table.cache_clear()
    with pytest.raises(ValueError, match=r"dtype=bf16\) overlap"):
        tuned.table(GPU)
    _write(tuning_dir, {"entries": [{**GEMV, "dtype": "fp32"}]})
    tuned.table.cache_clear()
    with pytest.raises(ValueError, match=r"dtype must be one of \['fp16', 'bf16'\]"):
        tuned.table(GPU)


def test_a_gap_between_ranges_keeps_the_rules(tuning_dir):
    _write(tuning_dir, {"entries": [GEMV, {**SMALL_M, "M": [16, 32]}]})
    assert tuned.tuned_choice(GPU, 8, 4096, 14336, 4, 128) is None
    assert tuned.tuned_choice(GPU, 16, 4096, 14336, 4, 128)[0] == "gemm_small_m"
    assert tuned.tuned_choice(GPU, 33, 4096, 14336, 4, 128) is None


def test_the_table_is_read_once_per_gpu(tuning_dir):
    path = _write(tuning_dir, {"entries": [GEMV]})
    first = tuned.table(GPU)
    assert len(first) == 1 and str(path) in first.source and first.compute_capability is None
    path.write_text(json.dumps({"weight_only": {"entries": []}}))
    assert tuned.table(GPU) is first  # cached: a changed file is read again only after cache_clear
    tuned.table.cache_clear()
    assert len(tuned.table(GPU)) == 0


def test_a_file_without_the_section_has_no_entries(tuning_dir):
    _write(tuning_dir, None, **{"90": {"small": {"threadblock_shape": [64, 64, 128]}}})
    assert tuned.table(GPU) is None
    assert tuned.tuned_choice(GPU, 1, 4096, 14336, 4, 128) is None


def test_the_env_switch_turns_the_lookup_off(tuning_dir, monkeypatch):
    _write(tuning_dir, {"entries": [GEMV]})
    for off in ("0", "off", "false"):
        monkeypatch.setenv("CUTLASS_OPS_TUNED", off)
        assert not tuned.enabled()
        assert tuned.tuned_choice(GPU, 1, 4096, 14336, 4, 128) is None
    monkeypatch.setenv("CUTLASS_OPS_TUNED", "1")
    assert tuned.tuned_choice(GPU, 1, 4096, 14336, 4, 128) is not None


def _qw(**fields):
    return SimpleNamespace(**{**SHAPE, **fields})


def test_tuned_for_the_default_dispatch(tuning_dir, monkeypatch):
    _write(tuning_dir, {"entries": [GEMV, SMALL_M]})
    monkeypatch.setattr(tuned, "device_gpu_name", lambda device: GPU)
    for dtype in (torch.float16, torch.bfloat16):
        assert tuned.tuned_for(_qw(), 2, dtype, 0, 90)[0] == "gemv_mma"
        assert tuned.tuned_for(_qw(), 32, dtype, 0, 80)[0] == "gemm_small_m"
    assert tuned.tuned_for(_qw(), 2, torch.float32, 0, 90) is None  # fp32 stays on CUDA cores
    assert tuned.tuned_for(_qw(), 2, torch.float16, 0, 75) is None  # no mma.m16n8k16
    assert tuned.tuned_for(_qw(N=1024), 2, torch.float16, 0, 90) is None  # not a tuned shape
    monkeypatch.setenv("CUTLASS_OPS_TUNED", "0")
    assert tuned.tuned_for(_qw(), 2, torch.float16, 0, 90) is None
    monkeypatch.delenv("CUTLASS_OPS_TUNED")
    monkeypatch.setattr(tuned, "device_gpu_name", lambda device: None)  # no CUDA runtime
    assert tuned.tuned_for(_qw(), 2, torch.float16, 0, 90) is None


def test_no_cuda_runtime_means_no_gpu_name(monkeypatch):
    monkeypatch.setattr(tuned, "_gpu_names", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tuned.device_gpu_name(0) is None
    monkeypatch.setattr(tuned, "_gpu_names", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"GPU {device}")
    assert tuned.device_gpu_name(1) == "GPU 1"


@pytest.mark.parametrize("entry, message", [
    ({**GEMV, "strategy": "gemv_stream"}, "strategy must be one of"),
    ({**GEMV, "config": {"rows": 4}}, "config key(s) 'rows' are not GemvMmaConfig fields"),
    ({**SMALL_M, "config": {"unroll": 4}}, "not GemmSmallMConfig fields"),
    ({**GEMV, "config": {"row_tiles": 3}}, "GemvMmaConfig.row_tiles must be one of"),
    ({**GEMV, "config": [1, 8]}, "config must be an object"),
    ({**GEMV, "M": [0, 4]}, "M must be [lo, hi]"),
    ({**GEMV, "M": [4, 1]}, "M must be [lo, hi]"),
    ({**GEMV, "M": [1, 65]}, "M must be [lo, hi] with 1 <= lo <= hi <= 64"),
    ({**GEMV, "M": [1, 2, 3]}, "M must be [lo, hi]"),
    ({**GEMV, "M": "1-4"}, "M must be [lo, hi]"),
    ({**SMALL_M, "config": {"row_tiles": 4, "warps": 4}}, "hi <= 32"),  # no 8-tile entry with row_tiles=4
    ({k: v for k, v in GEMV.items() if k != "K"}, "missing K"),
    ({**GEMV, "n": 1}, "unknown key(s) n"),
    ({**GEMV, "bits": 5}, "bits must be 4 or 8"),
    ({**GEMV, "N": 0}, "N must be a positive integer"),
    ({**GEMV, "block_size": 100}, "block_size must divide K"),
    ({**GEMV, "K": 14336 + 16, "block_size": 14352}, "K % 32 == 0"),  # what dispatch.strategy_problem refuses
    ({**GEMV, "block_size": 112}, "block_size = 32 * 2^j"),
    ("gemv_mma", "must be an object"),
])
def test_a_bad_entry_names_the_file_and_the_entry(tmp_path, entry, message):
    path = _write(tmp_path, {"entries": [SMALL_M, entry]})
    with pytest.raises(ValueError) as info:
        tuned.load_file(path)
    text = str(info.value)
    assert str(path) in text and "weight_only.entries[1]" in text and message in text, text


def test_overlapping_ranges_of_one_shape_are_refused(tmp_path):
    path = _write(tmp_path, {"entries": [GEMV, {**SMALL_M, "M": [4, 64]}]})
    with pytest.raises(ValueError, match=r"entries\[0\] and \[1\] \(N=4096, K=14336, bits=4, block_size=128\) "
                                         r"overlap: M \[1, 4\] and \[4, 64\]"):
        tuned.load_file(path)
    # the same M ranges on another weight (block size) are no overlap
    tuned.load_file(_write(tmp_path, {"entries": [GEMV, {**SMALL_M, "M": [4, 64], "block_size": 64}]}))


@pytest.mark.parametrize("section, message", [
    ([GEMV], "'weight_only' must be an object"),
    ({"entries": {"0": GEMV}}, "entries must be a list"),
    ({"entries": [], "extra": 1}, "unknown key(s) extra"),
    ({"entries": [], "compute_capability": "sm_90"}, "compute_capability must be a positive integer"),
])
def test_a_bad_section_names_the_file(tmp_path, section, message):
    path = _write(tmp_path, section)
    with pytest.raises(ValueError) as info:
        tuned.load_file(path)
    assert str(path) in str(info.value) and message in str(info.value)


def test_bad_json_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="x.json: not valid JSON"):
        tuned.load_file(path)


def test_a_bad_shipped_entry_fails_the_lookup_loudly(tuning_dir):
    _write(tuning_dir, {"entries": [{**GEMV, "strategy": "nope"}]})
    with pytest.raises(ValueError, match=gpu_file_name(GPU)):
        tuned.tuned_choice(GPU, 1, 4096, 14336, 4, 128)


def test_comments_and_defaults(tmp_path):
    section = {"_source": "x", "_note": "y", "compute_capability": 90,
               "entries": [{**GEMV, "config": {}, "_us": 1.5}]}
    table = tuned.load_file(_write(tmp_path, section))
    assert table.compute_capability == 90 and table.entries[0].config == GemvMmaConfig()
    assert tuned.config_json(GemvMmaConfig(splits=None)) == {"row_tiles": 2, "unroll": 4, "min_blocks": 2, "warps": 8}
    assert tuned.config_json(GemvMmaConfig(splits=1))["splits"] == 1


def test_shipped_entries(tmp_path):
    _write(tmp_path, {"compute_capability": 90, "entries": [GEMV, SMALL_M, {**SMALL_M, "bits": 8}]})
    _write(tmp_path, None, gpu="Other", small_m_max=64)  # int8 tiles only
    _write(tmp_path, {"entries": [GEMV]}, gpu="Old")  # no compute capability recorded
    found = {(cc, e.bits, e.strategy, e.config, e.M_lo, e.M_hi) for cc, e in tuned.shipped_entries(tmp_path)}
    assert found == {(90, 4, "gemv_mma", GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8), 1, 4),
                     (90, 4, "gemm_small_m", GemmSmallMConfig(stages=2), 5, 64),
                     (90, 8, "gemm_small_m", GemmSmallMConfig(stages=2), 5, 64),
                     (None, 4, "gemv_mma", GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8), 1, 4)}


@pytest.mark.parametrize("path", sorted(INT8_TUNING_DIR.glob("*.json")), ids=lambda p: p.name)
def test_the_shipped_files_load(path):
    table = tuned.load_file(path)  # raises on a malformed weight_only section
    if table is not None:
        assert table.compute_capability is None or table.compute_capability >= 80
    list(tuned.shipped_entries())


# --- scripts/tune_weight_only.py: the pure helpers ------------------------------------------------------------

@pytest.fixture(scope="module")
def tuner():
    return _load_script("tune_weight_only")


def test_candidates(tuner):
    small = tuner.candidates(4)
    assert small[0] == tuner.Candidate("gemv_mma", GemvMmaConfig())  # the reference comes first
    gemv = len(tuner.GEMV_MMA_CONFIGS)
    assert {c.strategy for c in small} == {"gemv_mma"} and len(small) == len(set(small)) == gemv
    wide = len(tuner._GEMV_MMA_WIDE_M)  # from M = 9 only
    assert len(tuner.candidates(tuner.GEMV_MMA_WIDE_FROM_M - 1)) == gemv + 4  # gemm_small_m from M = 8
    at64 = tuner.candidates(64)
    assert len(at64) == gemv + wide + 3  # the row_tiles=4 gemm_small_m takes M <= 32
    assert len(tuner.candidates(32)) == gemv + wide + 4
    r4u1 = len(tuner._GEMV_MMA_R4U1)  # M = 9..16 only
    assert len(tuner.candidates(tuner.GEMV_MMA_R4U1_TO_M)) == gemv + wide + r4u1 + 4
    assert len(tuner.candidates(tuner.GEMV_MMA_WIDE_FROM_M)) == gemv + wide + r4u1 + 4
    assert "gemv_mma r4u1b2w4f" in [c.label for c in tuner.candidates(16)]
    labels = [c.label for c in at64]
    assert "gemv_mma r4u2b1w8k1f" in labels
    assert "gemv_mma r1u8b1w4" in labels and "gemv_mma r2u4b2w8k1" in labels and "gemm_small_m r2w8s2" in labels
    for M in (1, 4, 8, 16, 24, 33, 64):  # the rule's variants are among the candidates (no untimed compile)
        for bits in (4, 8):
            timed = {frozenset(c.config.defines().items()) for c in tuner.candidates(M) if c.strategy == "gemv_mma"}
            assert {frozenset(c.defines().items()) for c in default_gemv_mma_configs(M, bits)} <= timed
        small_m = tuner.rule_candidate("gemm_small_m", M, 4, 4096, 4096, 132)
        assert small_m in tuner.candidates(M) or M < tuner.GEMM_SMALL_M_FROM_M
    assert tuner.rule_candidate("dequant_cublas", 128, 4, 4096, 4096, 132) is None
    # the rule's gemv_mma variant for a weight and GPU (warps and K splits by N, K and SM count)
    assert tuner.rule_candidate("gemv_mma", 1, 8, 4096, 14336, 132) == tuner.Candidate(
        "gemv_mma", default_gemv_mma_config(1, 8, 4096, 14336, 132))


def test_pick_keeps_the_rule_within_the_min_gain(tuner):
    a, b = (tuner.Candidate("gemv_mma", c) for c in tuner.GEMV_MMA_CONFIGS[:2])
    assert tuner.pick({a: 10.0, b: 9.9}, a, 0.02) == a
    assert tuner.pick({a: 10.0, b: 9.7}, a, 0.02) == b
    assert tuner.pick({a: 10.0, b: 9.9}, a, 0.0) == b
    assert tuner.pick({b: 9.9}, a, 0.02) == b  # the rule's failed: the fastest
    assert tuner.pick({}, a, 0.02) is None


def test_ranges_and_entries(tuner):
    assert tuner.covered_ranges([1, 2, 4, 8, 16, 32, 64]) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32),
                                                              (33, 64)]
    assert tuner.covered_ranges([64, 16, 1, 4]) == [(1, 1), (2, 4), (5, 16), (17, 64)]
    g, s = tuner.Candidate("gemv_mma", GemvMmaConfig()), tuner.Candidate("gemm_small_m", GemmSmallMConfig(stages=2))
    picks = {1: g, 2: g, 4: g, 8: s, 16: s, 32: g, 64: s}
    entries = tuner.shape_entries(4096, 14336, 4, 128, picks)
    assert [(e["M"], e["strategy"]) for e in entries] == [
        ([1, 4], "gemv_mma"), ([5, 16], "gemm_small_m"), ([17, 32], "gemv_mma"), ([33, 64], "gemm_small_m")]
    assert entries[1]["config"] == {"row_tiles": 2, "warps": 8, "stages": 2}
    table = tuned.parse_section({"entries": entries}, "test")  # what the tuner writes, the dispatch reads
    assert table.lookup(3, 4096, 14336, 4, 128).config == GemvMmaConfig()


def test_write_json_keeps_other_sections_and_shapes(tuner, tmp_path):
    path = tmp_path / "NVIDIA_H100_80GB_HBM3.json"
    other = {"N": 8192, "K": 8192, "bits": 8, "block_size": 128, "M": [1, 64], "strategy": "gemv_mma", "config": {}}
    int8 = {"_source": "int8 tuner", "90": {"small": {"threadblock_shape": [64, 64, 128]}}}
    path.write_text(json.dumps({**int8, "weight_only": {"entries": [other, {**GEMV, "M": [1, 64]}]}}))
    g = tuner.Candidate("gemv_mma", GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4))
    tuner.write_json(path, tuner.shape_entries(4096, 14336, 4, 128, {1: g, 64: g}), "run 1", 90)
    data = json.loads(path.read_text())
    assert {k: data[k] for k in int8} == int8  # the int8 GEMM tiles untouched
    section = data["weight_only"]
    assert section["compute_capability"] == 90 and section["_source"].startswith("run 1")
    assert "1 entries of shapes not tuned in this run kept" in section["_source"]
    table = tuned.load_file(path)
    assert len(table) == 2 and table.lookup(10, 4096, 14336, 4, 128).config == g.config  # replaced
    assert table.lookup(10, 8192, 8192, 8, 128).config == GemvMmaConfig()  # kept
    assert sum(line.lstrip().startswith('{"N"') for line in path.read_text().splitlines()) == 2  # one per line


def test_bf16_entries_only_where_bf16_prefers_another_variant(tuner, tmp_path, caplog):
    """--dtype bf16: the ranges whose choice is the baseline's (what the file gives bf16 now) are left out, the
    others written with "dtype": "bf16"; a second bf16 run replaces the shape's bf16 entries (even with none left),
    never its type-less ones."""
    g, s = tuner.Candidate("gemv_mma", GemvMmaConfig()), tuner.Candidate("gemm_small_m", GemmSmallMConfig(stages=2))
    picks = {1: g, 2: s, 4: s, 8: g, 16: g}
    entries = tuner.shape_entries(4096, 14336, 4, 128, picks, "bf16", {1: g, 2: g, 4: g, 8: g, 16: s})
    assert [(e["M"], e["strategy"], e["dtype"]) for e in entries] == [
        ([2, 4], "gemm_small_m", "bf16"), ([9, 16], "gemv_mma", "bf16")]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"weight_only": {"entries": [{**GEMV, "M": [1, 64]}]}}))
    shape = {(4096, 14336, 4, 128, "bf16")}
    tuner.write_json(path, entries, "bf16 run", 90, shape)
    table = tuned.load_file(path)
    assert len(table) == 3 and table.lookup(3, 4096, 14336, 4, 128, "bf16").strategy == "gemm_small_m"
    assert table.lookup(3, 4096, 14336, 4, 128, "fp16").strategy == "gemv_mma"  # the type-less entry
    assert table.lookup(6, 4096, 14336, 4, 128, "bf16").config == GemvMmaConfig(**GEMV["config"])  # not covered
    tuner.write_json(path, entries, "bf16 again", 90, shape)
    with caplog.at_level("WARNING", logger="tune_weight_only"):  # an fp16 re-tune of the shape: bf16 is stale
        tuner.write_json(path, tuner.shape_entries(4096, 14336, 4, 128, {64: g}), "fp16 run", 90)
    assert "2 typed (bf16) entries of the shapes re-tuned here" in caplog.text
    tuner.write_json(path, [], "bf16 again", 90, shape)  # nothing better any more: the bf16 entries go
    assert len(tuned.load_file(path)) == 1
    args = tuner.parse_args(["--dtype", "bf16"])
    assert args.dtype == "bf16" and tuner.parse_args([]).dtype == "fp16"


def test_write_json_refuses_a_bad_section_before_writing(tuner, tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text("{}")
    bad = [{**GEMV, "M": [1, 64], "strategy": "gemm_small_m", "config": {"row_tiles": 4, "warps": 4}}]
    with pytest.raises(ValueError, match="hi <= 32"):
        tuner.write_json(path, bad, "run", 90)
    assert path.read_text() == "{}"


def test_tuner_arguments(tuner):
    args = tuner.parse_args([])
    assert args.M == [1, 2, 4, 8, 16, 32, 64] and args.bits == [4, 8] and args.write_json is None
    assert len(tuner.selected_shapes(args)) == len(tuner.SHAPES)
    quick = tuner.parse_args(["--quick", "--write-json"])
    assert quick.M == [1, 4, 16, 64] and quick.write_json == ""
    assert {s[0] for s in tuner.selected_shapes(quick)} == {"8B"}
    assert tuner.parse_args(["--write-json", "x.json"]).write_json == "x.json"
    assert [s[1] for s in tuner.selected_shapes(tuner.parse_args(["--shapes", "70B/down"]))] == ["down"]
    for bad in (["--M", "0"], ["--M", "65"], ["--min-gain", "1"], ["--bits", "3"], ["--jobs", "0"]):
        with pytest.raises(SystemExit):
            tuner.parse_args(bad)


def test_loop_options_written_only_when_set(tmp_path):
    """gemv_mma's chains / full_batches reach the JSON only when they differ from the kernel's defaults, and an entry
    carrying them loads back to the same config."""
    assert "chains" not in tuned.config_json(GemvMmaConfig()) and "full_batches" not in tuned.config_json(GemvMmaConfig())
    cfg = GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4, chains=2, full_batches=1)
    assert tuned.config_json(cfg)["chains"] == 2 and tuned.config_json(cfg)["full_batches"] == 1
    table = tuned.load_file(_write(tmp_path, {"compute_capability": 90,
                                              "entries": [{**GEMV, "config": tuned.config_json(cfg)}]}))
    assert table.entries[0].config == cfg


def test_wgmma_entries_need_a_hopper_file():
    """gemm_wgmma runs on sm_90 only: a file of that generation may name it, one of another (or none) may not."""
    entry = {"N": 4096, "K": 4096, "bits": 4, "block_size": 128, "M": [17, 64], "strategy": "gemm_wgmma",
             "config": {"warpgroups": 4, "stages": 3}}
    table = tuned.parse_section({"compute_capability": 90, "entries": [entry]}, "h200.json")
    assert table.lookup(40, 4096, 4096, 4, 128).config == GemmWgmmaConfig(warpgroups=4, stages=3)
    for cc in (80, None):
        with pytest.raises(ValueError, match="gemm_wgmma needs sm_90"):
            tuned.parse_section({"compute_capability": cc, "entries": [entry]} if cc else {"entries": [entry]},
                                "a100.json")


def test_llm_shapes_rules_mode(monkeypatch):
    """bench_llm_shapes --rules: the tuning file off for the run, other models' weights added (--shapes picks among
    both lists then, among the Llama ones otherwise); it excludes --gemm-small-m."""
    bench = _load_script("bench_llm_shapes")
    assert bench.selected_shapes(bench.parse_args([])) == list(bench.SHAPES)
    llama = bench.selected_shapes(bench.parse_args(["--shapes", "8B/o", "1024x4096"]))
    assert [bench.name(s) for s in llama] == ["8B/o"]
    rules = bench.parse_args(["--rules"])
    assert bench.selected_shapes(rules) == list(bench.SHAPES + bench.OTHER_SHAPES)
    picked = bench.selected_shapes(bench.parse_args(["--rules", "--shapes", "Qwen2.5-0.5B", "1024x4096"]))
    assert [bench.name(s) for s in picked] == ["Qwen2.5-0.5B/qkv", "Qwen2.5-0.5B/o", "Qwen2.5-0.5B/gate_up",
                                              "Qwen2.5-0.5B/down", "8B/k"]
    assert not {bench.name(s) for s in bench.OTHER_SHAPES} & {bench.name(s) for s in bench.SHAPES}
    monkeypatch.setenv(tuned.ENV_SWITCH, "1")
    bench.apply_mode(bench.parse_args([]))
    assert tuned.enabled()
    bench.apply_mode(rules)
    assert not tuned.enabled()
    with pytest.raises(SystemExit):
        bench.parse_args(["--rules", "--gemm-small-m"])
