"""What the runtime asks of a GPU, each answered in exactly one place.

The device's primary context (the one torch uses), its compute capability, SM count and
shared-memory limits, the NVRTC target for it, and torch's current raw stream. Every driver
call goes through :mod:`.libcuda` (ctypes; no ``cuda.bindings`` import on the runtime path) and is
checked (:func:`check`). Answers that never change for a device are cached.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import torch

from . import libcuda
from .libcuda import CudaDriverError

__all__ = ["CudaDriverError", "check", "current_device", "raw_stream", "capability", "sm_count",
           "smem_limits", "target_arch", "ensure_context", "context_of", "retry_in_context", "on_device"]


def check(result: tuple, what: str) -> Any:
    """Unpack a driver call's ``(CUresult, *outputs)`` (:mod:`.libcuda`'s convention): None, the one output,
    or a tuple of them; CudaDriverError naming ``what`` and the decoded error unless CUDA_SUCCESS."""
    err, *rest = result
    if err != libcuda.CUDA_SUCCESS:
        raise CudaDriverError(f"{what} failed: {libcuda.error_text(int(err))}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _raw_stream_fallback(device: int) -> int:  # torch without the C accessor
    return torch.cuda.current_stream(device).cuda_stream


# Both are called on every launch, so they are torch's C accessors themselves, with no Python
# wrapper: current_device() is torch's current CUDA device index; raw_stream(device) the raw
# cudaStream_t of torch's current stream on ``device`` (~0.3 us, against ~2 us for building a
# torch.cuda.Stream object).
current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _raw_stream_fallback


@functools.lru_cache(maxsize=None)
def _capability(device: int) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def capability(device: int | None = None) -> int:
    """Compute capability as an int (e.g. 90) of ``device`` (default: torch's current device)."""
    return _capability(current_device() if device is None else device)


@functools.lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    """Streaming multiprocessors of ``device``."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def smem_limits(device: int) -> tuple[int, int, int]:
    """(shared memory per SM, opt-in maximum per block, reserved per block) in bytes."""
    check(libcuda.cuInit(0), "cuInit")
    dev = check(libcuda.cuDeviceGet(device), "cuDeviceGet")
    return tuple(check(libcuda.cuDeviceGetAttribute(getattr(libcuda, name), dev), f"cuDeviceGetAttribute({name})")
                 for name in ("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                              "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
                              "CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK"))


def target_arch(device: int | None = None) -> str:
    """The NVRTC target for ``device``: sm_90a on Hopper (wgmma-capable), else its own sm_XY."""
    cc = capability(device)
    return "90a" if cc == 90 else str(cc)


_ctx_lock = threading.Lock()
_contexts: dict[int, int] = {}


def _primary_context(device: int) -> int:
    """``device``'s primary context (the one torch uses; a CUcontext as an int), retained once."""
    with _ctx_lock:
        ctx = _contexts.get(device)
        if ctx is None:
            check(libcuda.cuInit(0), "cuInit")
            dev = check(libcuda.cuDeviceGet(device), "cuDeviceGet")
            ctx = check(libcuda.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _contexts[device] = ctx
    return ctx


def ensure_context(device: int) -> None:
    """Make ``device``'s primary context current on this thread (for a thread that has none yet)."""
    ctx = _primary_context(device)
    if check(libcuda.cuCtxGetCurrent(), "cuCtxGetCurrent") != ctx:  # 0: none current
        check(libcuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


@contextlib.contextmanager
def context_of(device: int):
    """``device``'s primary context current inside, the caller's back after (push / pop): a module load or
    a launch for tensors on another GPU than the current one leaves the thread's device as it was."""
    check(libcuda.cuCtxPushCurrent(_primary_context(device)), "cuCtxPushCurrent")
    try:
        yield
    finally:
        check(libcuda.cuCtxPopCurrent(), "cuCtxPopCurrent")


def retry_in_context(err: int, device: int, launch):
    """``launch()``'s result after binding ``device``'s primary context when ``err`` (a failed launch's
    CUresult) says no context is current on this thread; ``err`` itself otherwise.
    Modules are loaded (and the context made current) on the thread of their first use; a thread whose
    first CUDA work is a later launch of ours has none yet (autograd's device threads: torch binds it there
    only at its first runtime call, which may come after ours)."""
    if err != libcuda.CUDA_ERROR_INVALID_CONTEXT:
        return err
    ensure_context(device)
    return launch()


def on_device(device) -> contextlib.AbstractContextManager:
    """``torch.cuda.device(device)``, or a no-op when it is already current (entering the real
    context manager costs microseconds)."""
    index = getattr(device, "index", device)
    if index is None or index == current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(index)
