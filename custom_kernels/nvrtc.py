"""Compile ``.cu`` sources to cubin with NVRTC (cuda.bindings.nvrtc), cached by content.

The cache key covers the source, every project header in ``kernels/``, the options, the
NVRTC version and the target architecture; cubins are built once under the entry's file lock and
published with a sha256 sidecar under ``cache_root()/nvrtc`` (:func:`custom_kernels.cache.get_or_build`:
a corrupted cubin is rebuilt, never loaded). No GPU is needed: cubins for sm_75/80/90 build on a
CPU machine.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .cache import cache_dir, content_key, get_or_build, looks_like_elf
from .cuda_paths import cuda_include_dirs

log = logging.getLogger(__name__)

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
BASE_OPTIONS = ("-std=c++17", "--device-as-default-execution-space")


class KernelCompileError(RuntimeError):
    """NVRTC rejected a source; the message holds NVRTC's log."""


@dataclass(frozen=True)
class Cubin:
    name: str  # source file name, for messages
    arch: str  # "75", "80", "90", "90a"
    data: bytes
    path: Path
    from_cache: bool


def _nvrtc():
    """cuda.bindings.nvrtc, imported when NVRTC is first needed: with it come cuda.pathfinder and the
    library's dlopen (tens of ms in a fresh process), which a cached cubin does not need."""
    from cuda.bindings import nvrtc
    return nvrtc


def _check(result, what: str):
    """Unpack a cuda.bindings.nvrtc return tuple, raising on anything but NVRTC_SUCCESS."""
    nvrtc = _nvrtc()
    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise KernelCompileError(f"{what} failed: {msg.decode() if msg else err}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


VERSION_STAMP = "version.json"  # in cache_dir("nvrtc"): NVRTC's version and the library it came from
# The same name in the prebuilt tree's nvrtc/: the NVRTC the shipped cubins were built with, and the pip
# distribution that held it (scripts/build_wheel.py writes it with :func:`shipped_version_record`).


def _environment() -> list[str]:
    """What decides which libnvrtc cuda.pathfinder finds (besides the files themselves). The cuda-bindings
    version comes from its metadata: importing cuda.bindings is what a process with cached cubins avoids."""
    import importlib.metadata

    try:
        bindings = importlib.metadata.version("cuda-bindings")  # = cuda.bindings.__version__
    except importlib.metadata.PackageNotFoundError:
        bindings = ""
    return [bindings, os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""),
            os.environ.get("LD_LIBRARY_PATH", ""), os.path.realpath(sys.prefix)]


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor), part of every cubin's cache key.

    Asking NVRTC costs tens of ms in a fresh process, so the answer is kept in the cache with the
    library's path, size and mtime and the environment that chose it, and reused while all of them are
    unchanged: a process whose kernels are all cached (or shipped) never loads NVRTC."""
    stamp = cache_dir("nvrtc") / VERSION_STAMP
    try:
        record = json.loads(stamp.read_text())
        st = os.stat(record["library"])
        if record["stat"] == [st.st_size, st.st_mtime_ns] and record["environment"] == _environment():
            return tuple(record["version"])  # type: ignore[return-value]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no stamp yet, or stale
    shipped = _shipped_version()
    if shipped is not None:  # a fresh cache beside a wheel's kernels: no NVRTC load, no stamp to write
        return shipped
    version = tuple(_check(_nvrtc().nvrtcVersion(), "nvrtcVersion"))
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        library = load_nvidia_dynamic_lib("nvrtc").abs_path  # the one cuda.bindings loaded (memoized)
        st = os.stat(library)
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": list(version), "library": library,
                                   "stat": [st.st_size, st.st_mtime_ns], "environment": _environment()}))
        os.replace(tmp, stamp)  # atomic: a concurrent reader sees the old stamp or the new one
    except Exception as exc:  # noqa: BLE001  (the stamp only saves time: never fail a compile over it)
        log.debug("NVRTC version stamp not written: %s", exc)
    return version  # type: ignore[return-value]


def _shipped_version() -> tuple[int, int] | None:
    """The shipped cubins' NVRTC version, if the pip distribution that held that NVRTC is installed here at
    the same version (cuda.pathfinder looks in site-packages first, so that is the libnvrtc it would load):
    a metadata lookup instead of importing cuda.pathfinder and loading the library."""
    import importlib.metadata

    from .cache import prebuilt_root

    try:
        record = json.loads((prebuilt_root() / "nvrtc" / VERSION_STAMP).read_text())
        dist = record["distribution"]
        if dist and importlib.metadata.version(dist["name"]) == dist["version"]:
            return tuple(record["version"])  # type: ignore[return-value]
    except (OSError, ValueError, KeyError, TypeError, importlib.metadata.PackageNotFoundError):
        pass
    return None


def nvrtc_distribution() -> dict[str, str] | None:
    """{"name", "version"} of the pip distribution whose libnvrtc cuda.bindings loaded, or None (a toolkit's)."""
    import importlib.metadata

    from cuda.pathfinder import load_nvidia_dynamic_lib

    _nvrtc().nvrtcVersion()  # loads the library (cuda.bindings finds it through cuda.pathfinder)
    library = os.path.realpath(load_nvidia_dynamic_lib("nvrtc").abs_path)
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] or ""
        if "nvrtc" not in name.lower():
            continue
        for f in dist.files or ():
            if f.name == os.path.basename(library) and os.path.realpath(dist.locate_file(f)) == library:
                return {"name": name, "version": dist.version}
    return None


