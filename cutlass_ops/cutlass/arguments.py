"""The ``Arguments`` struct of a CUTLASS GEMM: recorded at build time, filled at run time.

At build time (:func:`argument_layout`) the interface's own ctypes ``Arguments`` class is
instantiated for an example problem and flattened: every scalar leaf gets its dotted path, byte
offset, struct code and a *role*: a problem dimension ("M", "N*K"...), a pointer ("ptr:A",
"ptr:scale_row"...), a run-time scalar ("scalar:lo"), the SM count, or None (the template's value
is kept: alpha/beta, null defaults, constants). At run time :class:`ArgumentLayout` writes the
roles into a copy of the template, so launching needs no CUTLASS import. The tests check the
filled bytes against the interface's struct for several problems.
"""
from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace
from typing import Any, Mapping

import epilogues

from .emit import EmittedGemm
from .spec import GemmKernelSpec

__all__ = ["ArgumentLayout", "ArgumentLayoutError", "argument_layout", "interface_arguments"]


class ArgumentLayoutError(ValueError):
    """A field of the Arguments struct has no known meaning, or a recorded layout is inconsistent."""


_CODES = {
    ctypes.c_void_p: "Q", ctypes.c_int: "i", ctypes.c_int32: "i", ctypes.c_uint32: "I",
    ctypes.c_long: "q", ctypes.c_longlong: "q", ctypes.c_int64: "q", ctypes.c_float: "f",
    ctypes.c_double: "d", ctypes.c_byte: "b", ctypes.c_int8: "b", ctypes.c_uint16: "H",
    ctypes.c_bool: "?", ctypes.c_uint64: "Q",
}


def _flatten(struct_type, prefix: str = "", base: int = 0) -> list[tuple[str, int, str]]:
    """(dotted path, byte offset, struct code) of every scalar leaf of a ctypes Structure type."""
    leaves: list[tuple[str, int, str]] = []
    for field in struct_type._fields_:
        fname, ftype = field[0], field[1]
        offset = base + getattr(struct_type, fname).offset
        if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
            leaves += _flatten(ftype, f"{prefix}{fname}.", offset)
        elif ftype in _CODES:
            leaves.append((f"{prefix}{fname}", offset, _CODES[ftype]))
        else:
            raise ArgumentLayoutError(f"unexpected ctypes field {prefix}{fname} of type {ftype}")
    return leaves


_VISITOR_POINTERS = ("ptr_row", "ptr_col", "ptr_aux")
_VISITOR_STRIDES = ("dRow", "dCol", "dAux", "dScalar")
_ROLES_2X = {
    "problem_size.m": "M", "problem_size.n": "N", "problem_size.k": "K",
    "batch_stride_D": "M*N", "batch_stride_A": "M*K", "batch_stride_B": "N*K", "batch_stride_C": "M*N",
    "stride_a": "K", "lda": "K", "stride_b": "K", "ldb": "K",
    "stride_c": "N", "ldc": "N", "stride_d": "N", "ldd": "N",
    "ptr_A": "ptr:A", "ptr_B": "ptr:B", "ptr_C": "ptr:C", "ptr_D": "ptr:D",
}
_ROLES_3X = {
    "problem_size.m": "M", "problem_size.n": "N", "problem_size.k": "K",
    "mainloop.ptr_A": "ptr:A", "mainloop.stride_A.major_stride": "K",
    "mainloop.ptr_B": "ptr:B", "mainloop.stride_B.major_stride": "K",
    "epilogue.ptr_C": "ptr:C", "epilogue.stride_C.major_stride": "N",
    "epilogue.ptr_D": "ptr:D", "epilogue.stride_D.major_stride": "N",
    "hw_info.sm_count": "sm_count", "hw_info.device_id": "device_id",
}


