"""Raw CUDA kernels and the host runtime every kernel family of ``cutlass_ops`` shares.

- ``kernels/*.cu`` / ``*.cuh``: the CUDA sources, one strategy per ``.cu`` file;
- :mod:`.nvrtc`: compile a source to a cubin (no GPU needed), cached by content;
- :mod:`.cache`: the content-addressed on-disk cache (locked, hashed) of every compiled artefact;
- :mod:`.device`: what the runtime asks of a GPU (context, capability, SM count, current stream);
- :mod:`.launch`: the one launcher (modules, kernels, argument blocks, plain / cluster / PDL launches);
- :mod:`.host_ext` and ``host/``: the optional C++ per-call path of the CUTLASS GEMMs.

Imports nothing from ``cutlass_ops``.
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
