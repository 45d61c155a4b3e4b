"""CPU tests for the weight-only kernels: every source builds with NVRTC (sm_75/80/90) and plain nvcc,
exports its entry points, and the host-side dispatch/packing in cutlass_ops.weight_only is right.
No GPU needed."""
from __future__ import annotations

import re
import subprocess

import pytest
import torch

from custom_kernels import compile_file
from custom_kernels.cuda_paths import cuda_include_dirs, nvcc_path
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops.formats import quantize_weight
from cutlass_ops import weight_only as wo

GEMV_MMA = [f"gemv_mma_mt{t}" for t in (1, 2, 4, 8)]
GEMV_SIMT = [f"gemv_simt_m{m}" for m in range(1, 9)]
GEMM_MMA = [c.kernel_name() for c in wo.GEMM_CONFIGS]
CONVERTERS = [f"test_{n}" for n in ("int4s_to_half2x4", "uint4s_to_half2x4", "int4s_to_bf162x4",
                                    "uint4s_to_bf162x4", "int8s_to_half2x2", "uint8s_to_half2x2",
                                    "int8s_to_bf162x2", "uint8s_to_bf162x2")]


ENTRIES = {
    "gemv_mma.cu": GEMV_MMA,
    "gemv_simt.cu": GEMV_SIMT,
    "splitk_reduce.cu": ["splitk_reduce"],
    "gather_k.cu": ["gather_k"],
    "gemm_mma.cu": GEMM_MMA,
    "gemm_simt.cu": ["gemm_simt"],
    "gemv_dp4a.cu": ["quantize_q8_1"] + [f"gemv_dp4a_m{m}" for m in range(1, 9)],
    "converters_test.cu": CONVERTERS,
}


def _entries(filename: str) -> list[str]:
    """Entry points a build of ``filename`` must export."""
    return ENTRIES[filename]


# (file, defines): every element type x bit width each source is built with at run time (the
# tensor-core kernels only for half / bfloat16: WO_ELEMENT 0 / 1).
BUILDS = [("converters_test.cu", {})]
BUILDS += [(f, {"WO_ELEMENT": e, "WO_BITS": b}) for f in ("gemv_mma.cu", "gemm_mma.cu")
           for e in (0, 1) for b in (4, 8)]
BUILDS += [("gemv_mma.cu", {"WO_ELEMENT": e, "WO_BITS": b, "WO_PDL_WAIT": 1}) for e in (0, 1) for b in (4, 8)]  # act-order
BUILDS += [("gather_k.cu", {})]
BUILDS += [(f, {"WO_ELEMENT": e, "WO_BITS": b}) for f in ("gemv_simt.cu", "gemm_simt.cu")
           for e in (0, 1, 2) for b in (4, 8)]
BUILDS += [(f, {"WO_ELEMENT": e}) for f in ("splitk_reduce.cu", "gemv_dp4a.cu") for e in (0, 1, 2)]
DEFAULT_BUILDS = [b for b in BUILDS if b[1] in ({}, {"WO_ELEMENT": 0, "WO_BITS": 4}, {"WO_ELEMENT": 0})]


def _build_id(build) -> str:
    name, defines = build
    return name.removesuffix(".cu") + "".join(f"-{k[3:].lower()}{v}" for k, v in defines.items())


def _assert_entries(data: bytes, build) -> None:
    name, defines = build
    missing = [e for e in _entries(name) if e.encode() + b"\0" not in data]
    assert not missing, f"{name} {defines}: cubin lacks entry points {missing}"


@pytest.mark.parametrize("arch", [75, 80, 90])
@pytest.mark.parametrize("build", DEFAULT_BUILDS, ids=_build_id)
def test_nvrtc_builds_each_arch(build, arch):
    name, defines = build
    cubin = compile_file(name, arch, defines=defines)
    assert cubin.data[:4] == b"\x7fELF"
    _assert_entries(cubin.data, build)


