"""The one launcher: load a cubin's kernels and launch them on torch's current stream.

Three layers, each built once and reused per call:

- :class:`Kernel` - a ``__global__`` function of a loaded :class:`Module` (loaded lazily into each
  device's primary context); :func:`load_kernel` compiles a ``kernels/*.cu`` source with NVRTC
  (cached) and returns one.
- :class:`LaunchShape` - a kernel function on one device with its grid, block, dynamic shared
  memory, thread-block cluster and programmatic-dependent-launch flag: ``launch(stream,
  kernel_params)`` only sets the stream and calls the driver. Every launch goes through libcuda's
  ``cuLaunchKernelEx`` by ctypes with one ``CUlaunchConfig`` made per shape (its launch attributes:
  none, a cluster, PDL), so a call converts four arguments (measured on an H100 host: 3.1-5.7 us per
  ctypes ``cuLaunchKernelEx`` against 3.7-5.8 us for cuda-python's plain ``cuLaunchKernel``; ctypes'
  own cost, against a stub library: 0.4 us for it against 0.9 us for the eleven of ``cuLaunchKernel``).
- :class:`Launch` - a LaunchShape plus its argument block, packed once: a :class:`KernelArgs`
  struct whose fields are the kernel's parameters by name (a call writes only the fields it
  names), or an opaque by-value ``Params`` blob (CUTLASS kernels).

Programmatic dependent launch (PDL): the kernel may start while the previous kernel in the stream
finishes, and must itself execute ``griddepcontrol.wait`` before it touches memory that kernel
wrote. Only kernels compiled for it (CUTLASS Sm90 kernels built with
``CUTLASS_ENABLE_GDC_FOR_SM90``) may be launched so; ``CUTLASS_OPS_PDL=0`` turns it off.

Only this module (and the optional C++ per-call path, ``host/int8_gemm_launch.cpp``, which calls
the ``cuLaunchKernelEx`` it is handed from here) launches kernels.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from . import libcuda
from .device import CudaDriverError, check, context_of, current_device, raw_stream, retry_in_context, target_arch

__all__ = [
    "CudaDriverError", "check", "Module", "Kernel", "load_kernel", "KernelArgs", "Ptr", "I32", "U32", "I64", "F32",
    "TensorMap", "LaunchConfig", "LaunchShape", "Launch", "params_address", "cu_launch_kernel_ex", "switch_on",
    "pdl_enabled",
]


def switch_on(name: str) -> bool:
    """An on/off environment switch that defaults to on: "0", "false", "no" or "off" turn it off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def pdl_enabled() -> bool:
    """Whether kernels built for it are launched with programmatic dependent launch (default on)."""
    return switch_on("CUTLASS_OPS_PDL")


# ------------------------------------------------------------------------------------------------
# modules and kernels
# ------------------------------------------------------------------------------------------------

class Module:
    """A cubin image, loaded lazily into each device's primary context."""

    def __init__(self, image: bytes, name: str = "module"):
        self.image = bytes(image)
        self.name = name
        self._handles: dict[int, int] = {}  # device -> CUmodule
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()

    def handle(self, device: int):
        mod = self._handles.get(device)
        if mod is None:
            with self._lock:
                mod = self._handles.get(device)
                if mod is None:
                    with context_of(device):  # loads into device's context; the caller's stays current
                        mod = check(libcuda.cuModuleLoadData(self.image), f"cuModuleLoadData({self.name})")
                    self._handles[device] = mod
        return mod

    def kernel(self, name: str) -> "Kernel":
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels.setdefault(name, Kernel(self, name))
        return k