def _visitor_role(path: str, spec: GemmKernelSpec) -> str | None:
    """Role of a leaf inside an EVT visitor's arguments (names are the epilogue's inputs)."""
    epi = epilogues.get(spec.epilogue)
    kinds = dict(epi.inputs)
    kinds["D"] = "matrix"
    parts = path.split(".")
    leaf = parts[-1]
    if leaf in _VISITOR_POINTERS:
        node = parts[-2]
        if node not in kinds:
            raise ArgumentLayoutError(f"{spec.name}: visitor pointer {path} belongs to no epilogue input")
        return f"ptr:{node}"
    if leaf == "scalars" and kinds.get(parts[-2]) == "scalar":
        return f"scalar:{parts[-2]}"
    if len(parts) >= 3 and parts[-2] in _VISITOR_STRIDES and leaf.startswith("entry_"):
        node = parts[-3]
        if kinds.get(node) == "matrix" and leaf == "entry_0":
            return "N"  # row-major [M, N] matrix: stride of the M mode
        raise ArgumentLayoutError(f"{spec.name}: unexpected dynamic stride {path} in the EVT arguments")
    return None  # null_default, constants, placeholders: keep the template's value


def _field_role(path: str, spec: GemmKernelSpec) -> str | None:
    evt = epilogues.get(spec.epilogue).evt
    if spec.api == "2x":
        if path.startswith("epilogue."):
            return _visitor_role(path, spec) if evt else None
        if evt and path in ("ptr_C", "ptr_D"):
            return None  # a visitor kernel reads C and writes D through the visitor (interface passes 0)
        return _ROLES_2X.get(path)
    if path.startswith("epilogue.epilogue."):
        return _visitor_role(path, spec) if evt else None
    for operand in ("C", "D"):
        prefix = f"epilogue.arg_{operand}."
        if path.startswith(prefix):
            leaf = path[len(prefix):]
            if leaf.startswith("ptr_"):
                return f"ptr:{operand}"
            if leaf.endswith("entry_0"):
                return "N"
            raise ArgumentLayoutError(f"{spec.name}: unexpected field {path}")
    return _ROLES_3X.get(path)


def interface_arguments(emitted: EmittedGemm, uses_default_epilogue: bool | None, M: int, N: int, K: int,
                        pointers: dict[str, int], scalars: dict[str, float], sm_count: int = 0,
                        device_id: int = 0):
    """The Arguments struct exactly as the interface's ``GemmArguments*.get_arguments`` builds it.

    EVT strides come from the trace's example shape, so this matches a run-time problem only when
    the epilogue was traced at (M, N) (the tests re-trace to compare).
    """
    from . import bridge

    spec, op = emitted.spec, emitted.operation
    epi = epilogues.get(spec.epilogue)
    ptr = {k: int(v) for k, v in pointers.items()}
    if epi.evt:
        visitor_values: dict[str, Any] = {n: ptr.get(n, 0) for n, k in epi.inputs if k != "scalar"}
        visitor_values.update({n: float(scalars[n]) for n, k in epi.inputs if k == "scalar"})
        visitor_values["D"] = ptr.get("D", 0)
        if spec.api == "3x":
            visitor_values.update({"C": 0, "D": 0})  # Sm90 passes C and D outside the visitor
        thread_type = op.epilogue_functor.visitor.epilogue_thread_type
        output_op = op.epilogue_functor.epilogue_type.__new__(op.epilogue_functor.epilogue_type)
        output_op.output_op = thread_type(visitor_values)
    else:
        dtype = int if op.epilogue_functor.element_epilogue in (bridge.data_type("s32"), bridge.data_type("s8")) else float
        output_op = op.epilogue_type(dtype(1), dtype(0)) if spec.api == "2x" else op.epilogue_functor.epilogue_type(dtype(1), dtype(0))
    if spec.api == "2x":
        c_ptr, d_ptr = (0, 0) if epi.evt else (ptr.get("C", 0), ptr.get("D", 0))
        coord = bridge.gemm_coord_type()(M, N, K)
        return op.rt_module.argument_type(
            0, coord, 1, M * N, output_op, ptr.get("A", 0), ptr.get("B", 0), c_ptr, d_ptr,
            M * K, N * K, M * N, K, K, N, N, K, K, N, N, 0, 0, 0)
    types = bridge.gemm_arguments_3x_types(op, bool(uses_default_epilogue))
    if not epi.evt and not uses_default_epilogue and hasattr(output_op, "to_evt_params"):
        output_op = output_op.to_evt_params()
    stride = types["stride"]
    mainloop = types["mainloop"](ptr.get("A", 0), stride(K, 0), ptr.get("B", 0), stride(K, 0), 4)
    epilogue = types["epilogue_arguments"](output_op, ptr.get("C", 0), stride(N, 0), ptr.get("D", 0), stride(N, 0))
    dim3 = types["dim3"]
    hw_info = types["hw_info"](device_id, sm_count, 0, dim3(0, 0, 0), dim3(0, 0, 0))
    problem = types["problem_size"](SimpleNamespace(m=M, n=N, k=K), 1)
    scheduler = bridge.cutlass().backend.c_types.get_tile_scheduler_arguments_3x(op.tile_description.tile_scheduler)
    return types["arguments"](0, problem, mainloop, epilogue, hw_info, scheduler)