@pytest.mark.parametrize("build", [b for b in BUILDS if b not in DEFAULT_BUILDS], ids=_build_id)
def test_nvrtc_builds_every_element_and_width(build):
    name, defines = build
    cubin = compile_file(name, "90a", defines=defines)
    _assert_entries(cubin.data, build)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_plain_nvcc_builds(name, tmp_path):
    out = tmp_path / (name + ".cubin")
    cmd = [nvcc_path(), "-std=c++17", "-arch=sm_80", "-cubin", "-o", str(out), f"-I{KERNEL_DIR}",
           *[f"-I{d}" for d in cuda_include_dirs()], str(KERNEL_DIR / name)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    _assert_entries(out.read_bytes(), (name, {}))


# --------------------------------------------------------------------------------------------
# host-side logic (CPU tensors)
# --------------------------------------------------------------------------------------------

def _qw(N=64, K=256, bits=4, block_size=64, symmetric=False):
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    return quantize_weight(w, bits=bits, block_size=block_size, symmetric=symmetric)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scale_offset_words_pack_both_halves(dtype):
    qw = _qw()
    words = wo.pack_scale_offset(qw, dtype)
    assert words.dtype == torch.int32 and words.shape == (qw.N, qw.num_groups)
    halves = words.view(torch.int16).reshape(qw.N, qw.num_groups, 2).view(dtype)
    assert torch.equal(halves[..., 0], qw.scale.to(dtype))
    assert torch.equal(halves[..., 1], qw.offset.to(dtype))


def test_scale_offset_words_reject_float16_overflow():
    qw = _qw()
    qw.scale[0, 0] = 1e6
    with pytest.raises(ValueError, match="overflow"):
        wo.pack_scale_offset(qw, torch.float16)
    assert wo.pack_scale_offset(qw, torch.bfloat16).shape == (qw.N, qw.num_groups)


@pytest.mark.parametrize("M, dtype, cc, bits, block_size, expected", [
    (1, torch.float16, 90, 4, 64, "gemv_mma"),
    (33, torch.bfloat16, 80, 8, 128, "gemm_small_m"),
    (64, torch.float16, 80, 4, 64, "gemm_small_m"),
    (65, torch.float16, 80, 4, 64, "gemm_mma"),
    (64, torch.float16, 90, 4, 64, "gemm_wgmma"),
    (65, torch.float16, 90, 4, 64, "gemm_wgmma"),
    (512, torch.float16, 90, 8, None, "dequant_cublas"),
    (1, torch.float32, 90, 4, 64, "gemv_simt"),
    (9, torch.float32, 90, 4, 64, "gemm_simt"),
    (1, torch.float16, 75, 4, 64, "gemv_simt"),
    (1, torch.float16, 90, 4, 96, "gemv_simt"),   # 96 / 32 is no power of two: not gemv_mma
    (1, torch.float16, 90, 8, 8, "gemm_simt"),    # block 8: nothing vectorized applies
])
def test_default_strategy(M, dtype, cc, bits, block_size, expected):
    K = 384 if block_size == 96 else 256
    qw = _qw(K=K, bits=bits, block_size=block_size)
    assert wo.choose_strategy(M, dtype, qw, cc) == expected


def test_strategy_problem_names_the_constraint():
    qw = _qw(bits=4, block_size=64)
    assert "float32" in wo.strategy_problem("gemm_mma", 1, torch.float32, qw, 90)
    assert "sm_80" in wo.strategy_problem("gemv_mma", 1, torch.float16, qw, 75)
    assert "M <= 8" in wo.strategy_problem("gemv_simt", 9, torch.float16, qw, 90)
    assert "int8" in wo.strategy_problem("gemv_dp4a", 1, torch.float16, qw, 90)
    assert wo.strategy_problem("gemm_simt", 4096, torch.float32, qw, 75) is None
    with pytest.raises(ValueError, match="strategy"):
        wo.strategy_problem("cublas", 1, torch.float16, qw, 90)


def test_gemm_shared_memory_fits_sm80():
    for config in wo.GEMM_CONFIGS:
        for bits in (4, 8):
            assert wo.gemm_mma_smem(config.m_tile, bits) <= 163 * 1024  # A100 opt-in maximum per block


def test_gemm_config_names_built_kernels():
    assert [c.kernel_name() for c in wo.GEMM_CONFIGS] == ["gemm_mma_mt4", "gemm_mma_mt8"]
    with pytest.raises(ValueError, match="m_tile"):
        wo.GemmConfig(96)


def test_block_shift():
    assert wo.block_shift(_qw(K=256, block_size=64)) == 6
    assert wo.block_shift(_qw(K=256, block_size=None)) == 30
    assert wo.block_shift(_qw(K=384, block_size=96)) == -1


def test_linear_validates_before_any_launch():
    """The public API checks dtypes, shapes and devices once; linear_weight_only then checks only its
    own arguments (strategy, out), still before any launch."""
    import cutlass_ops

    qw = _qw()
    with pytest.raises(TypeError, match="x"):
        cutlass_ops.linear(torch.zeros(2, qw.K, dtype=torch.int32), qw)
    with pytest.raises(ValueError, match="K=256"):
        cutlass_ops.linear(torch.zeros(2, 100), qw)
    with pytest.raises((RuntimeError, ValueError), match="GPU|CUDA"):
        cutlass_ops.linear(torch.zeros(2, qw.K), qw)
    with pytest.raises(ValueError, match="strategy"):
        wo.linear_weight_only(torch.zeros(2, qw.K), qw, strategy="cublas")
    with pytest.raises(ValueError, match="out"):
        wo.linear_weight_only(torch.zeros(2, qw.K), qw, out=torch.empty(2, qw.N + 1))


def test_every_strategy_has_a_plan_class_of_the_same_shape():
    assert set(wo.PLANS) == set(wo.STRATEGIES)
    for strategy, cls in wo.PLANS.items():
        assert cls.strategy == strategy
        assert callable(getattr(cls, "__call__"))
        assert isinstance(cls.bias_tensor, bool) and isinstance(cls.per_m, bool)
    assert wo.PLANS["dequant_cublas"].bias_tensor and not wo.PLANS["dequant_cublas"].per_m


def _parameters(filename: str, name: str) -> list[str]:
    """Parameter names of the last ``name(...)`` (the extern "C" definition, or its entry macro) in a source."""
    text = (KERNEL_DIR / filename).read_text()
    sig = text[text.rindex(name + "(") + len(name) + 1:]
    sig = sig[:sig.index(")")].replace("\\", " ")
    return [p.split()[-1].lstrip("*") for p in sig.split(",")]


def test_kernel_args_name_the_kernel_parameters():
    """Each KernelArgs class lists its kernel's C parameters, by name and in order."""
    from cutlass_ops.cutlass import padding
    from cutlass_ops.weight_only import (
        dequant_cublas, gemm_mma, gemm_simt, gemm_small_m, gemv_dp4a, gemv_mma, gemv_simt, gemv_stream, splitk,
    )

    cases = [(gemv_mma.GemvMmaArgs, "gemv_mma.cu", "gemv_mma_mt##MT"),
             (gemv_stream.GemvStreamArgs, "gemv_stream.cu", "gemv_stream_m##M_"),
             (gemv_simt.GemvSimtArgs, "gemv_simt.cu", "gemv_simt_m##M_"),
             (splitk.SplitKReduceArgs, "splitk_reduce.cu", "splitk_reduce"),
             (gemv_mma.GatherArgs, "gather_k.cu", "gather_k"),
             (gemv_dp4a.QuantizeQ81Args, "gemv_dp4a.cu", "quantize_q8_1"),
             (gemv_dp4a.GemvDp4aArgs, "gemv_dp4a.cu", "gemv_dp4a_m##M_"),
             (gemm_mma.GemmMmaArgs, "gemm_mma.cu", "gemm_mma_mt##MT8"),
             (gemm_simt.GemmSimtArgs, "gemm_simt.cu", "gemm_simt"),
             (gemm_small_m.GemmSmallMArgs, "gemm_small_m.cu", "gemm_small_m_mt##MT"),
             (gemm_small_m.GemmSmallMArgs, "gemm_wgmma.cu", "gemm_wgmma_mt##MT"),  # build_staged packs both
             (dequant_cublas.DequantArgs, "dequant_weight.cu", "dequant_weight"),
             (padding.PadRowsArgs, "pad_rows.cu", "pad_rows_i8"),  # the int8 GEMMs' A padding
             (padding.UnpadRowsArgs, "unpad_rows.cu", "unpad_rows")]  # and their D on a padded N
    for args, filename, anchor in cases:
        assert [f[0] for f in args._fields_] == _parameters(filename, anchor), (args.__name__, filename)


def test_split_k_reduce_grid_mirrors_the_kernel_vector_width():
    """splitk.reduce_launch sizes its grid for the kernel's vector path (kVec outputs a thread, N % kVec == 0)."""
    from cutlass_ops.weight_only import splitk

    text = (KERNEL_DIR / "splitk_reduce.cu").read_text()
    assert re.search(rf"constexpr int kVec = {splitk.REDUCE_VECTOR};", text)
