"""The C++ per-call launch path (``host/int8_gemm_launch.cpp``), built as a torch extension.

Built once per (source, torch, Python, compiler flags) into ``<cache>/host_ext/<key>/`` with
torch's extension builder (ninja and the host C++ compiler), under the lock ``<key>.lock``, and
loaded from there afterwards; the built ``.so`` gets a sha256 sidecar, checked before each
process loads it (a mismatch deletes it with a warning, so ninja rebuilds it);
``scripts/build_kernels.py`` builds it ahead of time. When it cannot be built or loaded (no
compiler, no ninja) or ``CUTLASS_OPS_HOST_EXT=0``, :func:`load` returns None and callers keep their
Python path; the reason is logged once.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from . import cache
from .cache import cache_dir, content_key
from .cuda_paths import cuda_include_dirs
from .launch import cu_launch_kernel_ex, switch_on

__all__ = ["build", "load", "enabled", "SOURCE"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "host" / "int8_gemm_launch.cpp"
_CFLAGS = ("-O3", "-std=c++17")
_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None


def enabled() -> bool:
    """Whether the C++ path may be used (``CUTLASS_OPS_HOST_EXT=0`` turns it off)."""
    return switch_on("CUTLASS_OPS_HOST_EXT")


def _key() -> str:
    import torch

    return content_key(SOURCE.read_bytes(), torch.__version__, sys.version.split()[0], " ".join(_CFLAGS))[:16]


def load() -> ModuleType | None:
    """The extension module (built first if the cache lacks it), or None when it is unavailable."""
    global _module, _failed
    if not enabled():
        return None
    if _module is not None:
        return _module
    with _lock:
        if _module is not None or _failed is not None:
            return _module
        try:
            module = _build_and_load()
            module.set_launch_function(ctypes.cast(cu_launch_kernel_ex(), ctypes.c_void_p).value)
        except Exception as exc:  # no compiler / ninja / headers / driver: the Python path stays
            _failed = f"{type(exc).__name__}: {exc}"
            log.warning("C++ launch path unavailable, using the Python path: %s", _failed.splitlines()[0][:300])
            return None
        _module = module
    return _module


def build() -> Path:
    """Build the extension into the cache (no GPU needed); the directory it is in."""
    _build_and_load()
    return cache_dir("host_ext", _key())


def _build_and_load() -> ModuleType:
    from torch.utils import cpp_extension

    try:  # the ninja wheel's binary, for environments whose PATH lacks it (a venv run without activation)
        import ninja

        if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    directory = cache_dir("host_ext", _key())
    name = "cutlass_ops_int8_gemm_launch"
    with cache.entry_lock(directory):  # torch's own baton is per build, not per publish-and-check
        for lib in directory.glob(f"{name}*.so"):
            if not cache.verify(lib, cache.looks_like_elf):
                lib.unlink()  # ninja rebuilds a missing output
        if not any(directory.glob(f"{name}*.so")):
            log.info("building the C++ launch path into %s (once, about a minute; scripts/build_kernels.py "
                     "builds it ahead of time)", directory)
        module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=list(_CFLAGS),
                                    extra_include_paths=list(cuda_include_dirs()), build_directory=str(directory),
                                    verbose=False)
        for lib in directory.glob(f"{name}*.so"):
            if not cache.sidecar_path(lib).is_file() or not cache.verify(lib, warn=False):
                cache.publish(lib, lib.read_bytes())  # fresh from ninja: record its hash
    return module
