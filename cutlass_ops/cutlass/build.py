"""Ahead-of-time build of CUTLASS int8 GEMM kernels into the content-addressed cache (no GPU needed).

:func:`build` emits a spec's sources (:mod:`.emit`), compiles the device cubin and the host library
with nvcc for an explicit target and stores them in a directory under ``cache_dir("cutlass")``:

    kernels/<name>-<key>/kernel.cubin   device code, loaded with custom_kernels.launch.Module
    kernels/<name>-<key>/host.so        <kernel>_get_param_size, ..., <kernel>_cutlass_ops_params
    kernels/<name>-<key>/meta.json      kernel name, param/smem size, block, cluster, argument layout
    kernels/<name>-<key>/build.log      the nvcc commands and their output
    index/<spec-key>.json               spec -> kernel directory (lookups need no CUTLASS import)

A kernel directory is built under the lock ``kernels/<name>-<key>.lock`` (re-checked once held, so
concurrent processes build it once); ``kernel.cubin``, ``host.so`` and ``meta.json`` each have a
``.sha256`` sidecar, checked on the first load in a process (:mod:`custom_kernels.cache`): a
mismatch rebuilds the directory with a warning. Directories built before sidecars existed are
adopted (cubin and host library checked to be whole ELF files, meta to parse), not rebuilt.

The key of a kernel directory (:func:`content_key_of`) covers the emitted sources, the nvcc flags,
the nvcc version and the target arch. The meta's argument layout (:mod:`.arguments`) lets
:mod:`.kernel` fill the ``Arguments`` struct at run time without the interface.

:func:`lookup` first consults the shipped kernels (``cutlass/index`` and ``cutlass/kernels`` under
:func:`custom_kernels.cache.prebuilt_root`, same layout, sidecars required, never written), then
the user cache; a kernel found in neither is emitted and compiled, which needs the ``cutlass``
extra (``pip install cutlass-ops[cutlass]``) and nvcc; loading a built one needs neither.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import epilogues
from custom_kernels import cache
from custom_kernels.cache import atomic_write, cache_dir, content_key
from custom_kernels.cuda_paths import nvcc_path

from .arguments import argument_layout
from .emit import EXAMPLE_K, EXAMPLE_M, EXAMPLE_N, CutlassBuildError, EmittedGemm, emit
from .spec import BUILD_FORMAT, GemmKernelSpec

log = logging.getLogger(__name__)

__all__ = ["GemmArtifact", "CutlassBuildError", "build", "lookup", "content_key_of", "COMMON_FLAGS", "HOST_FLAGS"]

COMMON_FLAGS = (
    "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",
    "-Xcudafe", "--diag_suppress=esa_on_defaulted_function_ignored",
)
# The host library links libcudart dynamically (40 KB instead of 1 MB per kernel); at load time
# the soname resolves to the libcudart.so.13 that torch has already loaded (see kernel.py).
HOST_FLAGS = ("-x", "cu", "-Xcompiler=-fPIC", "-Xcompiler=-fpermissive", "-Xcompiler=-w",
              "-shared", "-cudart", "shared", "-Xlinker", "-s")


@dataclass(frozen=True)
class GemmArtifact:
    """A built kernel on disk."""

    directory: Path
    meta: dict

    @property
    def cubin_path(self) -> Path:
        return self.directory / "kernel.cubin"

    @property
    def host_path(self) -> Path:
        return self.directory / "host.so"

    @classmethod
    def load(cls, directory: Path, warn: bool = True, readonly: bool = False) -> "GemmArtifact | None":
        """The artifact in ``directory`` if it is complete and every file matches its sha256, else None
        (``readonly``: a shipped kernel, see :func:`custom_kernels.cache.load`)."""
        meta_bytes = cache.load(directory / "meta.json", _parses_as_json, warn=warn, readonly=readonly)
        if meta_bytes is None:
            return None
        art = cls(directory, json.loads(meta_bytes))
        if not (cache.verify(art.cubin_path, cache.looks_like_elf, warn=warn, readonly=readonly)
                and cache.verify(art.host_path, cache.looks_like_elf, warn=warn, readonly=readonly)):
            return None
        return art


def _parses_as_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _indexed_directory(root: Path, index_key: str) -> Path | None:
    """The kernel directory ``root/cutlass/index/<index_key>.json`` names, or None if absent or damaged."""
    try:
        name = json.loads((root / "cutlass" / "index" / f"{index_key}.json").read_bytes())["directory"]
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        return None  # an index entry names a directory beside the others, nothing else
    return root / "cutlass" / "kernels" / name


def lookup(spec: GemmKernelSpec) -> GemmArtifact | None:
    """The built kernel of ``spec``: shipped (prebuilt tree), else from the user cache's index, else
    None. Imports no CUTLASS, runs no nvcc."""
    index_key = spec.index_key()
    shipped = _indexed_directory(cache.prebuilt_root(), index_key)
    if shipped is not None:
        art = GemmArtifact.load(shipped, readonly=True)  # warns if damaged: then the user cache / a build
        if art is not None:
            return art
    cache_dir("cutlass", "index")
    directory = _indexed_directory(cache.cache_root(), index_key)  # absent or damaged: build() rewrites it
    return None if directory is None else GemmArtifact.load(directory, warn=False)  # build() warns under its lock


def _require_emission() -> None:
    """Raise a clear error when a kernel must be emitted but the ``cutlass`` extra is not installed."""
    if importlib.util.find_spec("cutlass_cppgen") is None or importlib.util.find_spec("cutlass_library") is None:
        raise CutlassBuildError("this CUTLASS kernel is neither shipped nor cached, and building it needs "
                                "nvidia-cutlass: install cutlass-ops[cutlass] to build new CUTLASS kernels")


def _gencode(target_arch: str) -> str:
    return f"-gencode=arch=compute_{target_arch},code=sm_{target_arch}"


def _commands(spec: GemmKernelSpec, workdir: Path) -> tuple[list[str], list[str]]:
    from . import bridge

    includes = [f"-I{d}" for d in bridge.include_dirs()]
    nvcc = nvcc_path()
    device = [nvcc, *COMMON_FLAGS, *spec.device_flags, *includes, _gencode(spec.target_arch), "-cubin",
              "-o", str(workdir / "kernel.cubin"), str(workdir / "device.cu")]
    host = [nvcc, *COMMON_FLAGS, *HOST_FLAGS, *includes, _gencode(spec.target_arch),
            "-o", str(workdir / "host.so"), str(workdir / "host.cu")]
    return device, host


def _flags_text(spec: GemmKernelSpec) -> str:
    # Include directories are machine paths: kept out of the key so a carried cache still hits.
    return " ".join([*COMMON_FLAGS, *spec.device_flags, "|", *HOST_FLAGS, "|", _gencode(spec.target_arch)])


def content_key_of(spec: GemmKernelSpec, emitted: EmittedGemm) -> str:
    """The key of the kernel directory built from ``emitted``: sources, flags, nvcc version, target."""
    from . import bridge

    return content_key(emitted.device_source, emitted.host_source, _flags_text(spec), bridge.nvcc_version(),
                       spec.target_arch)


def _run_nvcc(commands: list[list[str]], workdir: Path) -> list[tuple[list[str], int, str, float]]:
    """Run the nvcc commands concurrently in ``workdir``; (command, returncode, output, seconds) each."""

    def run(cmd: list[str]) -> tuple[list[str], int, str, float]:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return cmd, proc.returncode, proc.stdout, time.perf_counter() - t0

    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(run, commands))


def _query_host_library(path: Path, kernel_name: str, api: str) -> dict[str, Any]:
    """Param size, shared memory, block shape and epilogue kind from the freshly built host library."""
    lib = ctypes.CDLL(str(path))
    get = lambda suffix, restype: _function(lib, f"{kernel_name}_{suffix}", restype)  # noqa: E731
    info: dict[str, Any] = {
        "param_size": int(get("get_param_size", ctypes.c_int)()),
        "smem_bytes": int(get("shared_memory_size", ctypes.c_int)()),
    }
    if api == "3x":
        info["uses_default_epilogue"] = bool(get("uses_default_epilogue", ctypes.c_bool)())
        dim3 = type("dim3", (ctypes.Structure,), {"_fields_": [("x", ctypes.c_int), ("y", ctypes.c_int), ("z", ctypes.c_int)]})
        block = get("get_block_shape", dim3)()
        info["block"] = [block.x, block.y, block.z]
    return info


def _function(lib, name: str, restype):
    fn = getattr(lib, name)
    fn.restype = restype
    return fn


def build(spec: GemmKernelSpec, *, force: bool = False) -> tuple[GemmArtifact, bool]:
    """Emit and compile ``spec`` into the cache; returns (artifact, cache_hit). No GPU needed."""
    if not force:
        found = lookup(spec)
        if found is not None:
            return found, True
    _require_emission()
    log.info("not in the shipped kernels: compiling %s", spec.name)
    t0 = time.perf_counter()
    emitted = emit(spec)
    key = content_key_of(spec, emitted)
    directory = cache_dir("cutlass", "kernels") / f"{spec.name}-{key[:16]}"
    with cache.entry_lock(directory):  # one build per directory across processes and threads
        artifact = None if force else GemmArtifact.load(directory)
        hit = artifact is not None
        if artifact is None:
            artifact = _compile(spec, emitted, directory, key, t0)
        index_entry = {"directory": directory.name, "spec": spec.to_dict(), "kernel_name": emitted.kernel_name}
        atomic_write(cache_dir("cutlass", "index") / f"{spec.index_key()}.json",
                     json.dumps(index_entry, indent=1).encode())
    return artifact, hit


def _compile(spec: GemmKernelSpec, emitted: EmittedGemm, directory: Path, key: str, t0: float) -> GemmArtifact:
    from . import bridge

    workdir = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=cache_dir("cutlass", "tmp")))
    try:
        (workdir / "device.cu").write_text(emitted.device_source)
        (workdir / "host.cu").write_text(emitted.host_source)
        device_cmd, host_cmd = _commands(spec, workdir)
        results = _run_nvcc([device_cmd, host_cmd], workdir)
        build_log = "".join(f"$ {' '.join(cmd)}\n[exit {rc}, {secs:.1f} s]\n{out}\n" for cmd, rc, out, secs in results)
        failed = [r for r in results if r[1] != 0]
        if failed:
            log_path = cache_dir("cutlass", "failed") / f"{spec.name}-{key[:16]}.log"
            atomic_write(log_path, (build_log + "\n// device.cu\n" + emitted.device_source).encode())
            outputs = "\n".join(out for _, _, out, _ in failed)
            raise CutlassBuildError(f"nvcc failed to build {spec.name} (log: {log_path}):\n{outputs}")
        info = _query_host_library(workdir / "host.so", emitted.kernel_name, spec.api)
        layout = argument_layout(emitted, info.get("uses_default_epilogue"), (EXAMPLE_M, EXAMPLE_N, EXAMPLE_K))
        epi = epilogues.get(spec.epilogue)
        meta = {
            "format": BUILD_FORMAT,
            "spec": spec.to_dict(),
            "kernel_name": emitted.kernel_name,
            "api": spec.api,
            "target_arch": spec.target_arch,
            "cluster": list(spec.cluster_shape) if spec.api == "3x" else [1, 1, 1],
            # launchable with programmatic dependent launch (it waits on the previous grid itself)
            "grid_dependency_control": bool(spec.device_flags),
            "pointers": ["A", "B", "C", "D", *[n for n, k in epi.inputs if k != "scalar" and n != "C"]],
            "scalars": [n for n, k in epi.inputs if k == "scalar"],
            "arguments": layout,
            "nvcc_version": bridge.nvcc_version(),
            "interface_version": bridge.interface_version(),
            "content_key": key,
            "build_seconds": round(time.perf_counter() - t0, 2),
            **info,
        }
        cache_dir("cutlass", "kernels", directory.name)
        cache.publish(directory / "kernel.cubin", (workdir / "kernel.cubin").read_bytes())
        cache.publish(directory / "host.so", (workdir / "host.so").read_bytes())
        atomic_write(directory / "build.log", build_log.encode())
        atomic_write(directory / "device.cu", emitted.device_source.encode())
        cache.publish(directory / "meta.json", json.dumps(meta, indent=1).encode())  # last: marks completion
        log.info("built %s in %.1f s", spec.name, meta["build_seconds"])
        cache.log.info("built %s", directory.name)
        return GemmArtifact(directory, meta)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
