"""The pure helpers of scripts/bench_conv.py and scripts/bench_int8_padding.py (no GPU): the layer
set, block sizes, ratio cells, argument parsing; importing either script needs no GPU."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from cutlass_ops.formats import quantize_conv_weight

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load(name: str):
    if str(SCRIPTS) not in sys.path:  # the scripts import their sibling _timing
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_conv = _load("bench_conv")
bench_pad = _load("bench_int8_padding")


def test_resnet_shapes_are_the_distinct_anchor_layers():
    shapes = bench_conv.resnet_shapes()
    assert len(shapes) == len(set(shapes)) == 7
    assert set(shapes) == {layer[1:] for layer in bench_conv.LAYERS}


def test_layer_set_runs_every_shape_at_every_batch():
    layers = bench_conv.layer_set([1, 32])
    assert len(layers) == 2 * (7 + 1 + len(bench_conv.DEPTHWISE))
    assert [layer.batch for layer in layers] == [1] * 10 + [32] * 10
    kinds = [bench_conv.layer_kind(layer) for layer in layers[:10]]
    assert kinds == ["ResNet-50"] * 7 + ["stem", "depthwise", "depthwise"]
    stem = layers[7]
    assert (stem.Ci, stem.H, stem.Co, stem.k, stem.stride, stem.groups, stem.K) == (3, 224, 64, 7, 2, 1, 147)
    for dw in layers[8:10]:
        assert dw.groups == dw.Ci == dw.Co and dw.K == dw.k * dw.k
    assert {(dw.k, dw.Ci) for dw in layers[8:10]} == {(3, 128), (7, 96)}


@pytest.mark.parametrize("K, requested, expected", [(576, 64, 64), (256, 64, 64), (147, 64, 49), (147, 128, 49),
                                                    (147, 147, 147), (9, 64, 9), (49, 64, 49), (49, 32, 7)])
def test_block_size_divides_K(K, requested, expected):
    assert bench_conv.block_size_for(K, requested) == expected


@pytest.mark.parametrize("shape, groups", [((64, 3, 7, 7), 1), ((128, 1, 3, 3), 128), ((96, 1, 7, 7), 96)])
@pytest.mark.parametrize("bits", [4, 8])
def test_the_stem_and_depthwise_block_sizes_quantize(shape, groups, bits):
    Co, Cg, k, _ = shape
    layer = bench_conv.Layer(1, Cg * groups, 56, Co, k, 1, groups)
    block = bench_conv.block_size_for(layer.K, 64)
    qw = quantize_conv_weight(torch.randn(shape), bits=bits, block_size=block, symmetric=False)
    assert qw.block_size == block and qw.K == layer.K and qw.conv_shape == (Co, k, k, Cg)


def test_auto_strategy_of_the_layer_set():
    strategies = {bench_conv.layer_kind(layer): set() for layer in bench_conv.layer_set([1])}
    for layer in bench_conv.layer_set([1]):
        strategies[bench_conv.layer_kind(layer)].add(
            bench_conv.auto_strategy(layer, bench_conv.block_size_for(layer.K, 64)))
    assert strategies == {"ResNet-50": {"igemm"}, "stem": {"dequant_cudnn"}, "depthwise": {"depthwise"}}
    # batch 32: every layer at >= DEQUANT_CUDNN_MIN_MACS multiply-adds runs dequant_cudnn; the depthwise 3x3
    # (115 M) keeps its own kernel
    at_batch = {bench_conv.layer_label(layer): bench_conv.auto_strategy(layer, bench_conv.block_size_for(layer.K, 64))
                for layer in bench_conv.layer_set([32])}
    assert at_batch.pop("32, 128, 56x56, 128, 3, 1, 128") == "depthwise"
    assert set(at_batch.values()) == {"dequant_cudnn"}


def test_prefer_times_the_forced_strategies_where_they_apply():
    """--prefer depthwise small_ci: the depthwise layers take depthwise, the stem small_ci, the rest auto;
    --prefer igemm dequant_cudnn: the ResNet-50 layers igemm, the rest dequant_cudnn."""
    picked = {bench_conv.layer_kind(layer): set() for layer in bench_conv.layer_set([1, 32])}
    for layer in bench_conv.layer_set([1, 32]):
        block = bench_conv.block_size_for(layer.K, 64)
        picked[bench_conv.layer_kind(layer)].add(bench_conv.strategy_for(layer, block, ("depthwise", "small_ci")))
        assert bench_conv.strategy_for(layer, block) == "auto"
    assert picked == {"ResNet-50": {"auto"}, "stem": {"small_ci"}, "depthwise": {"depthwise"}}
    assert bench_conv.parse_args(["--prefer", "small_ci"]).prefer == ["small_ci"]
    picked = {bench_conv.layer_kind(layer): bench_conv.strategy_for(layer, bench_conv.block_size_for(layer.K, 64),
                                                                     ("igemm", "dequant_cudnn"))
              for layer in bench_conv.layer_set([1])}
    assert picked == {"ResNet-50": "igemm", "stem": "dequant_cudnn", "depthwise": "dequant_cudnn"}


def test_conv_ratio_cells_and_summary():
    assert bench_conv.fmt_ratio(1.5) == "1.50x"
    assert bench_conv.fmt_ratio(1.51) == "1.51x!"
    assert bench_conv.fmt_ratio(None) == "-"
    assert bench_conv.ratio_of(3.0, 2.0) == 1.5
    assert bench_conv.ratio_of("refused: no", 2.0) is None
    assert bench_conv.refusal(ValueError("a | b\nsecond line")) == "refused: a / b"
    assert len(bench_conv.refusal(ValueError("x" * 300))) == len("refused: ") + 100
    assert math.isclose(bench_conv.geomean([0.5, 2.0]), 1.0)
    layers = bench_conv.layer_set([1])
    results = [(layers[0], {"cudnn_nhwc": 10.0, "w4_nhwc": 20.0, "w8_nhwc": 9.0}),
               (layers[7], {"cudnn_nhwc": 10.0, "w4_nhwc": "refused: x", "w8_nhwc": 9.0})]
    w4, w8 = bench_conv.batch_summary(1, results)
    assert "geometric mean 2.00x! over 1 layers" in w4 and "0/2" in w4 and "(2.00x)" in w4 and "refused or failed" in w4
    assert "geometric mean 0.90x over 2 layers" in w8 and "2/2" in w8 and "missed" not in w8


def test_conv_arguments():
    args = bench_conv.parse_args([])
    assert args.batches == [1, 32] and args.splits is None and args.block_size == 64 and args.out is None
    assert bench_conv.parse_args(["--splits"]).splits == list(bench_conv.SPLITS)
    args = bench_conv.parse_args(["--splits", "2", "4", "--batches", "8", "8", "1"])
    assert args.splits == [2, 4] and args.batches == [8, 1]
    for bad in (["--batches", "0"], ["--block-size", "0"], ["--splits", "0"]):
        with pytest.raises(SystemExit):
            bench_conv.parse_args(bad)


def test_padding_helpers():
    assert math.isclose(bench_pad.per_element_ratio(10.0, 1000, 10.0, 1024), 1.024)
    assert math.isclose(bench_pad.per_element_ratio(12.0, 1024, 10.0, 1024), 1.2)
    assert bench_pad.fmt_ratio(1.3) == "1.30x" and bench_pad.fmt_ratio(1.31) == "1.31x!"
    assert bench_pad.fmt_ratio(float("nan")) == "-" and bench_pad.fmt_us(float("nan")) == "-"
    l2 = 50 * 2 ** 20
    assert bench_pad.copies_for(16 * 2 ** 20, l2) == 7
    assert bench_pad.copies_for(2 ** 20, l2) == bench_pad.MAX_COPIES
    assert bench_pad.copies_for(10 ** 9, l2) == 1


@pytest.mark.parametrize("N, K, cc, element_D, expected", [
    (1000, 4096, 90, "f16", "Sm90 align 8"), (1000, 4096, 90, "s32", "Sm90 align 4"),
    (1000, 4096, 90, "s8", "Sm80 align 1"), (257, 4096, 90, "f16", "Sm80 align 1"), (257, 4096, 80, "s32", "Sm80 align 1"),
    (257, 4096, 75, "s32", "Sm75 padded to 264x4096"), (1000, 4097, 75, "f16", "Sm75 align 8, K padded to 4224"),
    (1024, 4097, 90, "f16", "Sm90 align 8, K padded to 4224"), (1000, 4097, 90, "s8", "Sm80 align 1, K padded to 4224"),
    (4096, 4096, 90, "s8", "Sm90 align 16")])
def test_kernel_ran(N, K, cc, element_D, expected):
    assert bench_pad.kernel_ran(N, K, cc, element_D) == expected


def test_every_case_pairs_an_unaligned_shape_with_an_aligned_one():
    for _, (N, K), (N_ref, K_ref) in bench_pad.CASES:
        assert K_ref % 16 == 0 and N_ref % 16 == 0
        assert bench_pad.kernel_ran(N, K, 90, "s8") != bench_pad.kernel_ran(N_ref, K_ref, 90, "s8") == "Sm90 align 16"


def test_padding_arguments():
    args = bench_pad.parse_args([])
    assert args.m == [1, 64, 1024] and args.ops == ["dequant_f16", "none_s32", "requant_s8"] and args.out is None
    assert bench_pad.parse_args(["--m", "8", "8", "--ops", "none_s32"]).m == [8]
    for bad in (["--m", "0"], ["--ops", "bogus"]):
        with pytest.raises(SystemExit):
            bench_pad.parse_args(bad)


@pytest.mark.parametrize("script", ["bench_conv.py", "bench_int8_padding.py", "tune_weight_only.py"])
def test_help_needs_no_gpu(script):
    import subprocess

    proc = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


# --- profile_decode.py --------------------------------------------------------------------------

class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end


class _Kernel:
    """The fields of a torch.profiler FunctionEvent that profile_decode reads."""

    def __init__(self, name, start, end):
        self.name, self.time_range, self.device_time_total = name, _Range(start, end), end - start
        self.device_type = type("DeviceType", (), {"name": "CUDA"})()


def test_profile_decode_classifies_kernels():
    pd = _load("profile_decode")
    assert pd.kernel_class("gemv_mma_mt1") == "ours: weight-only"
    assert pd.kernel_class("gemm_small_m_mt8") == "ours: weight-only"
    assert pd.kernel_class("splitk_reduce") == "ours: split-K reduction"
    assert pd.kernel_class("triton_poi_fused_add_mul_0") == "inductor (triton)"
    assert pd.kernel_class("void pytorch_flash::flash_fwd_splitkv_kernel<...>") == "attention"
    assert pd.kernel_class("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT") == "cuBLAS"
    assert pd.kernel_class("void at::native::elementwise_kernel<...>") == "other torch"


def test_profile_decode_splits_replays_and_sums_gaps():
    pd = _load("profile_decode")
    # two replays of the same three kernels: 10 us busy each, gaps 1 + 2 us, wall 13 us
    events = []
    for t0 in (0.0, 100.0):
        events += [_Kernel("gemv_mma_mt1", t0, t0 + 5), _Kernel("splitk_reduce", t0 + 6, t0 + 8),
                   _Kernel("triton_poi_fused_0", t0 + 10, t0 + 13)]
    groups = pd.step_events(events, 2)
    assert [len(g) for g in groups] == [3, 3]
    stats, rows = pd.summarize(groups)
    assert stats == {"wall": 13.0, "busy": 10.0, "gaps": 3.0, "kernels": 3}
    assert rows[0] == ("ours: weight-only", "gemv_mma_mt1", 1.0, 5.0)
    assert {r[1] for r in rows} == {"gemv_mma_mt1", "splitk_reduce", "triton_poi_fused_0"}


def test_profile_decode_times_each_linear_in_call_order():
    """One layer's five GEMVs labelled qkv, o, gate, up, down in call order; 'added' counts only the time past the
    kernels before (up launches inside gate through PDL), 'span' the whole kernel."""
    pd = _load("profile_decode")
    kernels = [_Kernel("triton_red_fused_0", 0, 2), _Kernel("gemv_mma_mt1", 1, 8),      # qkv: 6 past the norm
               _Kernel("flash_attn", 9, 12), _Kernel("gemv_mma_mt1", 12, 16),           # o: 4
               _Kernel("triton_red_fused_1", 17, 19), _Kernel("gemv_mma_mt1", 19, 29),  # gate: 10
               _Kernel("gemv_mma_mt1", 27, 38),                                         # up: 9 past gate
               _Kernel("triton_poi_fused_2", 39, 40), _Kernel("gemv_mma_mt1", 40, 50)]  # down: 10
    times = pd.linear_times([kernels, kernels], layers=1)
    assert times == {"qkv": (6, 7), "o": (4, 4), "gate": (10, 10), "up": (9, 11), "down": (10, 10)}
    assert pd.linear_times([kernels[:-1]], layers=1) is None  # a step without one GEMV per linear


def test_profile_decode_linear_report_budget():
    """The 2.5x budget: fp16 wall / 2.5 minus what the quantized step spends outside its GEMVs."""
    pd = _load("profile_decode")
    per_linear = {name: (5.0, 6.0) for name in pd.LINEARS}
    alone = {shape: (4.0, 6.0, 3.0) for shape in pd.SHAPES.values()}
    args = type("Args", (), {"layers": 2, "idle_us": 5.0, "standalone": {"W4A16": alone}})()
    results = {"fp16": ({"wall": 200.0}, [], None), "W4A16": ({"wall": 74.0}, [], per_linear)}
    text = "\n".join(pd.linear_report(args, results))
    assert "| step (x 2 layers) | | 50 | 60 | 40 | 60 | 30 |" in text
    # 200 / 2.5 = 80 us; the rest of the quantized step 74 - 50 = 24 us; 56 us for 10 GEMVs vs 30 us of reads
    assert "needs 80 us: 56 us for the 10 GEMVs, against 30 us for their bare read kernels back to back (1.87x)" \
        in text


def test_bench_commit_override(monkeypatch):
    """A results header names the commit given in CUTLASS_OPS_BENCH_COMMIT (a remote copy's .git may be stale)."""
    timing = _load("_timing")
    monkeypatch.setenv("CUTLASS_OPS_BENCH_COMMIT", "abc1234")
    assert timing.git_commit() == "abc1234"
    monkeypatch.delenv("CUTLASS_OPS_BENCH_COMMIT")
    assert timing.git_commit() != "abc1234"


def test_llama_fused_mlp_is_the_separate_one_with_its_weights_stacked():
    """bench_llama --mlp fused: one gate_up linear (gate rows, then up rows) computes what gate and up do."""
    bench_llama = _load("bench_llama")
    dims = dict(layers=1, d=64, mlp=128, heads=4, kv_heads=2, batch=1, max_len=32, dtype=torch.float32)
    torch.manual_seed(0)
    separate = bench_llama.Decoder(**dims).eval()
    fused = bench_llama.Decoder(**dims, fused_mlp=True).eval()
    one, two = fused.layers[0], separate.layers[0]
    assert not hasattr(one, "gate") and one.gate_up.weight.shape == (256, 64)
    with torch.no_grad():
        one.gate_up.weight.copy_(torch.cat([two.gate.weight, two.up.weight]))
        for name in ("n1", "n2", "attn", "down"):
            getattr(one, name).load_state_dict(getattr(two, name).state_dict())
        x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(fused(x, torch.arange(4)), separate(x, torch.arange(4)), rtol=1e-5, atol=1e-6)
