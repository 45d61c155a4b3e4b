"""CPU tests of the NVRTC compiler and its content-addressed cubin cache (no GPU needed)."""
from __future__ import annotations

import os

import pytest

from custom_kernels import cache, nvrtc

SRC = r"""
#include "common.cuh"
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cuops::apply_activation(a * x[i] + y[i], cuops::kActRelu);
}
"""


def _is_cubin(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", [75, 80, 90, "90a"])
def test_compiles_to_cubin_for_each_arch(arch):
    cubin = nvrtc.compile_source(SRC, arch, name="axpy.cu")
    assert _is_cubin(cubin.data)
    assert cubin.path.is_file() and cubin.path.read_bytes() == cubin.data
    assert str(cubin.path).startswith(str(cache.cache_root()))


def test_cache_hit_and_key_sensitivity():
    first = nvrtc.compile_source(SRC, 80, name="axpy.cu")
    again = nvrtc.compile_source(SRC, 80, name="axpy.cu")
    assert again.from_cache and again.path == first.path
    other_arch = nvrtc.compile_source(SRC, 75, name="axpy.cu")
    other_opts = nvrtc.compile_source(SRC, 80, name="axpy.cu", defines={"UNUSED_FLAG": 1})
    other_src = nvrtc.compile_source(SRC + "\n// changed\n", 80, name="axpy.cu")
    assert len({first.path, other_arch.path, other_opts.path, other_src.path}) == 4


def test_cache_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "elsewhere"))
    cubin = nvrtc.compile_source(SRC, 80, name="axpy.cu")
    assert cubin.path.parent == (tmp_path / "elsewhere" / "nvrtc").resolve()
    assert not cubin.from_cache


def test_compile_error_carries_nvrtc_log():
    with pytest.raises(nvrtc.KernelCompileError) as info:
        nvrtc.compile_source('extern "C" __global__ void bad() { undefined_symbol_xyz(); }', 80, name="bad.cu")
    assert "undefined_symbol_xyz" in str(info.value) and "bad.cu" in str(info.value)


def test_bad_arch_is_rejected():
    with pytest.raises(ValueError, match="arch"):
        nvrtc.compile_source(SRC, 61)
    with pytest.raises(ValueError, match="arch"):
        nvrtc.compile_source(SRC, "sm_xx")


def test_compiling_writes_nothing_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nvrtc.compile_source(SRC, 90, name="axpy.cu", use_cache=False)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "a" / "blob.bin"
    cache.atomic_write(target, b"one")
    cache.atomic_write(target, b"two-two")
    assert target.read_bytes() == b"two-two"
    assert [p.name for p in target.parent.iterdir()] == ["blob.bin"]


def test_content_key_is_length_prefixed():
    assert cache.content_key("ab", "c") != cache.content_key("a", "bc")


@pytest.mark.parametrize("name", nvrtc.kernel_sources())
@pytest.mark.parametrize("arch", [75, 80, 90])
def test_every_shipped_kernel_compiles(name, arch):
    """Every .cu file in custom_kernels/kernels builds with NVRTC for sm_75, sm_80 and sm_90."""
    cubin = nvrtc.compile_file(name, arch)
    assert _is_cubin(cubin.data)


def test_kernel_args_point_each_parameter_at_its_field():
    """cuLaunchKernel copies parameter i from kernelParams[i], so a KernelArgs block needs no C
    layout: a tensor map (128 bytes, alignas(64) in C) after two ints is found by its address."""
    import ctypes

    from custom_kernels.launch import F32, I32, KernelArgs, Ptr, TensorMap

    class Args(KernelArgs):
        _fields_ = [("x", Ptr), ("m", I32), ("n", I32), ("tmap", TensorMap), ("a", F32)]

    blob = bytes(range(128))
    args = Args(x=0x1122334455667788, m=7, n=-3, a=1.5)
    args.tmap = TensorMap.from_buffer_copy(blob)
    keep, address = args.kernel_params()
    ptrs = (ctypes.c_void_p * 5).from_address(address)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x1122334455667788
    assert (ctypes.c_int32.from_address(ptrs[1]).value, ctypes.c_int32.from_address(ptrs[2]).value) == (7, -3)
    assert ctypes.string_at(ptrs[3], 128) == blob
    assert ctypes.c_float.from_address(ptrs[4]).value == 1.5
    args.m = 9  # a launch writes only the fields it names, in place: the addresses stay valid
    assert ctypes.c_int32.from_address(ptrs[1]).value == 9
    with pytest.raises(TypeError):
        args.tmap = b"short"