class Kernel:
    """One ``__global__`` function of a :class:`Module`, resolved per device on first use."""

    def __init__(self, module: Module, name: str):
        self.module = module
        self.name = name
        self._functions: dict[int, int] = {}  # device -> CUfunction
        self._max_dynamic_smem = 0

    def function(self, device: int | None = None) -> int:
        """The CUfunction (an int) on ``device`` (default: the current one), loading the module there first."""
        if device is None:
            device = current_device()
        fn = self._functions.get(device)
        if fn is None:
            mod = self.module.handle(device)
            fn = check(libcuda.cuModuleGetFunction(mod, self.name.encode()), f"cuModuleGetFunction({self.name})")
            if self._max_dynamic_smem:
                self._set_smem(fn, self._max_dynamic_smem)
            self._functions[device] = fn
        return fn

    def _set_smem(self, fn: int, nbytes: int) -> None:
        attr = libcuda.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(libcuda.cuFuncSetAttribute(fn, attr, nbytes), f"cuFuncSetAttribute({self.name}, smem={nbytes})")

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        """Allow more than 48 KiB of dynamic shared memory (applied on every device used)."""
        if nbytes > self._max_dynamic_smem:
            self._max_dynamic_smem = nbytes
            for fn in list(self._functions.values()):  # another thread may add a device meanwhile
                self._set_smem(fn, nbytes)

    def max_active_blocks(self, threads: int, smem: int, device: int) -> int:
        """Blocks of ``threads`` threads and ``smem`` dynamic shared bytes that fit on one SM."""
        return check(libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function(device), threads, smem),
                     f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})")

    def max_active_clusters(self, threads: int, smem: int, cluster, device: int) -> int:
        """Thread-block clusters of ``cluster`` blocks (each ``threads`` threads, ``smem`` dynamic shared bytes)
        resident on the device at once: what one wave of a cluster launch holds, which the SM count times
        :meth:`max_active_blocks` overstates when clusters do not tile each GPC's SMs."""
        shape = LaunchShape(self, LaunchConfig.of(cluster, threads, smem, cluster=cluster), device)
        with context_of(device):
            return check(libcuda.cuOccupancyMaxActiveClusters(shape.function, shape.ex_config_address),
                         f"cuOccupancyMaxActiveClusters({self.name}, cluster={shape.cluster})")


@functools.lru_cache(maxsize=None)
def _module(filename: str, arch: str, defines: tuple[tuple[str, object], ...]) -> Module:
    from .nvrtc import compile_file  # NVRTC only when a kernel is first needed

    cubin = compile_file(filename, arch, defines=dict(defines))
    return Module(cubin.data, name=f"{filename}@sm_{arch}")


def load_kernel(filename: str, name: str, defines: Mapping[str, object] | None = None,
                arch: str | None = None, device: int | None = None) -> Kernel:
    """Kernel ``name`` of ``custom_kernels/kernels/<filename>``, built with ``defines`` for ``arch``
    (default: the NVRTC target of ``device``, default the current device)."""
    arch = arch or target_arch(device)
    return _module(filename, arch, tuple(sorted((defines or {}).items()))).kernel(name)


# ------------------------------------------------------------------------------------------------
# arguments
# ------------------------------------------------------------------------------------------------

Ptr = ctypes.c_uint64  # a device pointer (tensor.data_ptr(), or 0 for an absent input)
I32 = ctypes.c_int32
U32 = ctypes.c_uint32
I64 = ctypes.c_int64
F32 = ctypes.c_float
TensorMap = ctypes.c_uint8 * 128  # a CUtensorMap by value (__grid_constant__): assign TensorMap.from_buffer_copy(b)


class _ArgsType(type(ctypes.Structure)):
    """Gives every KernelArgs subclass empty ``__slots__``: writing a misspelt field name then
    raises AttributeError instead of setting a Python attribute the kernel never sees."""

    def __new__(mcls, name, bases, namespace):
        namespace.setdefault("__slots__", ())
        return super().__new__(mcls, name, bases, namespace)


class KernelArgs(ctypes.Structure, metaclass=_ArgsType):
    """A kernel's parameter list by name: subclass with ``_fields_ = [(name, Ptr | I32 | ...), ...]``
    in the kernel's order. The driver copies each parameter from its own address, so the host
    struct's padding does not matter. Only declared fields can be written."""

    _fields_: list = []

    def kernel_params(self) -> tuple[Any, int]:
        """(keep-alive, address of a void*[n] pointing at each field): what cuLaunchKernel takes."""
        cls = type(self)
        base = ctypes.addressof(self)
        ptrs = (ctypes.c_void_p * max(1, len(cls._fields_)))(
            *[base + getattr(cls, field[0]).offset for field in cls._fields_])
        return ptrs, ctypes.addressof(ptrs)


def params_address(params: ctypes.Array) -> tuple[Any, int]:
    """(keep-alive, kernelParams) for a kernel whose only parameter is the by-value struct ``params``."""
    ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    return ptrs, ctypes.addressof(ptrs)


# ------------------------------------------------------------------------------------------------
# launch shapes
# ------------------------------------------------------------------------------------------------

def _dim3(value) -> tuple[int, int, int]:
    value = (value,) if isinstance(value, int) else tuple(value)
    return tuple(int(v) for v in (value + (1, 1))[:3])


