"""Where the CUDA toolkit's headers and tools are: cuda-pathfinder first, then CUDA_HOME."""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path


@functools.lru_cache(maxsize=None)
def cuda_home() -> Path | None:
    """CUDA_HOME / CUDA_PATH, else the directory above ``nvcc`` on PATH, else /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if default.exists() else None


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[str, ...]:
    """Include directories holding cuda_fp16.h and the CCCL headers (libcu++), in search order."""
    dirs: list[str] = []
    try:
        from cuda import pathfinder

        for lib in ("cudart", "cccl"):
            try:
                found = pathfinder.find_nvidia_header_directory(lib)
            except Exception:  # pathfinder raises its own types for "not found"
                found = None
            if found and found not in dirs:
                dirs.append(found)
    except ImportError:
        pass
    home = cuda_home()
    if home is not None:
        for sub in ("include", "include/cccl"):
            p = home / sub
            if p.is_dir() and str(p) not in dirs:
                dirs.append(str(p))
    return tuple(dirs)


def nvcc_path() -> str:
    """Path of nvcc; raises RuntimeError naming CUDA_HOME when there is none."""
    home = cuda_home()
    if home is not None and (home / "bin" / "nvcc").exists():
        return str(home / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    raise RuntimeError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
