"""custom_kernels.libcuda against the real driver, answer for answer with cuda.bindings.driver (the binding it
replaced on the runtime path): handles, device attributes, occupancy, TMA map bytes, error texts, and a
first call in a fresh process that imports no cuda.bindings."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cuda.bindings import driver

from custom_kernels import libcuda, nvrtc
from custom_kernels.device import CudaDriverError, capability, check, context_of, target_arch
from custom_kernels.launch import Module

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

SRC = r"""
extern "C" __global__ void fill(int* out, int value) { out[blockIdx.x * blockDim.x + threadIdx.x] = value; }
"""


def _cp(result):
    """cuda.bindings' (err, *values) with the error checked."""
    err, *values = result
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return values[0] if len(values) == 1 else tuple(values)


def test_device_attributes_and_contexts_match_cuda_bindings():
    torch.zeros(1, device="cuda")  # torch's primary context current on this thread
    dev = check(libcuda.cuDeviceGet(0), "cuDeviceGet")
    assert dev == int(_cp(driver.cuDeviceGet(0)))
    for name in ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                 "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
                 "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK"):
        ours = check(libcuda.cuDeviceGetAttribute(getattr(libcuda, name), dev), name)
        assert ours == _cp(driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute, name), dev)), name
    current = check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent")
    assert current != 0 and current == int(_cp(driver.cuCtxGetCurrent()))
    assert check(libcuda.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain") == current
    with context_of(0):
        assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == current
    assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == current  # popped back


def test_functions_and_occupancy_match_cuda_bindings():
    cubin = nvrtc.compile_source(SRC, target_arch(), name="fill.cu")
    kernel = Module(cubin.data, "fill").kernel("fill")
    fn = kernel.function(0)
    for threads, smem in ((128, 0), (1024, 0), (256, 40 << 10)):
        theirs = _cp(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(fn), threads, smem))
        assert kernel.max_active_blocks(threads, smem, 0) == theirs
    optin = check(libcuda.cuDeviceGetAttribute(libcuda.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0), "")
    kernel.set_max_dynamic_smem(optin)
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert _cp(driver.cuFuncGetAttribute(attr, driver.CUfunction(fn))) == optin
    with pytest.raises(CudaDriverError,
                       match=r"^cuFuncSetAttribute\(fill, smem=\d+\) failed: CUDA_ERROR_INVALID_VALUE"):
        kernel.set_max_dynamic_smem(optin + 1)
    with pytest.raises(CudaDriverError, match=r"^cuModuleGetFunction\(absent\) failed: CUDA_ERROR_NOT_FOUND"):
        Module(cubin.data, "fill").kernel("absent").function(0)


@pytest.mark.skipif(not torch.cuda.is_available() or capability() < 90, reason="thread-block clusters need sm_90")
def test_cluster_occupancy_matches_cuda_bindings():
    cubin = nvrtc.compile_source(SRC, target_arch(), name="fill.cu")
    kernel = Module(cubin.data, "fill").kernel("fill")
    torch.zeros(1, device="cuda")  # torch's primary context current on this thread
    for threads, smem, cluster in ((128, 0, (1, 2, 1)), (256, 40 << 10, (1, 4, 1)), (1024, 0, (8, 1, 1))):
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = cluster
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = smem
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        config.attrs = [attr]
        config.numAttrs = 1
        theirs = _cp(driver.cuOccupancyMaxActiveClusters(driver.CUfunction(kernel.function(0)), config))
        ours = kernel.max_active_clusters(threads, smem, cluster, 0)
        assert ours == theirs and 0 < ours


def test_error_texts_are_the_drivers():
    error = driver.CUresult.CUDA_ERROR_INVALID_VALUE
    name = _cp(driver.cuGetErrorName(error)).decode()
    desc = _cp(driver.cuGetErrorString(error)).decode()
    with pytest.raises(CudaDriverError) as info:
        check((int(error),), "cuSomething")
    assert str(info.value) == f"cuSomething failed: {name}: {desc}"
    with pytest.raises(CudaDriverError, match=r"^cuSomething failed: CUresult 987654: unknown to this driver$"):
        check((987654,), "cuSomething")


def test_tensor_map_bytes_match_cuda_bindings():
    if capability() < 90:
        pytest.skip("TMA needs sm_90")
    from cutlass_ops.w8a8.tma import tensor_map_2d

    rows, cols = 300, 4096
    a = torch.zeros(rows, cols, dtype=torch.int8, device="cuda")
    ours = bytes(tensor_map_2d(a.data_ptr(), rows, cols, 64, 128, device=0))
    theirs = _cp(driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a.data_ptr(),
        [driver.cuuint64_t(cols), driver.cuuint64_t(rows)], [driver.cuuint64_t(cols)],
        [driver.cuuint32_t(128), driver.cuuint32_t(64)], [driver.cuuint32_t(1), driver.cuuint32_t(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    assert ours == ctypes.string_at(theirs.getPtr(), 128)
    with pytest.raises(CudaDriverError, match=r"^cuTensorMapEncodeTiled\(rows=300, cols=4096, box=300x128\) failed"):
        tensor_map_2d(a.data_ptr(), rows, cols, 300, 128, device=0)  # a box dimension over 256


FIRST_CALL = r"""
import json, sys, torch
torch.zeros(1, device="cuda")
before = {m for m in sys.modules if m.startswith("cuda.bindings")}
import cutlass_ops as co
g = torch.Generator().manual_seed(0)
A = torch.randint(-8, 8, (32, 512), dtype=torch.int8, generator=g).cuda()
B = torch.randint(-8, 8, (256, 512), dtype=torch.int8, generator=g).cuda()
qw = co.quantize_weight(torch.randn(256, 512, generator=g), bits=4, block_size=128).to("cuda")
x = torch.randn(1, 512, generator=g).half().cuda()
co.int8_gemm(A, B, "none"); co.linear(x, qw); torch.cuda.synchronize()
print(json.dumps({"torch_had": sorted(before),
                  "added": sorted(m for m in sys.modules if m.startswith("cuda.bindings") and m not in before)}))
"""


def test_a_first_call_with_cached_kernels_imports_no_cuda_bindings():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    runs = [subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True, timeout=600)
            for _ in range(2)]  # the first may compile; the second finds every kernel cached
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(runs[1].stdout.strip().splitlines()[-1])
    assert result["added"] == [], f"a cached first call imported {result['added']} (torch had {result['torch_had']})"
