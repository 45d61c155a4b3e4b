"""Compile (or fetch from the cache) a ``custom_kernels`` source for the current GPU and load it."""
from __future__ import annotations

import functools
from typing import Mapping

from custom_kernels.launcher import Kernel, Module, device_capability
from custom_kernels.nvrtc import compile_file


def target_arch(device: int | None = None) -> str:
    """The NVRTC target for ``device``: sm_90a on Hopper (wgmma-capable), else its own sm_XY."""
    cc = device_capability(device)
    return "90a" if cc == 90 else str(cc)


@functools.lru_cache(maxsize=None)
def _module(filename: str, arch: str, defines: tuple[tuple[str, object], ...]) -> Module:
    cubin = compile_file(filename, arch, defines=dict(defines))
    return Module(cubin.data, name=f"{filename}@sm_{arch}")


def load_kernel(filename: str, name: str, signature: str, defines: Mapping[str, object] | None = None,
                arch: str | None = None) -> Kernel:
    """Kernel ``name`` from ``custom_kernels/kernels/<filename>`` built for the current device."""
    arch = arch or target_arch()
    return _module(filename, arch, tuple(sorted((defines or {}).items()))).kernel(name, signature)


def on_device(device):
    """``torch.cuda.device(device)``, or a no-op when it is already current (entering the real
    context costs microseconds on every launch)."""
    import contextlib

    import torch

    index = device.index if isinstance(device, torch.device) else device
    if index is None or index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(index)
