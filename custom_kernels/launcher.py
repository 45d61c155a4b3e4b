"""Load cubins and launch their kernels on the current torch stream, every driver call checked.

One launcher serves both the NVRTC kernels (typed argument lists) and the CUTLASS-built
kernels (one ``Params`` struct passed by value, optionally with a thread-block cluster).
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, Sequence

from cuda.bindings import driver

from .launch_config import ExLaunch

__all__ = ["CudaDriverError", "check", "Module", "Kernel", "LaunchShape", "current_stream_handle", "device_capability"]


class CudaDriverError(RuntimeError):
    """A CUDA driver call returned an error; the message names the call and decodes the error."""


def check(result: tuple, what: str) -> Any:
    """Unpack a cuda.bindings.driver return tuple, raising CudaDriverError unless CUDA_SUCCESS."""
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, desc = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        desc = desc.decode() if isinstance(desc, bytes) else ""
        raise CudaDriverError(f"{what} failed: {name}: {desc}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


class LaunchShape:
    """One kernel function with its grid, block, dynamic shared memory and cluster shape, ready to
    launch: ``launch(stream, params_addr)`` only sets the stream and calls the driver.

    ``pdl``: launch with programmatic dependent launch (only for kernels that wait on the previous
    grid before reading its results, see ``launch_config``)."""

    def __init__(self, function: Any, grid, block, smem: int = 0, cluster=(1, 1, 1), name: str = "kernel",
                 pdl: bool = False):
        self.function = function
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.block = (tuple(block) + (1, 1))[:3]
        self.smem = int(smem)
        self.cluster = (tuple(cluster) + (1, 1))[:3]
        self.name = name
        self.pdl = bool(pdl)
        # Plain launches go through cuda-python; clusters and PDL need launch attributes (ctypes).
        self._ex = (ExLaunch(function, self.grid, self.block, self.smem, self.cluster, self.pdl)
                    if self.cluster != (1, 1, 1) or self.pdl else None)

    def launch(self, stream: int, params_addr: int) -> None:
        """Launch on ``stream`` (a raw CUstream, 0 = the legacy default) with kernelParams at ``params_addr``."""
        if self._ex is None:
            err, = driver.cuLaunchKernel(self.function, *self.grid, *self.block, self.smem, stream, params_addr, 0)
            if err == driver.CUresult.CUDA_SUCCESS:
                return
        else:
            err = self._ex.launch(stream, params_addr)
            if err == 0:
                return
            err = driver.CUresult(err)
        check((err,), f"cuLaunchKernel({self.name}, grid={self.grid}, block={self.block}, smem={self.smem}, "
                      f"cluster={self.cluster}, pdl={self.pdl})")


_ctx_lock = threading.Lock()
_contexts: dict[int, Any] = {}


def _torch():
    import torch

    return torch


def _ensure_context(device: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    with _ctx_lock:
        ctx = _contexts.get(device)
        if ctx is None:
            check(driver.cuInit(0), "cuInit")
            dev = check(driver.cuDeviceGet(device), "cuDeviceGet")
            ctx = check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _contexts[device] = ctx
    current = check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) != int(ctx):
        check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _current_device() -> int:
    torch = _torch()
    get = getattr(torch._C, "_cuda_getDevice", None)  # what torch.cuda.current_device() calls, minus checks
    return get() if get is not None else torch.cuda.current_device()


def current_stream_handle() -> int:
    """The raw cudaStream_t of torch's current stream on the current device."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:  # ~0.3 us, against ~2 us for building a torch.cuda.Stream object
        return raw(_current_device())
    return torch.cuda.current_stream().cuda_stream


def device_capability(device: int | None = None) -> int:
    """Compute capability as an int (e.g. 90) of ``device`` (default: torch's current device)."""
    torch = _torch()
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


# Argument kinds of a kernel signature: one character each.
_CTYPES = {
    "P": ctypes.c_uint64,  # device pointer (a tensor, an int address, or None)
    "i": ctypes.c_int32,
    "I": ctypes.c_uint32,
    "q": ctypes.c_int64,
    "f": ctypes.c_float,
    "T": ctypes.c_char * 128,  # a CUtensorMap passed by value (__grid_constant__), as 128 bytes
}
# Parameter alignment in the kernel's parameter space (CUtensorMap is declared alignas(64)).
_ALIGN = {"P": 8, "i": 4, "I": 4, "q": 8, "f": 4, "T": 64}


_PACK = {"P": "Q", "i": "i", "I": "I", "q": "q", "f": "f", "T": "128s"}


