"""The CUDA driver calls of the runtime path, through ctypes on libcuda.

Why not ``cuda.bindings.driver``: importing it (a Cython module with ~130 enum classes) cost 15-20 ms of a
fresh process's first call on an H200 host, more than any other part of it, while the runtime asks the
driver for a handful of functions. cuda-python stays for NVRTC and the CUTLASS emitter, which run only when a
kernel is not cached.

Conventions, those of ``cuda.bindings.driver`` where it has one:

- each wrapper is named after the cuda.h function it calls and returns ``(CUresult, *outputs)``, ready for
  :func:`custom_kernels.device.check`; a CUresult is a plain int (``CUDA_SUCCESS`` is 0);
- handles (CUcontext, CUmodule, CUfunction) are ints, the pointer's value (0 for NULL); ``CUdevice`` is the
  driver's int;
- enum values are module constants named as in cuda.h, with the values cuda.h gives them.

libcuda.so.1 is opened on the first driver call, not at import: a machine without an NVIDIA driver imports
this module (and everything above it) and gets :class:`CudaDriverError` naming libcuda only when a driver
function is called. Each function is looked up and declared (argtypes, restype) once.
"""
from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p

__all__ = [
    "CudaDriverError", "LIBRARY", "function", "error_text",
    "cuGetErrorName", "cuGetErrorString", "cuInit", "cuDeviceGet", "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent",
    "cuModuleLoadData", "cuModuleGetFunction", "cuFuncSetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuOccupancyMaxActiveClusters", "cuTensorMapEncodeTiled",
]


class CudaDriverError(RuntimeError):
    """A CUDA driver call returned an error (or the driver library is missing); the message names the call."""


LIBRARY = "libcuda.so.1"  # the NVIDIA driver's CUDA library (its soname; what torch and cuda-python load)

# --- cuda.h values --------------------------------------------------------------------------------------
# CUresult
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
# CUdevice_attribute
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK = 111
# CUfunction_attribute
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
# CUlaunchAttributeID
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
# CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0
CU_TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap): CU_TENSOR_MAP_NUM_QWORDS (16) 64-bit words
_TENSOR_MAP_ALIGN = 64  # cuTensorMapEncodeTiled: "tensorMap address must be aligned to 64 bytes"

# name -> (exported symbol, argtypes). The symbol is what cuda.h's #defines make of the name (cuCtxPushCurrent
# is cuCtxPushCurrent_v2); cuLaunchKernelEx is the legacy-default-stream one, as cuda-python calls by default.
_SIGNATURES: dict[str, tuple[str, list]] = {
    "cuGetErrorName": ("cuGetErrorName", [c_int, POINTER(c_char_p)]),
    "cuGetErrorString": ("cuGetErrorString", [c_int, POINTER(c_char_p)]),
    "cuInit": ("cuInit", [c_uint]),
    "cuDeviceGet": ("cuDeviceGet", [POINTER(c_int), c_int]),
    "cuDeviceGetAttribute": ("cuDeviceGetAttribute", [POINTER(c_int), c_int, c_int]),
    "cuDevicePrimaryCtxRetain": ("cuDevicePrimaryCtxRetain", [POINTER(c_void_p), c_int]),
    "cuCtxGetCurrent": ("cuCtxGetCurrent", [POINTER(c_void_p)]),
    "cuCtxSetCurrent": ("cuCtxSetCurrent", [c_void_p]),
    "cuCtxPushCurrent": ("cuCtxPushCurrent_v2", [c_void_p]),
    "cuCtxPopCurrent": ("cuCtxPopCurrent_v2", [POINTER(c_void_p)]),
    "cuModuleLoadData": ("cuModuleLoadData", [POINTER(c_void_p), c_char_p]),
    "cuModuleGetFunction": ("cuModuleGetFunction", [POINTER(c_void_p), c_void_p, c_char_p]),
    "cuFuncSetAttribute": ("cuFuncSetAttribute", [c_void_p, c_int, c_int]),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": ("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                                    [POINTER(c_int), c_void_p, c_int, c_size_t]),
    # (int* numClusters, CUfunction, const CUlaunchConfig*): custom_kernels.launch builds the config
    "cuOccupancyMaxActiveClusters": ("cuOccupancyMaxActiveClusters", [POINTER(c_int), c_void_p, c_void_p]),
    "cuTensorMapEncodeTiled": ("cuTensorMapEncodeTiled",
                               [c_void_p, c_int, c_uint32, c_void_p, POINTER(c_uint64), POINTER(c_uint64),
                                POINTER(c_uint32), POINTER(c_uint32), c_int, c_int, c_int, c_int]),
    # (const CUlaunchConfig*, CUfunction, void** kernelParams, void** extra): custom_kernels.launch builds the config
    "cuLaunchKernelEx": ("cuLaunchKernelEx", [c_void_p, c_void_p, c_void_p, c_void_p]),
}

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_functions: dict[str, ctypes._CFuncPtr] = {}


def _open(name: str) -> ctypes.CDLL:
    global _library
    if _library is None:
        try:
            _library = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            raise CudaDriverError(f"{name}: cannot load {LIBRARY}, the CUDA driver library of the NVIDIA driver "
                                  f"(is an NVIDIA driver installed?): {exc}") from exc
    return _library


