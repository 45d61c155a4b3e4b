"""Recipes: one problem's launches recorded once and replayed per call by the C++ extension
(``host/recipe_launch.cpp``), with the addresses known only per call patched in.

An eager call of a quantized layer through Python costs tens of microseconds of host time (checks, plan
lookups, allocations, ctypes launches) where the GPU work of a decode step takes a few. A family whose
call is a fixed sequence of NVRTC launches for a given (weight, device, x dtype, M, K, activation, bias or
not) records that sequence as a :class:`Recipe`: each :class:`Step` is a launch shape and a packed
argument block, built by the same plan objects and field values its Python path uses, except that an
address of x, the output, the bias or the call's workspace is an :class:`At` (and a TMA map of one a
:class:`MapOf`), written by C++ per call. ``run_recipe`` then checks x, allocates the output and one
workspace, patches and launches in one call, or returns None for anything it was not registered for
(the caller's Python path runs instead, raises the precise error or registers).

Families: :mod:`cutlass_ops.recipes` (the weight-only GEMV plans, the per-K-block and block-scaled W8A8 layers).
"""
from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, field
from typing import Any

from .launch import KernelArgs, Launch, Ptr, TensorMap

__all__ = ["Source", "At", "MapOf", "X", "OUT", "BIAS", "WORKSPACE", "Step", "Recipe", "step_of"]


class Source(enum.IntEnum):
    """Where a patched address comes from (``recipe_launch.cpp``'s Source)."""

    X = 0          # the call's input (contiguous, 16-byte aligned)
    OUT = 1        # the output C++ allocates, [..., N] in x's dtype
    BIAS = 2       # the caller's float32 bias copy, or 0 when the recipe has none
    WORKSPACE = 3  # one fresh byte buffer of Recipe.workspace_bytes


@dataclass(frozen=True)
class At:
    """A device address known only per call: ``offset`` bytes past a :class:`Source`'s start."""

    source: Source
    offset: int = 0

    def __add__(self, offset: int) -> "At":
        return At(self.source, self.offset + int(offset))


X, OUT, BIAS, WORKSPACE = (At(s) for s in Source)


@dataclass(frozen=True)
class MapOf:
    """A TMA map argument (``cutlass_ops.w8a8.tma.tensor_map_2d``'s encoding) of the int8 row-major
    [rows, cols] matrix at ``address`` (an :class:`At`), read in [box_rows, box_cols] boxes."""

    address: At
    rows: int
    cols: int
    box_rows: int
    box_cols: int


@dataclass
class Step:
    """One launch: function handle, shape, PDL, the argument block's bytes and each parameter's offset in
    it, the pointer patches (offset, source, addend) and the tensor-map patches (offset, source, addend,
    rows, cols, box_rows, box_cols)."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    cluster: tuple[int, int, int]
    pdl: bool
    params: bytes
    offsets: list[int]
    patches: list[tuple[int, int, int]] = field(default_factory=list)
    maps: list[tuple[int, int, int, int, int, int, int]] = field(default_factory=list)

    def as_tuple(self) -> tuple:
        return (self.function, list(self.grid), list(self.block), self.smem, list(self.cluster), self.pdl,
                self.params, self.offsets, self.patches, self.maps)


def step_of(launch: Launch, **fields: Any) -> Step:
    """The :class:`Step` of ``launch`` (a :class:`~custom_kernels.launch.Launch` over a KernelArgs block) with
    ``fields`` written into a copy of its argument block: ints as they are, :class:`At` as pointer patches,
    :class:`MapOf` as tensor-map patches (the launch itself and its block are left untouched)."""
    if not isinstance(launch.args, KernelArgs):
        raise TypeError(f"a recipe step needs a KernelArgs argument block, got {type(launch.args).__name__}")
    args_type = type(launch.args)
    args = args_type.from_buffer_copy(launch.args)
    patches, maps = [], []
    for name, value in fields.items():
        kind = dict(args_type._fields_).get(name)
        if kind is None:
            raise AttributeError(f"{args_type.__name__} has no field {name!r}")
        offset = getattr(args_type, name).offset
        if isinstance(value, At):
            if kind is not Ptr:
                raise TypeError(f"{args_type.__name__}.{name} is not a pointer: it cannot take a per-call address")
            patches.append((offset, int(value.source), value.offset))
            setattr(args, name, 0)
        elif isinstance(value, MapOf):
            if kind is not TensorMap:
                raise TypeError(f"{args_type.__name__}.{name} is not a tensor map")
            maps.append((offset, int(value.address.source), value.address.offset, value.rows, value.cols,
                         value.box_rows, value.box_cols))
        else:
            setattr(args, name, value)
    shape = launch.shape
    offsets = [getattr(args_type, f[0]).offset for f in args_type._fields_]
    return Step(int(shape.function), shape.grid, shape.block, shape.smem, shape.cluster, shape.pdl,
                bytes(ctypes.string_at(ctypes.addressof(args), ctypes.sizeof(args))), offsets, patches, maps)


@dataclass
class Recipe:
    """One problem's steps, the output's N, the workspace's bytes, the tensors the steps point at (held
    weakly by C++ and checked at every call: the call goes back to Python once one is gone or changed in
    place) and the bias's dtype as the kernels read it."""

    steps: list[Step]
    N: int
    workspace_bytes: int = 0
    keep: tuple = ()
    bias_dtype: Any = None  # the dtype the kernels read the bias as (a torch.dtype; None: x's)
