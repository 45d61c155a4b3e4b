"""What the scheme-2 kernels' Python side shares: dtype tags, row checks, and launches per grid.

The helper kernels (QuantA, SumBq, DequantAndAcc, BiasAndActivation) and the fused GEMM take a
grid that follows M, so each keeps one :class:`~custom_kernels.launch.Launch` per grid seen
(:class:`GridLaunches`, bounded); a call writes every per-call field of its argument block.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from cutlass_ops._validate import check_cuda, check_dtype, check_ndim
from custom_kernels.device import current_device
from custom_kernels.launch import Kernel, KernelArgs, Launch, LaunchConfig, load_kernel

__all__ = ["TAGS", "GridLaunches", "grid_launches", "device_index", "rows", "param_column"]

TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class GridLaunches:
    """A kernel's launches on one device with a fixed block and shared memory, one per grid
    (each with its own argument block, ``fixed`` fields written at its creation), the oldest
    dropped past ``kept`` grids."""

    def __init__(self, kernel: Kernel, args_type: type[KernelArgs], block, device: int, smem: int = 0,
                 kept: int = 64, fixed: dict[str, Any] | None = None):
        self.kernel, self.args_type, self.block, self.device, self.smem = kernel, args_type, block, device, smem
        self.kept = kept
        self.fixed = dict(fixed or {})  # fields written once into every argument block (a plan's constants)
        self._launches: dict[Any, Launch] = {}

    def launch_for(self, grid) -> Launch:
        launch = self._launches.get(grid)
        if launch is None:
            launch = Launch(self.kernel, LaunchConfig.of(grid, self.block, self.smem), self.args_type(**self.fixed),
                            self.device)
            if len(self._launches) >= self.kept:
                self._launches.pop(next(iter(self._launches)))
            self._launches[grid] = launch
        return launch

    def __call__(self, grid, **fields: Any) -> None:
        """Launch on ``grid`` (an int or a tuple) with the named argument fields written first."""
        (self._launches.get(grid) or self.launch_for(grid))(**fields)


@functools.lru_cache(maxsize=None)
def grid_launches(source: str, name: str, args_type: type[KernelArgs], block, device: int,
                  defines: tuple[tuple[str, int], ...] = (), arch: str | None = None, smem: int = 0) -> GridLaunches:
    """The :class:`GridLaunches` of kernel ``name`` of ``source`` on ``device`` (made once)."""
    kernel = load_kernel(source, name, dict(defines), arch=arch, device=device)
    if smem > 48 * 1024:
        kernel.set_max_dynamic_smem(smem)
    return GridLaunches(kernel, args_type, block, device, smem)


def device_index(t: torch.Tensor) -> int:
    index = t.device.index
    return current_device() if index is None else index


def rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """ValueError unless ``t`` is 2-D with a contiguous last dimension (rows may be strided)."""
    check_ndim(t, name, 2)
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    return t


def param_column(t: torch.Tensor, name: str, rows_: int, column: int, dtype: torch.dtype) -> tuple[int, int]:
    """(address of t[0, column] or t[0], row stride) of a per-row parameter: [rows] or [rows, G]."""
    check_dtype(t, name, (dtype,))
    check_cuda(t, name)
    if t.dim() == 1:
        if t.shape[0] != rows_:
            raise ValueError(f"{name} must have {rows_} rows, got shape {tuple(t.shape)}")
        return t.data_ptr(), t.stride(0)
    check_ndim(t, name, 2)
    if t.shape[0] != rows_ or not 0 <= column < t.shape[1]:
        raise ValueError(f"{name} [{rows_}, G] has no column {column}: shape {tuple(t.shape)}")
    return t.data_ptr() + column * t.stride(1) * t.element_size(), t.stride(0)
