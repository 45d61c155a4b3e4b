"""The C++ per-call launch path (``host/int8_gemm_launch.cpp``, ``host/recipe_launch.cpp``), built as a torch
extension.

:func:`load` takes the first of:

1. the shipped build (``<prebuilt>/host_ext/<tag>/``, :func:`prebuilt_tag`, e.g.
   ``cp312-torch2.11.0+cu130``: a compiled extension is tied to the Python ABI and the torch build),
   written by ``scripts/build_wheel.py --host-ext`` (:func:`ship`); used when its sha256 sidecars
   match and its ``meta.json`` names these sources (:func:`source_digest`) and these flags;
2. a build in the user cache (``<cache>/host_ext/<key>/``, key: source, torch, Python, flags) whose
   sha256 sidecar matches, imported directly;
3. a fresh build there with torch's extension builder (ninja and the host C++ compiler), under the
   lock ``<key>.lock``, once per key (``scripts/build_kernels.py`` builds it ahead of time).

The first two start no process (no compiler, no ninja). Step 3 is tried only when the compiler
(``$CXX`` or ``c++``) is on PATH and ninja is there or in the ninja wheel. When none works, or ``CUTLASS_OPS_HOST_EXT=0``,
:func:`load` returns None and callers keep their Python path; the reason is logged once (INFO
when there is simply nothing to load or build with, WARNING when a build or import failed).
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from . import cache
from .cache import cache_dir, content_key
from . import libcuda
from .launch import cu_launch_kernel_ex, switch_on

__all__ = ["build", "load", "enabled", "ship", "prebuilt_tag", "describe", "source_digest", "SOURCE", "SOURCES",
           "EXT_NAME"]

log = logging.getLogger(__name__)

HOST_DIR = Path(__file__).resolve().parent / "host"
SOURCE = HOST_DIR / "int8_gemm_launch.cpp"  # the module's definition (PYBIND11_MODULE)
SOURCES = (SOURCE, HOST_DIR / "recipe_launch.cpp")  # compiled
# included: part of what a build is made from
HEADERS = (HOST_DIR / "launch_config.h", HOST_DIR / "recipe_launch.h", HOST_DIR / "tensor_refs.h")
EXT_NAME = "cutlass_ops_int8_gemm_launch"  # the module name (PyInit_<name>) and the library's stem
_CFLAGS = ("-O3", "-std=c++17")
_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None
origin: str | None = None  # where the loaded module came from: "shipped <path>", "cache <path>" or "built <path>"


class _Unavailable(Exception):
    """Nothing to load and nothing to build with (not an error: the Python path is used)."""


def enabled() -> bool:
    """Whether the C++ path may be used (``CUTLASS_OPS_HOST_EXT=0`` turns it off)."""
    return switch_on("CUTLASS_OPS_HOST_EXT")


def source_digest() -> str:
    """sha256 over every source and header file of the extension (name and contents, in a fixed order)."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        data = path.read_bytes()
        digest.update(f"{path.name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _key() -> str:
    import torch

    return content_key(source_digest().encode(), torch.__version__, sys.version.split()[0], " ".join(_CFLAGS))[:16]


def prebuilt_tag() -> str:
    """The Python ABI and torch build of this process, e.g. ``cp312-torch2.11.0+cu130`` (the shipped
    build's directory name)."""
    import torch

    impl = "cp" if sys.implementation.name == "cpython" else sys.implementation.name
    abi = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""  # free-threaded builds have their own ABI
    return f"{impl}{sys.version_info[0]}{sys.version_info[1]}{abi}-torch{torch.__version__}"


def _prebuilt_dir() -> Path:
    return cache.prebuilt_root() / "host_ext" / prebuilt_tag()


def _meta() -> dict:
    """What a shipped build must have been built from to be loaded here."""
    return {"source_sha256": source_digest(), "cflags": list(_CFLAGS)}


def load() -> ModuleType | None:
    """The extension module (shipped, cached or built first), or None when it is unavailable."""
    global _module, _failed, origin
    if not enabled():
        return None
    if _module is not None:
        return _module
    with _lock:
        if _module is not None or _failed is not None:
            return _module
        try:
            module, where = _load_or_build()
            module.set_launch_function(ctypes.cast(cu_launch_kernel_ex(), ctypes.c_void_p).value)
            module.set_tensor_map_function(ctypes.cast(libcuda.function("cuTensorMapEncodeTiled"),
                                                       ctypes.c_void_p).value)
        except _Unavailable as exc:
            _failed = str(exc)
            log.info("C++ launch path unavailable, using the Python path: %s", _failed)
            return None
        except Exception as exc:  # a build or import that failed, no driver: the Python path stays
            _failed = f"{type(exc).__name__}: {exc}"
            log.warning("C++ launch path unavailable, using the Python path: %s", _failed.splitlines()[0][:300])
            return None
        _module, origin = module, where
    return _module


def _load_or_build() -> tuple[ModuleType, str]:
    shipped = _shipped_library()
    if shipped is not None:
        return _import(shipped), f"shipped {shipped}"
    cached = _cached_library()
    if cached is not None:
        return _import(cached), f"cache {cached}"
    missing = _missing_tools()
    if missing:
        raise _Unavailable(f"no shipped build for {prebuilt_tag()} and no {' or '.join(missing)} on PATH to build one")
    module = _build_and_load()
    return module, f"built {module.__file__}"


def _shipped_library() -> Path | None:
    """The shipped build for this Python and torch if it is whole and built from this source, else None."""
    directory = _prebuilt_dir()
    if not directory.is_dir():
        return None
    raw = cache.load(directory / "meta.json", readonly=True)  # warns when damaged
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        meta = None
    if meta is None:
        return None
    if {k: meta.get(k) for k in ("source_sha256", "cflags")} != _meta():
        log.info("shipped C++ launch path in %s was built from other sources: not using it", directory)
        return None
    lib = directory / f"{EXT_NAME}.so"
    return lib if cache.verify(lib, cache.looks_like_elf, readonly=True) else None


def _cached_library() -> Path | None:
    """The user cache's build for this key if present and whole (no lock, no dirs created), else None."""
    lib = cache.cache_root() / "host_ext" / _key() / f"{EXT_NAME}.so"
    return lib if cache.verify(lib, cache.looks_like_elf, warn=False) else None


def _import(path: Path) -> ModuleType:
    """Import the extension library at ``path`` (as torch's builder does after a build; torch, whose
    libraries it links against, is imported already: the tag and the key need it)."""
    spec = importlib.util.spec_from_file_location(EXT_NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ninja_dir() -> str | None:
    """The ninja wheel's binary directory (torch's builder needs ninja; a venv run without activation
    lacks it on PATH), or None."""
    try:
        import ninja
    except ImportError:
        return None
    return ninja.BIN_DIR


def _missing_tools() -> list[str]:
    """What torch's extension builder needs and neither PATH nor the ninja wheel has: the host C++
    compiler, ninja (looked up only; nothing is started)."""
    compiler = os.environ.get("CXX") or "c++"  # torch's choice on Linux
    missing = []
    if shutil.which(compiler) is None:
        missing.append(f"host C++ compiler ({compiler})")
    ninja_dir = _ninja_dir()
    if shutil.which("ninja") is None and (ninja_dir is None or shutil.which("ninja", path=ninja_dir) is None):
        missing.append("ninja")
    return missing


def describe() -> str:
    """One line for ``cutlass-ops info``: which build :func:`load` would use here (builds nothing)."""
    if not enabled():
        return "off (CUTLASS_OPS_HOST_EXT=0)"
    tag = prebuilt_tag()
    if _shipped_library() is not None:
        return f"shipped for {tag}"
    cached = _cached_library()
    if cached is not None:
        return f"cached for {tag} ({cached.parent})"
    missing = _missing_tools()
    if missing:
        return f"not shipped for {tag}, no {' or '.join(missing)}: int8_gemm uses the Python launch path"
    return f"not shipped for {tag}: built into the cache on first use (about a minute)"


def build() -> Path:
    """Build the extension into the cache (no GPU needed); the directory it is in."""
    return Path(_build_and_load().__file__).parent


def ship(prebuilt: Path, from_cache: Path | None = None) -> Path:
    """Write the extension for this Python and torch into the prebuilt tree ``prebuilt``
    (``host_ext/<tag>/``: the library, ``meta.json``, each with its sha256 sidecar); the directory.
    Takes the verified build of cache ``from_cache`` when it has this key's, else builds it into the
    current cache."""
    lib = None
    if from_cache is not None:
        candidate = Path(from_cache) / "host_ext" / _key() / f"{EXT_NAME}.so"
        if cache.verify(candidate, cache.looks_like_elf, readonly=True):
            lib = candidate
    if lib is None:
        lib = build() / f"{EXT_NAME}.so"
    import torch

    directory = Path(prebuilt) / "host_ext" / prebuilt_tag()
    meta = {**_meta(), "tag": prebuilt_tag(), "python": sys.version.split()[0], "torch": torch.__version__}
    for name, data in ((f"{EXT_NAME}.so", lib.read_bytes()), ("meta.json", json.dumps(meta, indent=1).encode())):
        cache.atomic_write(directory / name, data)
        cache.atomic_write(cache.sidecar_path(directory / name), hashlib.sha256(data).hexdigest().encode())
    return directory


def _build_and_load() -> ModuleType:
    from torch.utils import cpp_extension

    from .cuda_paths import cuda_include_dirs

    ninja_dir = _ninja_dir()
    if ninja_dir is not None and ninja_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = ninja_dir + os.pathsep + os.environ.get("PATH", "")
    directory = cache_dir("host_ext", _key())
    with cache.entry_lock(directory):  # torch's own baton is per build, not per publish-and-check
        for lib in directory.glob(f"{EXT_NAME}*.so"):
            if not cache.verify(lib, cache.looks_like_elf):
                lib.unlink()  # ninja rebuilds a missing output
        if not any(directory.glob(f"{EXT_NAME}*.so")):
            log.info("building the C++ launch path into %s (once, about a minute; scripts/build_kernels.py "
                     "builds it ahead of time)", directory)
        module = cpp_extension.load(name=EXT_NAME, sources=[str(p) for p in SOURCES], extra_cflags=list(_CFLAGS),
                                    extra_include_paths=list(cuda_include_dirs()), build_directory=str(directory),
                                    verbose=False)
        for lib in directory.glob(f"{EXT_NAME}*.so"):
            if not cache.sidecar_path(lib).is_file() or not cache.verify(lib, warn=False):
                cache.publish(lib, lib.read_bytes())  # fresh from ninja: record its hash
    return module
