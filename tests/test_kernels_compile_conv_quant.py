"""The conv and scheme-2 helper kernels build with NVRTC (sm_75/80/90) and with plain nvcc (no GPU)."""
from __future__ import annotations

import subprocess

import pytest

from custom_kernels import nvrtc
from custom_kernels.cuda_paths import nvcc_path

SOURCES = ("conv_direct.cu", "conv_igemm.cu", "conv_dequant.cu", "quant_a.cu", "scheme2_epilogue.cu")

# extern "C" entry points each source must export (the names cutlass_ops.conv and cutlass_ops.w8a8 launch).
ENTRY_POINTS = {
    "conv_direct.cu": [f"conv_direct_{t}_w{b}_{l}" for t in ("f32", "f16", "bf16") for b in (4, 8)
                       for l in ("nchw", "nhwc")],
    "conv_dequant.cu": [f"conv_dequant{w}_{t}_w{b}_{l}" for w in ("", "8") for t in ("f32", "f16", "bf16")
                        for b in (4, 8) for l in ("nchw", "nhwc")]
    + [f"conv_bias_act_{t}_nhwc" for t in ("f32", "f16", "bf16")],
    "conv_igemm.cu": [f"conv_igemm_{t}_w{b}_{l}" for t in ("f16", "bf16") for b in (4, 8) for l in ("nchw", "nhwc")]
    + [f"conv_splitk_reduce_{t}_{l}" for t in ("f16", "bf16") for l in ("nchw", "nhwc")]
    + ["conv_nchw_to_nhwc_b16"],
    "quant_a.cu": ["quant_a_f32", "quant_a_f16", "quant_a_bf16", "quant_a_warp_f32", "quant_a_warp_f16",
                   "quant_a_warp_bf16", "precompute_sum_bq"],
    "scheme2_epilogue.cu": ["dequant_and_acc_f32", "dequant_and_acc_f16", "dequant_and_acc_bf16",
                            "bias_act_f32_f32", "bias_act_f16_f16", "bias_act_bf16_bf16", "bias_act_f32_f16",
                            "bias_act_f32_bf16"],
}


@pytest.mark.parametrize("arch", [75, 80, 90])
@pytest.mark.parametrize("name", SOURCES)
def test_nvrtc_builds_with_every_entry_point(name, arch):
    cubin = nvrtc.compile_file(name, arch)
    assert cubin.data[:4] == b"\x7fELF"
    for entry in ENTRY_POINTS[name]:
        # extern "C" keeps the names unmangled in the ELF string table.
        assert entry.encode() + b"\x00" in cubin.data, f"{entry} missing from {name} (sm_{arch})"


@pytest.mark.parametrize("t_code, bits", [(1, 4), (2, 8), (3, 4)])
def test_conv_module_selection_builds_only_its_kernels(t_code, bits):
    """cutlass_ops.conv builds one module per (strategy, dtype, bits) through CUOPS_CONV_T / CUOPS_CONV_BITS."""
    defines = {"CUOPS_CONV_T": t_code, "CUOPS_CONV_BITS": bits}
    direct = nvrtc.compile_file("conv_direct.cu", 90, defines=defines).data
    igemm = nvrtc.compile_file("conv_igemm.cu", 90, defines=defines).data
    tag = {1: "f32", 2: "f16", 3: "bf16"}[t_code]
    other = 8 if bits == 4 else 4
    assert f"conv_direct_{tag}_w{bits}_nhwc".encode() in direct
    assert f"conv_direct_{tag}_w{other}_nhwc".encode() not in direct
    assert b"conv_igemm_" not in direct
    assert (f"conv_igemm_{tag}_w{bits}_nhwc".encode() in igemm) == (t_code != 1)
    assert f"conv_igemm_{tag}_w{other}_nhwc".encode() not in igemm
    assert (b"conv_nchw_to_nhwc_b16" in igemm) == (t_code != 1)
    assert b"conv_direct_" not in igemm


@pytest.mark.parametrize("name", SOURCES)
def test_plain_nvcc_builds(name, tmp_path):
    """The same files compile as ordinary CUDA C++ (host pass included) with nvcc."""
    try:
        nvcc = nvcc_path()
    except RuntimeError:
        pytest.skip("nvcc not installed")
    src = nvrtc.kernel_path(name)
    cmd = [nvcc, "-std=c++17", "-arch=sm_80", "-c", str(src), "-I", str(nvrtc.KERNEL_DIR),
           "-o", str(tmp_path / "k.o")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, f"nvcc failed for {name}:\n{res.stderr}"
