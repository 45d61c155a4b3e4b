"""cuLaunchKernelEx with launch attributes (thread-block cluster, programmatic dependent launch).

A ``CUlaunchConfig`` and its attributes live in one ctypes buffer made once per launch shape, and
the launch calls libcuda's ``cuLaunchKernelEx`` through ctypes: per call only the stream field is
written (through cuda-python, a ``CUlaunchConfig`` costs an object conversion per call). Measured on
an H100 host: 3.1-5.7 us per ctypes ``cuLaunchKernelEx`` against 3.7-5.8 us for cuda-python's plain
``cuLaunchKernel`` (scripts/results/2026-11-22-nvidia-h100-pdl_probe-s5.md).

Programmatic dependent launch (PDL): the kernel may start while the previous kernel in the stream
finishes, and must itself execute ``griddepcontrol.wait`` before it touches memory that kernel
wrote. Only kernels compiled for it (CUTLASS Sm90 kernels built with
``CUTLASS_ENABLE_GDC_FOR_SM90``) may be launched so; ``CUTLASS_OPS_PDL=0`` turns it off.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

__all__ = ["ExLaunch", "cu_launch_kernel_ex", "pdl_enabled", "switch_on"]

# cuda.h: CUlaunchAttributeID values
_ATTR_CLUSTER_DIMENSION = 4
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _Attribute(ctypes.Structure):
    # CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _Config(ctypes.Structure):
    # CUlaunchConfig (cuda.h, CUDA 12 and 13)
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("num_attrs", ctypes.c_uint)]


assert ctypes.sizeof(_Attribute) == 72 and ctypes.sizeof(_Config) == 56

_lib_lock = threading.Lock()
_launch_ex = None


def cu_launch_kernel_ex():
    """libcuda's ``cuLaunchKernelEx`` as a ctypes function (loaded once)."""
    global _launch_ex
    with _lib_lock:
        if _launch_ex is None:
            lib = ctypes.CDLL("libcuda.so.1")  # already loaded by cuda-python / torch
            fn = lib.cuLaunchKernelEx
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            _launch_ex = fn
    return _launch_ex


def switch_on(name: str) -> bool:
    """An on/off environment switch that defaults to on: "0", "false", "no" or "off" turn it off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def pdl_enabled() -> bool:
    """Whether kernels built for it are launched with programmatic dependent launch (default on)."""
    return switch_on("CUTLASS_OPS_PDL")


class ExLaunch:
    """One (function, grid, block, smem, cluster, pdl) made ready for ``cuLaunchKernelEx``."""

    def __init__(self, function: Any, grid, block, smem: int, cluster=(1, 1, 1), pdl: bool = False):
        self._function = int(function)  # CUfunction handle
        attrs = []
        if tuple(cluster) != (1, 1, 1):
            attrs.append((_ATTR_CLUSTER_DIMENSION, tuple(cluster)))
        if pdl:
            attrs.append((_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, (1,)))
        self._attrs = (_Attribute * max(1, len(attrs)))()
        for slot, (attr_id, values) in zip(self._attrs, attrs):
            slot.id = attr_id
            slot.value[:len(values)] = values
        self._config = _Config()
        self._config.grid[:] = grid
        self._config.block[:] = block
        self._config.smem = smem
        self._config.attrs = self._attrs
        self._config.num_attrs = len(attrs)
        self._config_addr = ctypes.addressof(self._config)
        self._call = None  # libcuda's cuLaunchKernelEx, resolved on the first launch
        self._lock = threading.Lock()  # the stream field is shared between callers

    def launch(self, stream: int, params_addr: int) -> int:
        """cuLaunchKernelEx on ``stream``; returns the CUresult as an int (0: success)."""
        with self._lock:
            call = self._call or self._resolve()
            self._config.stream = stream
            return call(self._config_addr, self._function, params_addr, None)

    def _resolve(self):
        self._call = cu_launch_kernel_ex()
        return self._call

    @property
    def attributes(self) -> list[tuple[int, tuple[int, ...]]]:
        """(CUlaunchAttributeID, the value's first three 32-bit words) of each attribute set."""
        return [(a.id, tuple(a.value[:3])) for a in self._attrs[:self._config.num_attrs]]