def function(name: str) -> ctypes._CFuncPtr:
    """libcuda's ``name`` (a key of the table above) as a declared ctypes function; opens libcuda on first use."""
    fn = _functions.get(name)
    if fn is None:
        symbol, argtypes = _SIGNATURES[name]
        with _lock:
            fn = _functions.get(name)
            if fn is None:
                lib = _open(name)
                try:
                    fn = getattr(lib, symbol)
                except AttributeError as exc:
                    raise CudaDriverError(f"{name}: {LIBRARY} has no {symbol} (a driver older than this "
                                          f"function?)") from exc
                fn.argtypes = argtypes
                fn.restype = c_int
                _functions[name] = fn
    return fn


def _handle(out: c_void_p) -> int:
    return out.value or 0


# --- errors ------------------------------------------------------------------------------------------------

def cuGetErrorName(error: int) -> tuple[int, bytes | None]:
    text = c_char_p()
    return function("cuGetErrorName")(error, byref(text)), text.value


def cuGetErrorString(error: int) -> tuple[int, bytes | None]:
    text = c_char_p()
    return function("cuGetErrorString")(error, byref(text)), text.value


def error_text(error: int) -> str:
    """``"<name>: <description>"`` of a CUresult as the driver words it (e.g. ``"CUDA_ERROR_INVALID_VALUE:
    invalid argument"``); ``"CUresult <n>: unknown to this driver"`` for a code the driver does not know."""
    err, name = cuGetErrorName(error)
    if err != CUDA_SUCCESS or name is None:
        return f"CUresult {error}: unknown to this driver"
    err, desc = cuGetErrorString(error)
    return f"{name.decode()}: {desc.decode() if err == CUDA_SUCCESS and desc is not None else ''}"


# --- devices and contexts ----------------------------------------------------------------------------------

def cuInit(flags: int) -> tuple[int]:
    return (function("cuInit")(flags),)


def cuDeviceGet(ordinal: int) -> tuple[int, int]:
    device = c_int()
    return function("cuDeviceGet")(byref(device), ordinal), device.value


def cuDeviceGetAttribute(attribute: int, device: int) -> tuple[int, int]:
    value = c_int()
    return function("cuDeviceGetAttribute")(byref(value), attribute, device), value.value


def cuDevicePrimaryCtxRetain(device: int) -> tuple[int, int]:
    ctx = c_void_p()
    return function("cuDevicePrimaryCtxRetain")(byref(ctx), device), _handle(ctx)


def cuCtxGetCurrent() -> tuple[int, int]:
    """(CUresult, the calling thread's current context; 0 when it has none)."""
    ctx = c_void_p()
    return function("cuCtxGetCurrent")(byref(ctx)), _handle(ctx)


def cuCtxSetCurrent(ctx: int) -> tuple[int]:
    return (function("cuCtxSetCurrent")(ctx),)


def cuCtxPushCurrent(ctx: int) -> tuple[int]:
    return (function("cuCtxPushCurrent")(ctx),)


def cuCtxPopCurrent() -> tuple[int, int]:
    ctx = c_void_p()
    return function("cuCtxPopCurrent")(byref(ctx)), _handle(ctx)


# --- modules and functions ---------------------------------------------------------------------------------

def cuModuleLoadData(image: bytes) -> tuple[int, int]:
    """Load a cubin (or PTX / fatbin) image into the current context; the driver copies it."""
    module = c_void_p()
    return function("cuModuleLoadData")(byref(module), image), _handle(module)


def cuModuleGetFunction(module: int, name: bytes) -> tuple[int, int]:
    fn = c_void_p()
    return function("cuModuleGetFunction")(byref(fn), module, name), _handle(fn)


def cuFuncSetAttribute(fn: int, attribute: int, value: int) -> tuple[int]:
    return (function("cuFuncSetAttribute")(fn, attribute, value),)


def cuOccupancyMaxActiveBlocksPerMultiprocessor(fn: int, block_size: int, dynamic_smem: int) -> tuple[int, int]:
    blocks = c_int()
    err = function("cuOccupancyMaxActiveBlocksPerMultiprocessor")(byref(blocks), fn, block_size, dynamic_smem)
    return err, blocks.value


def cuOccupancyMaxActiveClusters(fn: int, config_address: int) -> tuple[int, int]:
    """(CUresult, the most clusters of the launch config at ``config_address`` (a CUlaunchConfig with a cluster
    attribute) resident on the device at once), in the current context."""
    clusters = c_int()
    err = function("cuOccupancyMaxActiveClusters")(byref(clusters), fn, config_address)
    return err, clusters.value


# --- TMA ---------------------------------------------------------------------------------------------------

def cuTensorMapEncodeTiled(data_type: int, rank: int, address: int, dims, strides, box, element_strides,
                           interleave: int, swizzle: int, l2_promotion: int, oob_fill: int) -> tuple[int, bytes]:
    """(CUresult, the 128-byte CUtensorMap) of a tiled TMA descriptor. ``dims``, ``box`` and
    ``element_strides``: ``rank`` values each, innermost first; ``strides``: the byte strides of the
    ``rank - 1`` outer dimensions."""
    # the driver wants the map 64-byte aligned: written into an aligned window of a larger buffer
    buffer = (ctypes.c_uint8 * (CU_TENSOR_MAP_BYTES + _TENSOR_MAP_ALIGN))()
    start = ctypes.addressof(buffer)
    aligned = start + (-start) % _TENSOR_MAP_ALIGN
    err = function("cuTensorMapEncodeTiled")(
        aligned, data_type, rank, address, (c_uint64 * rank)(*dims), (c_uint64 * max(1, rank - 1))(*strides),
        (c_uint32 * rank)(*box), (c_uint32 * rank)(*element_strides), interleave, swizzle, l2_promotion, oob_fill)
    return err, ctypes.string_at(aligned, CU_TENSOR_MAP_BYTES)