def _as_pointer(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return value.data_ptr()


class Kernel:
    """One ``__global__`` function of a loaded module."""

    def __init__(self, module: "Module", name: str, signature: str | None):
        self.module = module
        self.name = name
        self.signature = signature
        self._functions: dict[int, Any] = {}
        self._param_arrays: dict[int, tuple] = {}
        self._shapes: dict[tuple, LaunchShape] = {}
        self._pack_lock = threading.Lock()
        self._max_dynamic_smem = 0
        if signature is not None:
            bad = set(signature) - set(_CTYPES)
            if bad:
                raise ValueError(f"signature of {name} has unknown argument kinds {sorted(bad)}")
            # The C layout of the parameter list: each argument at the next multiple of its alignment.
            offsets, cur = [], 0
            for c in signature:
                cur = -(-cur // _ALIGN[c]) * _ALIGN[c]
                offsets.append(cur)
                cur += ctypes.sizeof(_CTYPES[c])
            # One struct.pack_into format with explicit padding reproduces that layout, so a call
            # packs every argument in one C-level step into a buffer that lives with the kernel.
            fmt, cur = "<", 0
            for c, off in zip(signature, offsets):
                fmt += ("x" * (off - cur)) + _PACK[c]
                cur = off + ctypes.sizeof(_CTYPES[c])
            self._fmt = struct.Struct(fmt)
            self._pointer_args = tuple(i for i, c in enumerate(signature) if c == "P")
            self._blob_args = tuple(i for i, c in enumerate(signature) if c == "T")
            # 64-byte aligned buffer (over-allocated): the driver copies each argument from its address
            self._raw = (ctypes.c_char * (max(1, cur) + 64))()
            pad = -ctypes.addressof(self._raw) % 64
            self._buf = (ctypes.c_char * max(1, cur)).from_buffer(self._raw, pad)
            base = ctypes.addressof(self._buf)
            self._ptrs = (ctypes.c_void_p * len(offsets))(*[base + off for off in offsets])
            self._ptrs_addr = ctypes.addressof(self._ptrs)

    def function(self, device: int | None = None):
        """The CUfunction on ``device`` (loading the module there on first use)."""
        if device is None:
            device = _current_device()
        fn = self._functions.get(device)
        if fn is None:
            mod = self.module.handle(device)
            fn = check(driver.cuModuleGetFunction(mod, self.name.encode()), f"cuModuleGetFunction({self.name})")
            if self._max_dynamic_smem:
                self._set_smem(fn, self._max_dynamic_smem)
            self._functions[device] = fn
        return fn

    def _set_smem(self, fn, nbytes: int) -> None:
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(driver.cuFuncSetAttribute(fn, attr, nbytes), f"cuFuncSetAttribute({self.name}, smem={nbytes})")

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory (applied on every device used)."""
        if nbytes > self._max_dynamic_smem:
            self._max_dynamic_smem = nbytes
            for fn in self._functions.values():
                self._set_smem(fn, nbytes)

    def _check_args(self, args: Sequence[Any]) -> list:
        if self.signature is None:
            raise TypeError(f"kernel {self.name} was loaded without a signature; use launch_params")
        if len(args) != len(self.signature):
            raise TypeError(f"kernel {self.name} takes {len(self.signature)} arguments ({self.signature}), "
                            f"got {len(args)}")
        values = list(args)
        for i in self._pointer_args:
            values[i] = _as_pointer(values[i])
        for i in self._blob_args:
            if not isinstance(values[i], bytes) or len(values[i]) != 128:
                raise TypeError(f"argument {i} of kernel {self.name} is a tensor map: 128 bytes, got "
                                f"{type(values[i]).__name__}")
        return values

    def pack(self, args: Sequence[Any]) -> bytes:
        """The argument bytes ``args`` pack to (the C layout of the kernel's parameter list)."""
        return self._fmt.pack(*self._check_args(args))

    def launch(self, grid, block, args: Sequence[Any], smem: int = 0, stream: int | None = None) -> None:
        """Launch on ``stream`` (default: torch's current stream) with typed ``args``."""
        values = self._check_args(args)
        with self._pack_lock:  # the driver copies the arguments during cuLaunchKernel
            self._fmt.pack_into(self._buf, 0, *values)
            self._launch(grid, block, self._ptrs_addr, smem, stream)

    def launch_params(self, grid, block, params: ctypes.Array | bytearray, smem: int = 0,
                      stream: int | None = None, cluster: tuple[int, int, int] = (1, 1, 1),
                      device: int | None = None) -> None:
        """Launch a kernel whose only parameter is a by-value struct held in ``params``."""
        self._launch(grid, block, self.params_address(params), smem, stream, cluster, device)

    def params_address(self, params: ctypes.Array | bytearray) -> int:
        """kernelParams (the address of a void*[1]) for a by-value struct held in ``params``.

        Made once per buffer: callers keep one buffer per problem shape (or per pointer set) and
        rewrite it in place."""
        entry = self._param_arrays.get(id(params))
        if entry is None or entry[0] is not params:
            buf = params if isinstance(params, ctypes.Array) else (ctypes.c_char * len(params)).from_buffer(params)
            ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
            if len(self._param_arrays) > 1024:
                self._param_arrays.clear()
            entry = self._param_arrays[id(params)] = (params, buf, ptrs, ctypes.addressof(ptrs))
        return entry[3]

    def _launch(self, grid, block, params_addr: int, smem: int, stream: int | None, cluster=(1, 1, 1),
                device: int | None = None) -> None:
        if stream is None:
            stream = current_stream_handle()
        if device is None:
            device = _current_device()
        key = (tuple(grid), tuple(block), smem, tuple(cluster), device)
        shape = self._shapes.get(key)
        if shape is None:  # building one costs microseconds: one per launch shape, only the stream changes
            if len(self._shapes) >= 1024:
                self._shapes.clear()
            shape = self._shapes[key] = LaunchShape(self.function(device), grid, block, smem, cluster, self.name)
        shape.launch(stream, params_addr)


class Module:
    """A cubin image, loaded lazily into each device's primary context."""

    def __init__(self, image: bytes, name: str = "module"):
        self.image = bytes(image)
        self.name = name
        self._handles: dict[int, Any] = {}
        self._kernels: dict[str, Kernel] = {}

    def handle(self, device: int):
        mod = self._handles.get(device)
        if mod is None:
            torch = _torch()
            with torch.cuda.device(device):
                _ensure_context(device)
                mod = check(driver.cuModuleLoadData(self.image), f"cuModuleLoadData({self.name})")
            self._handles[device] = mod
        return mod

    def kernel(self, name: str, signature: str | None = None) -> Kernel:
        """The kernel ``name``; ``signature`` is one character per argument (P, i, I, q, f, T)."""
        k = self._kernels.get(name)
        if k is None:
            k = Kernel(self, name, signature)
            self._kernels[name] = k
        return k