@dataclass(frozen=True)
class LaunchConfig:
    """Grid, block, dynamic shared memory, thread-block cluster and PDL of one launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0
    cluster: tuple[int, int, int] = (1, 1, 1)
    pdl: bool = False

    @classmethod
    def of(cls, grid, block, smem: int = 0, cluster=(1, 1, 1), pdl: bool = False) -> "LaunchConfig":
        """Any int / 1-3 tuple for grid, block and cluster, padded to three dimensions."""
        return cls(_dim3(grid), _dim3(block), int(smem), _dim3(cluster), bool(pdl))


_ATTR_CLUSTER_DIMENSION = libcuda.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _Attribute(ctypes.Structure):
    # CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):
    # CUlaunchConfig (cuda.h, CUDA 12 and 13)
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


assert ctypes.sizeof(_Attribute) == 72 and ctypes.sizeof(_Config) == 56


def cu_launch_kernel_ex():
    """libcuda's ``cuLaunchKernelEx`` as a ctypes function (declared once, :mod:`.libcuda`)."""
    return libcuda.function("cuLaunchKernelEx")


class LaunchShape:
    """One kernel function on one device with its :class:`LaunchConfig`, ready to launch."""

    def __init__(self, kernel: Kernel, config: LaunchConfig, device: int):
        self.name = kernel.name
        self.device = device
        self.config = config
        self.function = kernel.function(device)  # a CUfunction (int)
        self.grid, self.block, self.smem = config.grid, config.block, config.smem
        self.cluster, self.pdl = config.cluster, config.pdl
        self._make_ex_config()
        self._lock = threading.Lock()  # the ex config's stream field is shared between callers

    def _make_ex_config(self) -> None:
        attrs = []
        if self.cluster != (1, 1, 1):
            attrs.append((_ATTR_CLUSTER_DIMENSION, self.cluster))
        if self.pdl:
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
        self._attrs = (_Attribute * max(1, len(attrs)))()  # none: a launch without attributes
        for slot, (attr_id, values) in zip(self._attrs, attrs):
            slot.id = attr_id
            slot.value[:len(values)] = values
        cfg = _Config()
        cfg.grid[:] = self.grid
        cfg.block[:] = self.block
        cfg.smem = self.smem
        cfg.attrs = self._attrs
        cfg.num_attrs = len(attrs)
        self._ex_config = cfg
        self.ex_config_address = ctypes.addressof(cfg)  # the CUlaunchConfig (its stream: the last launch's)
        self._ex_function = int(self.function)
        self._ex_call = cu_launch_kernel_ex()

    @property
    def attributes(self) -> list[tuple[int, tuple[int, ...]]]:
        """(CUlaunchAttributeID, the value's first three 32-bit words) of each launch attribute."""
        return [(a.id, tuple(a.value[:3])) for a in self._attrs[:self._ex_config.num_attrs]]

    def launch(self, stream: int, kernel_params: int) -> None:
        """Launch on ``stream`` (a raw CUstream; 0 = the legacy default) with ``kernel_params``, in the
        context of the launch's device (a launch runs in the current context: a function of another
        device's module would fail with an invalid handle)."""
        if current_device() != self.device:
            with context_of(self.device):
                return self._launch_here(stream, kernel_params)
        return self._launch_here(stream, kernel_params)

    def _launch_here(self, stream: int, kernel_params: int) -> None:
        err = self._launch(stream, kernel_params)
        if err == libcuda.CUDA_SUCCESS:
            return
        err = retry_in_context(err, self.device, lambda: self._launch(stream, kernel_params))
        if err == libcuda.CUDA_SUCCESS:
            return
        check((err,), f"cuLaunchKernel({self.name}, grid={self.grid}, block={self.block}, smem={self.smem}, "
                      f"cluster={self.cluster}, pdl={self.pdl})")

    def _launch(self, stream: int, kernel_params: int) -> int:
        """One launch attempt: its CUresult."""
        with self._lock:
            self._ex_config.stream = stream
            return self._ex_call(self.ex_config_address, self._ex_function, kernel_params, None)


class Launch:
    """A :class:`LaunchShape` with its argument block, packed once: ``launch(**fields)`` writes the
    named fields of a :class:`KernelArgs` block and launches on torch's current stream of the
    launch's device (or ``stream=``)."""

    def __init__(self, kernel: Kernel, config: LaunchConfig, args: KernelArgs | ctypes.Array,
                 device: int | None = None):
        self.device = current_device() if device is None else device
        self.shape = LaunchShape(kernel, config, self.device)
        self.args = args
        if isinstance(args, KernelArgs):
            self._keep, self._params = args.kernel_params()
        else:
            self._keep, self._params = params_address(args)
        self._lock = threading.Lock()  # the argument block is shared; the driver copies it at launch

    def __call__(self, stream: int | None = None, **fields: Any) -> None:
        if stream is None:
            stream = raw_stream(self.device)
        args = self.args
        with self._lock:
            for name, value in fields.items():
                setattr(args, name, value)
            self.shape.launch(stream, self._params)