def shipped_version_record() -> dict:
    """What the prebuilt tree records next to its cubins: this NVRTC's version and pip distribution."""
    return {"version": list(nvrtc_version()), "distribution": nvrtc_distribution()}


def normalize_arch(arch: int | str) -> str:
    """75 / "sm_80" / "90a" -> "75" / "80" / "90a"; rejects anything else with a ValueError."""
    text = str(arch).lower().removeprefix("sm_").removeprefix("compute_")
    digits = text.rstrip("a")
    if not digits.isdigit() or len(text) - len(digits) > 1 or int(digits) < 75:
        raise ValueError(f"arch must be a compute capability >= 75 such as 80 or '90a', got {arch!r}")
    return text


@functools.lru_cache(maxsize=1)
def _project_headers_digest() -> str:
    parts: list[bytes] = []
    for header in sorted(KERNEL_DIR.glob("*.cuh")):
        parts += [header.name.encode(), header.read_bytes()]
    return content_key(*parts)


def _build_options(arch: str, defines: Mapping[str, object], options: Iterable[str],
                   include_dirs: Iterable[str] = ()) -> list[str]:
    opts = list(BASE_OPTIONS)
    opts.append(f"--gpu-architecture=sm_{arch}")
    opts += [f"-I{d}" for d in include_dirs]
    opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    opts += list(options)
    return opts


def compile_source(
    source: str,
    arch: int | str,
    *,
    name: str = "kernel.cu",
    defines: Mapping[str, object] | None = None,
    options: Iterable[str] = (),
    use_cache: bool = True,
) -> Cubin:
    """Compile CUDA C++ ``source`` to a cubin for ``arch``; returns the cached one if present."""
    arch = normalize_arch(arch)
    # Include dirs are machine paths; keep them out of the key so carried caches still hit. They are
    # looked up only to compile: the toolkit search (cuda-pathfinder may start a probe process) stays
    # off the path of a shipped or cached cubin.
    key_opts = [o for o in _build_options(arch, defines or {}, options) if not o.startswith("-I")]
    key = content_key(source, _project_headers_digest(), "\0".join(key_opts), repr(nvrtc_version()), arch)
    path = cache_dir("nvrtc") / f"{Path(name).stem}-sm{arch}-{key[:24]}.cubin"

    def build() -> bytes:
        opts = _build_options(arch, defines or {}, options, (str(KERNEL_DIR), *cuda_include_dirs()))
        return _compile(source, name, arch, opts, key_opts)

    data, from_cache = get_or_build(path, build, looks_like_elf,
                                    force=not use_cache)
    return Cubin(name, arch, data, path, from_cache)


def _compile(source: str, name: str, arch: str, opts: list[str], key_opts: list[str]) -> bytes:
    """One NVRTC compilation to a cubin (no cache)."""
    t0 = time.perf_counter()
    nvrtc = _nvrtc()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        encoded = [o.encode() for o in opts]
        err, = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # A fresh mutable buffer: b" " * 1 is CPython's shared b" " object, which NVRTC would overwrite
        # with "\0" (breaking every later f-string compiled on Python 3.12+).
        buf = bytearray(size)
        _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        build_log = bytes(buf).decode(errors="replace").rstrip("\x00").strip()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(
                f"NVRTC failed to compile {name} for sm_{arch}:\n{build_log}\noptions: {' '.join(key_opts)}"
            )
        if build_log:
            log.debug("NVRTC log for %s (sm_%s):\n%s", name, arch, build_log)
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        data = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, data), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    log.info("compiled %s for sm_%s in %.2f s", name, arch, time.perf_counter() - t0)
    return bytes(data)


def kernel_path(filename: str) -> Path:
    path = KERNEL_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {filename!r} in {KERNEL_DIR}")
    return path


def compile_file(
    filename: str,
    arch: int | str,
    *,
    defines: Mapping[str, object] | None = None,
    options: Iterable[str] = (),
    use_cache: bool = True,
) -> Cubin:
    """Compile ``custom_kernels/kernels/<filename>`` for ``arch``."""
    path = kernel_path(filename)
    return compile_source(path.read_text(), arch, name=path.name, defines=defines, options=options,
                          use_cache=use_cache)


def kernel_sources() -> list[str]:
    """Every ``.cu`` file shipped in ``custom_kernels/kernels``."""
    return sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
