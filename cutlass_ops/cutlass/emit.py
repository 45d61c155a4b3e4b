"""Emission of a :class:`GemmKernelSpec`'s device and host sources through the interface.

The way the interface's ``compiler.emit_compile_`` does it: ``operation.emit()`` plus the
interface's ``KernelTemplate`` (device) and ``HostTemplate`` (host), each after its includes; the
host source then gets our entry points, ``templates/host_entry_points.cpp`` with the 2.x or 3.x
``build_params_*`` and ``workspace_size_*`` spliced in. The emitted text is part of every kernel's
build-cache key (:mod:`cutlass_ops.cutlass.build`): the templates are emitted verbatim below their
``// @template`` marker line.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import epilogues

from .spec import GemmKernelSpec

__all__ = ["EmittedGemm", "emit", "template", "host_entry_points", "CutlassBuildError",
           "EXAMPLE_M", "EXAMPLE_N", "EXAMPLE_K"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
_MARKER = "// @template\n"
# Example problem used to trace EVT epilogues and to lay out the Arguments template. Its strides
# must not be 0 or 1 (the interface turns those into compile-time constants).
EXAMPLE_M, EXAMPLE_N, EXAMPLE_K = 384, 640, 256
# Headers the host library needs before the interface's own includes.
_HOST_INCLUDES = ("builtin_types.h", "device_launch_parameters.h", "cstddef")


class CutlassBuildError(RuntimeError):
    """Emission or nvcc compilation of a CUTLASS kernel failed; the message holds nvcc's output."""


@dataclass
class EmittedGemm:
    spec: GemmKernelSpec
    operation: Any  # cutlass_cppgen.backend.GemmOperationUniversal
    kernel_name: str
    device_source: str
    host_source: str


@functools.lru_cache(maxsize=None)
def template(name: str) -> str:
    """The text of ``templates/<name>`` below its ``// @template`` line (the header documents it)."""
    text = (TEMPLATES / name).read_text()
    at = text.find(_MARKER)
    if at < 0:
        raise ValueError(f"template {TEMPLATES / name} lacks its {_MARKER.strip()!r} line")
    return text[at + len(_MARKER):]


def host_entry_points(api: str) -> str:
    """Our extern "C" entry points for a "2x" or "3x" kernel, ``${operation_name}`` unsubstituted."""
    return (template("host_entry_points.cpp")
            .replace("${build_params}", template(f"build_params_{api}.cpp"))
            .replace("${workspace_size}", template(f"workspace_size_{api}.cpp")))


def _include_lines(headers) -> str:
    return "".join(f'#include "{h}"\n' for h in headers)


def _example_tensors(spec: GemmKernelSpec) -> dict[str, Any]:
    import torch

    epi = epilogues.get(spec.epilogue)
    examples: dict[str, Any] = {"accum": torch.empty((EXAMPLE_M, EXAMPLE_N), dtype=torch.int32)}
    for name, kind in epi.inputs:
        if kind == "scalar":
            examples[name] = 1.5  # a Python float becomes a run-time scalar argument
        else:
            examples[name] = torch.empty(epi.input_shape(kind, EXAMPLE_M, EXAMPLE_N), dtype=torch.float32)
    examples["D"] = torch.empty((EXAMPLE_M, EXAMPLE_N), dtype=epilogues.OUTPUT_DTYPES[spec.element_D])
    return examples


def _warp_count(plan, spec: GemmKernelSpec):
    if spec.warp_count is not None or spec.kernel_cc == 90:
        return spec.warp_count
    for td in plan.tile_descriptions():
        if tuple(td.threadblock_shape) == spec.threadblock_shape and (spec.stages in (None, td.stages)):
            return tuple(td.warp_count)
    raise ValueError(f"no generator tile {spec.threadblock_shape} (stages {spec.stages}) for Sm{spec.kernel_cc}; "
                     f"give warp_count explicitly")


def emit(spec: GemmKernelSpec) -> EmittedGemm:
    """Build the interface's GEMM operation for ``spec`` and emit its device and host sources."""
    from . import bridge

    epi = epilogues.get(spec.epilogue)
    with bridge.target_registry(spec.target_cc):
        plan = bridge.gemm_plan(
            spec.kernel_cc, element_A=spec.element_A, element_B=spec.element_B, element_C=spec.element_C,
            element_D=spec.element_D, element_accumulator=spec.element_accumulator,
            layout_A="row", layout_B="col", layout_C="row")
        if epi.evt:
            # Sm75 too: the Sm80 EVT goes onto the Sm75 plan, whose mainloop stays Sm75 (trace_epilogue).
            bridge.trace_epilogue(epi.fn, _example_tensors(spec), spec.kernel_cc, plan=plan)
        stages = spec.stages
        if stages is None and spec.kernel_cc != 90:
            stages = next((td.stages for td in plan.tile_descriptions()
                           if tuple(td.threadblock_shape) == spec.threadblock_shape), None)
            if stages is None:
                raise ValueError(f"no generator tile {spec.threadblock_shape} for Sm{spec.kernel_cc}; give stages")
        td = bridge.tile_description(
            plan, threadblock_shape=spec.threadblock_shape, stages=stages, warp_count=_warp_count(plan, spec),
            cluster_shape=spec.cluster_shape, kernel_schedule=spec.kernel_schedule,
            epilogue_schedule=spec.epilogue_schedule, tile_scheduler=spec.tile_scheduler)
        try:
            operation = plan.construct(td, alignment_A=spec.alignment_A, alignment_B=spec.alignment_B,
                                       alignment_C=spec.alignment_D)
        except Exception as exc:  # the interface raises bare Exception for invalid configurations
            raise CutlassBuildError(f"CUTLASS rejected {spec.name}: {exc}") from exc
        rt = operation.rt_module
        body = rt.emit()
    name = rt.name()
    values = {"operation_name": name, "operation_suffix": rt.emitter.operation_suffix}
    includes = list(dict.fromkeys(rt.emitter.includes))
    host_includes = list(dict.fromkeys([*_HOST_INCLUDES, *includes]))
    device = _include_lines(includes) + body + bridge.substitute_template(rt.KernelTemplate, values)
    host = (_include_lines(host_includes) + body + bridge.substitute_template(rt.HostTemplate, values)
            + bridge.substitute_template(host_entry_points(spec.api), values))
    return EmittedGemm(spec, operation, name, device, host)
