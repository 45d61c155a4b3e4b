"""custom_kernels.libcuda, the ctypes binding of the driver calls the runtime makes (no GPU needed).

- A fresh process that imports cutlass_ops and the modules of a first call, and finds its kernel cached, never
  imports cuda.bindings (the cold-start cost this binding removes).
- Without libcuda, importing works and a driver call raises CudaDriverError naming libcuda.
- Against a stub library built from tests/host_emu/libcuda_stub.c with cuda.h (not a driver: it answers with
  values made from its arguments): every wrapper's symbol, argument order and width, out-parameters, the error
  decoding of ``check``, the context push / pop / retry logic, the launcher's CUlaunchConfig and the TMA map.
  The real driver is compared with cuda.bindings in tests/gpu/test_libcuda_gpu.py.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from custom_kernels import device, libcuda
from custom_kernels.device import CudaDriverError, check
from custom_kernels.launch import I32, KernelArgs, LaunchConfig, LaunchShape, Module, Ptr

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------
# the first call's imports
# ------------------------------------------------------------------------------------------------

FIRST_CALL_MODULES = (
    "cutlass_ops", "cutlass_ops.api", "cutlass_ops.torch_ops", "cutlass_ops.nn", "cutlass_ops.finite_check",
    "cutlass_ops.plan_cache",
    "custom_kernels.libcuda", "custom_kernels.device", "custom_kernels.launch", "custom_kernels.cache",
    "custom_kernels.nvrtc", "custom_kernels.host_ext",
    "cutlass_ops.cutlass", "cutlass_ops.cutlass.build", "cutlass_ops.cutlass.kernel", "cutlass_ops.cutlass.plan",
    "cutlass_ops.cutlass.fast", "cutlass_ops.cutlass.arguments",
    "cutlass_ops.weight_only", "cutlass_ops.conv",
    "cutlass_ops.w8a8", "cutlass_ops.w8a8.tma", "cutlass_ops.w8a8.quant_token", "cutlass_ops.w8a8.channel_fast",
    "cutlass_ops.w8a8.fused", "cutlass_ops.w8a8.orchestrator", "cutlass_ops.w8a8.block_scaled_plan",
)
CACHED_KERNEL = ("splitk_reduce.cu", "splitk_reduce", {"WO_ELEMENT": 0})

PROBE = r"""
import importlib, json, sys

class Refuse:
    '''Refuses cuda.bindings and its submodules and records the file that asked: torch's optional import of
    it falls back; one of ours fails and is named.'''
    def __init__(self):
        self.asked = []

    def find_spec(self, name, path=None, target=None):
        if name == "cuda.bindings" or name.startswith("cuda.bindings."):
            frame = sys._getframe(1)
            while frame is not None and (frame.f_code.co_filename.startswith("<frozen")
                                         or "importlib" in frame.f_code.co_filename):
                frame = frame.f_back
            self.asked.append([name, frame.f_code.co_filename if frame is not None else "?"])
            raise ImportError(f"{name}: refused by tests/test_libcuda.py")
        return None

