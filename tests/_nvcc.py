"""Build a kernel file as ordinary CUDA C++ with nvcc (the compile tests' check that the sources are not
NVRTC-only)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from custom_kernels.cuda_paths import cuda_include_dirs, nvcc_path
from custom_kernels.nvrtc import KERNEL_DIR


def nvcc_build(name: str, tmp_path: Path, arch: str = "sm_80", defines: dict | None = None,
               options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """(cubin, nvcc's and ptxas's messages) of ``custom_kernels/kernels/<name>`` built for ``arch`` with ``defines``
    and extra nvcc ``options`` (an AssertionError with the messages if it fails; nvcc_path's RuntimeError if nvcc is
    not installed)."""
    out = tmp_path / (Path(name).stem + ".cubin")
    cmd = [nvcc_path(), "-std=c++17", f"-arch={arch}", "-cubin", "-o", str(out), *options, f"-I{KERNEL_DIR}",
           *[f"-I{d}" for d in cuda_include_dirs()], *[f"-D{k}={v}" for k, v in (defines or {}).items()],
           str(KERNEL_DIR / name)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return out.read_bytes(), result.stderr


def nvcc_cubin(name: str, tmp_path: Path, arch: str = "sm_80") -> bytes:
    """The cubin nvcc builds from ``custom_kernels/kernels/<name>`` for ``arch``."""
    return nvcc_build(name, tmp_path, arch)[0]
