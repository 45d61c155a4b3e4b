"""Registry of GEMM epilogues: name -> :class:`EpilogueSpec`.

Every epilogue is one plain Python function ``fn(accum, *inputs)`` that serves twice: CUTLASS's
EVT tracer reads its source to build the fused epilogue (Sm80 and Sm90 kernels), and evaluated on
float64 torch tensors it is the reference the tests compare against. Imports nothing from
``cutlass_ops`` and nothing of CUTLASS.

Input kinds (shapes for a GEMM of M rows and N columns):
    "per_row"  [M, 1] float32  (per token / per output row)
    "per_col"  [1, N] float32  (per output channel; a 1-D [N] tensor is accepted by the ops)
    "matrix"   [M, N] float32  (row-major, contiguous)
    "scalar"   a Python float passed at run time
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import dequant as _dequant
from . import kblock as _kblock
from . import plain as _plain
from . import requant as _requant

__all__ = ["EpilogueSpec", "INPUT_KINDS", "OUTPUT_DTYPES", "get", "names", "register"]

INPUT_KINDS = ("per_row", "per_col", "matrix", "scalar")
# Short element names shared with the CUTLASS build ("f16" ...) and their torch dtypes.
OUTPUT_DTYPES = {
    "s32": torch.int32,
    "s8": torch.int8,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
}


@dataclass(frozen=True)
class EpilogueSpec:
    """One epilogue: its function, the kinds of its inputs and the output types it supports."""

    name: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[str, str], ...]  # (argument name, kind) in the order of fn's arguments after accum
    output_dtypes: tuple[str, ...]  # allowed element types of D; the first is the default
    optional: frozenset[str] = field(default_factory=frozenset)  # may be None: read as 0 (null pointer)
    evt: bool = True  # False: CUTLASS LinearCombination (alpha=1, beta=0) instead of a traced EVT
    description: str = ""

    def __post_init__(self):
        params = list(inspect.signature(self.fn).parameters)
        if params[:1] != ["accum"] or params[1:] != [n for n, _ in self.inputs]:
            raise ValueError(f"epilogue {self.name}: fn arguments {params} must be accum + {[n for n, _ in self.inputs]}")
        bad = [k for _, k in self.inputs if k not in INPUT_KINDS]
        if bad:
            raise ValueError(f"epilogue {self.name}: unknown input kinds {bad}; valid: {INPUT_KINDS}")
        bad = [d for d in self.output_dtypes if d not in OUTPUT_DTYPES]
        if bad:
            raise ValueError(f"epilogue {self.name}: unknown output dtypes {bad}; valid: {sorted(OUTPUT_DTYPES)}")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.inputs)

    @property
    def tensor_inputs(self) -> tuple[tuple[str, str], ...]:
        """Inputs passed as device pointers (everything but run-time scalars)."""
        return tuple((n, k) for n, k in self.inputs if k != "scalar")

    @property
    def default_output(self) -> str:
        return self.output_dtypes[0]

    @staticmethod
    def input_shape(kind: str, M: int, N: int) -> tuple[int, ...]:
        """The 2-D shape of an input of ``kind`` for an M x N output ("scalar": ())."""
        return {"per_row": (M, 1), "per_col": (1, N), "matrix": (M, N), "scalar": ()}[kind]

    def reference(self, accum: torch.Tensor, out_dtype: str | None = None, **inputs: Any) -> torch.Tensor:
        """float64 result of the epilogue on ``accum`` [M, N], as stored in ``out_dtype``.

        Integer outputs are rounded half-to-even and saturated like the kernels' stores; float
        outputs are returned in float64 (compare with a tolerance of the output format).
        """
        out_dtype = out_dtype or self.default_output
        M, N = accum.shape
        args = []
        for name, kind in self.inputs:
            value = inputs.get(name)
            if value is None:
                if name not in self.optional:
                    raise ValueError(f"epilogue {self.name} needs input {name!r}")
                value = torch.zeros(self.input_shape(kind, M, N), dtype=torch.float64)
            if kind == "scalar":
                args.append(float(value))
            else:
                args.append(value.detach().to("cpu", torch.float64).reshape(self.input_shape(kind, M, N)))
        out = self.fn(accum.detach().to("cpu", torch.float64), *args)
        if out_dtype in ("s8", "s32"):
            info = torch.iinfo(OUTPUT_DTYPES[out_dtype])
            out = torch.round(out).clamp(info.min, info.max)  # torch.round: half to even
        return out


_REGISTRY: dict[str, EpilogueSpec] = {}


def register(spec: EpilogueSpec) -> EpilogueSpec:
    if spec.name in _REGISTRY:
        raise ValueError(f"epilogue {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> EpilogueSpec:
    """The epilogue registered as ``name``; ValueError listing the registered names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown epilogue {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def names() -> list[str]:
    return sorted(_REGISTRY)


register(EpilogueSpec(
    "none", _plain.none, (), ("s32",), evt=False,
    description="D = accum (int32)"))

_DEQUANT_INPUTS = (("scale_row", "per_row"), ("scale_col", "per_col"), ("bias", "per_col"))
for _fn, _what in ((_dequant.dequant, ""), (_dequant.dequant_relu, ", then relu"),
                   (_dequant.dequant_relu6, ", then clamp to [0, 6]")):
    register(EpilogueSpec(
        _fn.__name__, _fn, _DEQUANT_INPUTS, ("f16", "bf16", "f32"), optional=frozenset({"bias"}),
        description=f"D = accum * scale_row * scale_col + bias{_what}"))

register(EpilogueSpec(
    "requant", _requant.requant, (("multiplier", "per_col"), ("fused_bias", "per_col")), ("s8",),
    optional=frozenset({"fused_bias"}),
    description="D = saturate_s8(round(multiplier * (accum + fused_bias)))"))
register(EpilogueSpec(
    "requant_clamp", _requant.requant_clamp,
    (("multiplier", "per_col"), ("fused_bias", "per_col"), ("lo", "scalar"), ("hi", "scalar")), ("s8",),
    optional=frozenset({"fused_bias"}),
    description="D = clamp(round(multiplier * (accum + fused_bias)), lo, hi) as int8"))

register(EpilogueSpec(
    "kblock_accumulate", _kblock.kblock_accumulate,
    (("C", "matrix"), ("r1", "per_row"), ("c1", "per_col"), ("r2", "per_row"), ("c2", "per_col"),
     ("r3", "per_row"), ("c3", "per_col")), ("f32",),
    description="D = C + accum * r1 * c1 + r2 * c2 + r3 * c3 (one K block of scheme 2)"))