refuse = Refuse()
sys.meta_path.insert(0, refuse)
modules, (filename, kernel, defines) = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
from custom_kernels import launch
k = launch.load_kernel(filename, kernel, defines, arch="80")  # cached: NVRTC's version from the stamp
from custom_kernels import libcuda
import custom_kernels, cutlass_ops
ours = tuple(str(__import__("pathlib").Path(p.__path__[0])) for p in (custom_kernels, cutlass_ops))
print(json.dumps({
    "ours": [a for a in refuse.asked if a[1].startswith(ours)],
    "loaded": sorted(m for m in sys.modules if m == "cuda.bindings" or m.startswith("cuda.bindings.")),
    "kernel": k.name, "libcuda_opened": libcuda._library is not None,
}))
"""


def _run(code: str, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT))


def test_a_first_call_with_cached_kernels_imports_no_cuda_bindings(tmp_path):
    filename, kernel, defines = CACHED_KERNEL
    fill = _run("import sys, json; from custom_kernels.nvrtc import compile_file; "
                f"compile_file({filename!r}, '80', defines={defines!r})", tmp_path)  # NVRTC: cubin and stamp
    assert fill.returncode == 0, fill.stderr[-3000:]
    probe = _run(PROBE, tmp_path, json.dumps([FIRST_CALL_MODULES, CACHED_KERNEL]))
    assert probe.returncode == 0, probe.stderr[-3000:]
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["ours"] == [], f"modules of ours asked for cuda.bindings: {result['ours']}"
    assert result["loaded"] == []
    assert result["kernel"] == kernel
    assert not result["libcuda_opened"], "libcuda opened before any driver call"


# ------------------------------------------------------------------------------------------------
# no libcuda
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def no_libcuda(monkeypatch, tmp_path):
    """custom_kernels.libcuda pointed at a library that does not exist (as on a machine without a driver)."""
    monkeypatch.setattr(libcuda, "LIBRARY", str(tmp_path / "absent" / "libcuda.so.1"))
    monkeypatch.setattr(libcuda, "_library", None)
    monkeypatch.setattr(libcuda, "_functions", {})


def test_a_driver_call_without_libcuda_names_it(no_libcuda):
    with pytest.raises(CudaDriverError, match=r"^cuInit: cannot load .*libcuda\.so\.1, the CUDA driver library"):
        check(libcuda.cuInit(0), "cuInit")
    from custom_kernels.launch import cu_launch_kernel_ex
    with pytest.raises(CudaDriverError, match=r"^cuLaunchKernelEx: cannot load .*libcuda\.so\.1"):
        cu_launch_kernel_ex()
    assert libcuda._library is None


def test_check_unpacks_the_outputs():
    assert check((libcuda.CUDA_SUCCESS,), "f") is None
    assert check((libcuda.CUDA_SUCCESS, 5), "f") == 5
    assert check((libcuda.CUDA_SUCCESS, 5, 0), "f") == (5, 0)


def test_constants_are_cuda_h_values():
    """Each enum value named as in cuda.h equals cuda-python's (generated from cuda.h) of the same name."""
    from cuda.bindings import driver

    enums = {"CUDA_": driver.CUresult, "CU_DEVICE_ATTRIBUTE_": driver.CUdevice_attribute,
             "CU_FUNC_ATTRIBUTE_": driver.CUfunction_attribute, "CU_LAUNCH_ATTRIBUTE_": driver.CUlaunchAttributeID,
             "CU_TENSOR_MAP_DATA_TYPE_": driver.CUtensorMapDataType,
             "CU_TENSOR_MAP_INTERLEAVE_": driver.CUtensorMapInterleave,
             "CU_TENSOR_MAP_SWIZZLE_": driver.CUtensorMapSwizzle,
             "CU_TENSOR_MAP_L2_PROMOTION_": driver.CUtensorMapL2promotion,
             "CU_TENSOR_MAP_FLOAT_OOB_FILL_": driver.CUtensorMapFloatOOBfill}
    names = [n for n in vars(libcuda) if n.startswith(("CUDA_", "CU_")) and n != "CU_TENSOR_MAP_BYTES"]
    assert len(names) >= 14
    for name in names:
        enum = next(e for prefix, e in enums.items() if name.startswith(prefix))
        assert getattr(libcuda, name) == int(getattr(enum, name)), name
    assert libcuda.CU_TENSOR_MAP_BYTES == 8 * driver.CU_TENSOR_MAP_NUM_QWORDS


# ------------------------------------------------------------------------------------------------
# against the stub library
# ------------------------------------------------------------------------------------------------

CONTEXT_BASE = 0x7F00_0000_0000
MODULE_BASE = 0x7E00_0000_0000
IMAGE = b"\x7fELF\x2a" + bytes(59)  # the stub's module handle shows the fifth byte


def test_errors_are_decoded_by_the_driver(stub):
    with pytest.raises(CudaDriverError, match=r"^cuFoo failed: CUDA_ERROR_INVALID_VALUE: described by the stub$"):
        check((libcuda.CUDA_ERROR_INVALID_VALUE,), "cuFoo")
    with pytest.raises(CudaDriverError, match=r"^cuFoo failed: CUresult 999: unknown to this driver$"):
        check((999,), "cuFoo")
    with pytest.raises(CudaDriverError, match=r"^cuDeviceGet failed: CUDA_ERROR_INVALID_DEVICE"):
        check(libcuda.cuDeviceGet(7), "cuDeviceGet")
    with pytest.raises(CudaDriverError, match=r"^cuInit failed: CUDA_ERROR_INVALID_VALUE"):
        check(libcuda.cuInit(1), "cuInit")