def argument_layout(emitted: EmittedGemm, uses_default_epilogue: bool | None,
                    example: tuple[int, int, int]) -> dict[str, Any]:
    """Template bytes (at the example problem, null pointers) and (path, offset, code, role) per leaf."""
    spec = emitted.spec
    epi = epilogues.get(spec.epilogue)
    scalars = {n: 0.0 for n, k in epi.inputs if k == "scalar"}
    args = interface_arguments(emitted, uses_default_epilogue, *example, {}, scalars)
    fields = [[path, offset, code, _field_role(path, spec)] for path, offset, code in _flatten(type(args))]
    return {"size": ctypes.sizeof(args), "template": bytes(args).hex(), "fields": fields}


class ArgumentLayout:
    """Fills the interface's ``Arguments`` struct from the layout recorded at build time."""

    _DIMENSIONS = ("M", "N", "K", "M*N", "M*K", "N*K", "sm_count", "device_id")

    def __init__(self, layout: Mapping[str, Any]):
        self.size = int(layout["size"])
        self.template = bytes.fromhex(layout["template"])
        if len(self.template) != self.size:
            raise ArgumentLayoutError("argument template size does not match the recorded struct size")
        self.dimensions: list[tuple[int, str, str]] = []
        self.pointers: list[tuple[int, str]] = []
        self.scalars: list[tuple[int, str, str]] = []
        for path, offset, code, role in layout["fields"]:
            if role is None:
                continue
            if role in self._DIMENSIONS:
                self.dimensions.append((offset, "<" + code, role))
            elif role.startswith("ptr:"):
                if code != "Q":
                    raise ArgumentLayoutError(f"pointer field {path} is not 64-bit")
                self.pointers.append((offset, role[4:]))
            elif role.startswith("scalar:"):
                self.scalars.append((offset, "<" + code, role[7:]))
            else:
                raise ArgumentLayoutError(f"unknown role {role!r} of argument field {path}")

    def fill(self, M: int, N: int, K: int, pointers: Mapping[str, int], scalars: Mapping[str, float] = {},
             sm_count: int = 0, device_id: int = 0) -> bytearray:
        """The Arguments bytes of problem (M, N, K) with the given pointers (missing ones: 0)."""
        values = {"M": M, "N": N, "K": K, "M*N": M * N, "M*K": M * K, "N*K": N * K,
                  "sm_count": sm_count, "device_id": device_id}
        buf = bytearray(self.template)
        for offset, fmt, role in self.dimensions:
            struct.pack_into(fmt, buf, offset, values[role])
        for offset, name in self.pointers:
            struct.pack_into("<Q", buf, offset, int(pointers.get(name, 0)))
        for offset, fmt, name in self.scalars:
            struct.pack_into(fmt, buf, offset, float(scalars[name]))
        return buf
