"""Raw CUDA kernels (``kernels/*.cu``), their NVRTC compiler and the launcher.

Imports nothing from ``cutlass_ops``; the compiler needs no GPU.
"""
from .cache import ENV_VAR as CACHE_ENV_VAR, cache_dir, cache_root
from .nvrtc import Cubin, KernelCompileError, compile_file, compile_source, kernel_sources, nvrtc_version

__all__ = [
    "CACHE_ENV_VAR",
    "Cubin",
    "KernelCompileError",
    "cache_dir",
    "cache_root",
    "compile_file",
    "compile_source",
    "kernel_sources",
    "nvrtc_version",
]