def test_device_queries_and_contexts(stub):
    assert device.smem_limits(1) == (81_101, 97_101, 111_101)  # 1000 * attribute + CUdevice (100 + ordinal)
    primary = CONTEXT_BASE + 0x1000 * 101
    with device.context_of(1):
        assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == primary
        with device.context_of(0):
            assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == CONTEXT_BASE + 0x1000 * 100
        assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == primary
    assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == 0  # popped back to none
    device.ensure_context(1)
    assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == primary
    with pytest.raises(CudaDriverError, match=r"^cuCtxPopCurrent failed: CUDA_ERROR_INVALID_CONTEXT"):
        check(libcuda.cuCtxPopCurrent(), "cuCtxPopCurrent")


def test_modules_and_functions(stub):
    kernel = Module(IMAGE, "m").kernel("kern")
    function = kernel.function(0)
    assert function == MODULE_BASE + 0x100 * 0x2A + len("kern")
    assert kernel.function(0) is function  # resolved once per device
    kernel.set_max_dynamic_smem(100_000)
    with pytest.raises(CudaDriverError, match=r"^cuFuncSetAttribute\(kern, smem=1000000\) failed: "
                                              r"CUDA_ERROR_INVALID_VALUE"):
        kernel.set_max_dynamic_smem(1_000_000)
    assert kernel.max_active_blocks(256, (3 << 32) + 5, 0) == 3008  # the size_t passed whole
    with pytest.raises(CudaDriverError, match=r"^cuModuleGetFunction\(missing\) failed: CUDA_ERROR_NOT_FOUND"):
        Module(IMAGE, "m").kernel("missing").function(0)
    with pytest.raises(CudaDriverError, match=r"^cuModuleLoadData\(junk\) failed: CUDA_ERROR_INVALID_IMAGE"):
        Module(b"junk", "junk").kernel("k").function(0)
    assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == 0  # loads pushed and popped the context


class _Args(KernelArgs):
    _fields_ = [("out", Ptr), ("n", I32)]


@pytest.mark.parametrize("cluster,pdl,attributes", [
    ((1, 1, 1), False, []),
    ((2, 1, 1), False, [libcuda.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 2]),
    ((1, 1, 1), True, [libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1]),
    ((1, 2, 1), True, [libcuda.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 1,
                       libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1]),
])
def test_a_launch_hands_the_driver_its_config_and_binds_a_context_once(stub, cluster, pdl, attributes):
    kernel = Module(IMAGE, "m").kernel("kern")
    shape = LaunchShape(kernel, LaunchConfig.of((3, 2), 128, 4096, cluster, pdl), device=0)
    seen = (ctypes.c_uint64 * 16)()
    args = _Args(out=ctypes.addressof(seen), n=-7)
    keep, params = args.kernel_params()
    stream = 0x7D00_1234_5678
    # no context current on this thread: the first attempt fails with CUDA_ERROR_INVALID_CONTEXT and the retry
    # runs after binding device 0's primary context
    shape._launch_here(stream, params)
    primary = CONTEXT_BASE + 0x1000 * 100
    padded = attributes + [0] * (4 - len(attributes))
    assert list(seen) == [kernel.function(0), 3, 2, 1, 128, 1, 1, 4096, stream, len(attributes) // 2, *padded,
                          (1 << 64) - 7, primary]
    assert check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") == primary


def test_a_failed_launch_names_the_kernel_and_its_shape(stub):
    shape = LaunchShape(Module(IMAGE, "m").kernel("kern"), LaunchConfig.of(0, 32), device=0)
    args = _Args(out=0, n=0)
    keep, params = args.kernel_params()
    with pytest.raises(CudaDriverError, match=r"^cuLaunchKernel\(kern, grid=\(0, 1, 1\), block=\(32, 1, 1\), "
                                              r"smem=0, cluster=\(1, 1, 1\), pdl=False\) failed: "
                                              r"CUDA_ERROR_INVALID_VALUE"):
        shape._launch_here(0, params)


def test_tensor_map_arguments(stub):
    from cutlass_ops.w8a8.tma import tensor_map_2d

    address = 0x7C00_0000_0010
    tensor_map = tensor_map_2d(address, rows=300, cols=4096, box_rows=64, box_cols=128, device=0)
    words = list((ctypes.c_uint64 * 16).from_buffer_copy(tensor_map))
    assert words == [libcuda.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, address, 4096, 300, 4096, 128, 64, 1, 1,
                     libcuda.CU_TENSOR_MAP_INTERLEAVE_NONE, libcuda.CU_TENSOR_MAP_SWIZZLE_128B,
                     libcuda.CU_TENSOR_MAP_L2_PROMOTION_L2_256B, libcuda.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, 0, 0x5757]
    assert tensor_map_2d(address, 300, 4096, 64, 128, device=0) is tensor_map  # cached
