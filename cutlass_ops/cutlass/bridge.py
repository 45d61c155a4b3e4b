"""The only module that imports ``cutlass_cppgen`` (nvidia-cutlass 4.2, CUTLASS's Python interface).

The interface was written for cuda-python 12 and for emitting *and* compiling on the machine
that runs the kernels. This module adapts it to emission for an explicit target on any machine
(see docs/design.md for the measured facts behind each step):

- cuda-python 13 moved ``cuda.cuda``/``cuda.cudart``/``cuda.nvrtc`` to ``cuda.bindings.*`` and
  dropped ``cuda.__version__``; the old names are registered before the first import.
- Importing the interface creates ``compiled_cache.db`` in the current directory. The import runs
  with the working directory (and ``tempfile.tempdir``) switched to ``cache_dir("cutlass")/interface``
  and both are restored afterwards; the interface's cache path is then made absolute.
- A C call handed ``b" " * 1`` as an output buffer writes into CPython's one shared ``b" "`` (an
  empty NVRTC log does: ``b"\\x00"``); Python >= 3.12 compiles f-string parts through it, so the
  interface compiled afterwards turns ``f"{a} {b} {c}"`` into "abc" (alignment keys "16168": every
  emission fails with an IndexError). The shared one-byte objects are restored before the import,
  and the imported interface is checked.
- The option registry is never created from ``device_cc()``: :func:`target_registry` installs one
  per explicit target compute capability, and callers pass ``cc=`` everywhere.
- The interface's own compiler (``compiler.add_module``) is not used: it needs a GPU, compiles for
  the device's arch and writes into the current directory. ``cutlass_ops.cutlass.emit`` emits the
  sources and ``cutlass_ops.cutlass.build`` runs nvcc itself.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from custom_kernels.cache import cache_dir
from custom_kernels.cuda_paths import cuda_home, cuda_include_dirs, nvcc_path

log = logging.getLogger(__name__)

__all__ = [
    "cutlass",
    "library",
    "interface_version",
    "nvcc_version",
    "include_dirs",
    "target_registry",
    "data_type",
    "layout_type",
    "enum_member",
    "gemm_plan",
    "tile_description",
    "trace_epilogue",
    "substitute_template",
    "gemm_arguments_3x_types",
    "gemm_coord_type",
]

# One lock serialises everything that touches the interface's process-wide state
# (its option registry and the working directory during import).
_LOCK = threading.RLock()


def _install_legacy_cuda_modules() -> None:
    """Register cuda-python 13's modules under the cuda-python 12 names the interface imports."""
    import cuda
    import cuda.bindings
    from cuda.bindings import driver, nvrtc, runtime

    for legacy, module in (("cuda.cuda", driver), ("cuda.cudart", runtime), ("cuda.nvrtc", nvrtc)):
        module = sys.modules.setdefault(legacy, module)
        setattr(cuda, legacy.split(".", 1)[1], module)
    if not hasattr(cuda, "__version__"):
        # The interface demands cuda-python >= nvcc; cuda-bindings carries the real version.
        cuda.__version__ = cuda.bindings.__version__


@contextlib.contextmanager
def _interface_workdir() -> Iterator[Path]:
    """Run a block with cwd and tempfile.tempdir in the interface's cache dir; restore both."""
    workdir = cache_dir("cutlass", "interface")
    old_cwd = os.getcwd()
    old_tempdir = tempfile.tempdir
    os.chdir(workdir)
    tempfile.tempdir = str(workdir)
    try:
        yield workdir
    finally:
        tempfile.tempdir = old_tempdir
        os.chdir(old_cwd)


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """``major.minor`` of the nvcc that builds the kernels (e.g. "13.0")."""
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"release (\d+\.\d+)", out)
    if match is None:
        raise RuntimeError(f"cannot read the CUDA release from `nvcc --version`:\n{out}")
    return match.group(1)


_BYTE_VALUES = bytes(range(256))


def _restore_shared_byte_objects() -> None:
    """Undo in-place writes into CPython's shared one-byte ``bytes`` objects (see the module doc)."""
    for value in range(256):
        shared = _BYTE_VALUES[value:value + 1]  # a 1-byte slice is the shared object of that value
        found = shared[0]
        if found != value:
            ctypes.memset(ctypes.cast(ctypes.c_char_p(shared), ctypes.c_void_p).value, value, 1)
            log.warning("restored CPython's shared bytes object %r, which a C call had overwritten with %r "
                        "(an output buffer made as b'...' * 1)", shared, found.to_bytes(1, "little"))


def _check_interface_code() -> None:
    """Raise if the interface's code was compiled while the shared ``b" "`` was overwritten."""
    stub = types.SimpleNamespace
    op = stub(A=stub(alignment=16), B=stub(alignment=16), C=stub(alignment=8),
              tile_description=stub(math_instruction=stub(math_operation=None)))
    kernels = _KernelsForDataType(None, None)
    kernels.add(op)
    keys = list(kernels.kernels_by_alignment)
    if keys != ["16 16 8"]:
        raise RuntimeError(
            f"cutlass_cppgen was compiled while CPython's shared b' ' object was overwritten: its "
            f"f-strings lost their spaces (alignment key {keys}). Import cutlass_ops.cutlass.bridge before "
            f"cutlass_cppgen in a new process; if this persists, delete the __pycache__ directories of "
            f"cutlass_cppgen and cutlass_library under {Path(_cutlass.__file__).parent.parent}.")


def _import_interface():
    with _LOCK:
        # An earlier NVRTC compile may have zeroed b" ", which breaks f-strings compiled now (3.12+).
        _restore_shared_byte_objects()
        if "cutlass_cppgen" in sys.modules:
            return sys.modules["cutlass_cppgen"]
        _install_legacy_cuda_modules()
        with _interface_workdir() as workdir:
            import cutlass_cppgen
            import cutlass_cppgen.backend.compiler as interface_compiler
        # Later (accidental) uses of the interface's sqlite cache go to the cache dir, not cwd.
        absolute_db = str(workdir / cutlass_cppgen.CACHE_FILE)
        cutlass_cppgen.CACHE_FILE = absolute_db
        interface_compiler.CACHE_FILE = absolute_db
        # The interface reads these lazily from `nvcc` on PATH; give it the toolkit we build with.
        try:
            version = nvcc_version()
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            import cuda.bindings

            version = ".".join(cuda.bindings.__version__.split(".")[:2])
            log.warning("nvcc unavailable (%s); emitting for CUDA %s", exc, version)
        cutlass_cppgen._nvcc_version = version
        cutlass_cppgen._NVCC_VERSION = version
        home = cuda_home()
        if home is not None:
            cutlass_cppgen._CUDA_INSTALL_PATH = str(home)
        return cutlass_cppgen


_cutlass = _import_interface()
import cutlass_library as _library  # noqa: E402  (imported by the interface itself above)
# cutlass_library skips its generator when "-m" is anywhere in sys.argv (e.g. `pytest -m gpu`);
# the option registry needs it.
import cutlass_library.generator  # noqa: E402,F401
from cutlass_cppgen.library_defaults import ArchOptions as _ArchOptions  # noqa: E402
from cutlass_cppgen.library_defaults import KernelsForDataType as _KernelsForDataType  # noqa: E402
from cutlass_cppgen.library_defaults import OptionRegistry as _OptionRegistry  # noqa: E402

_check_interface_code()


def cutlass():
    """The ``cutlass_cppgen`` module."""
    return _cutlass


def library():
    """The ``cutlass_library`` module (enums, SubstituteTemplate, source_path)."""
    return _library


@functools.lru_cache(maxsize=1)
def interface_version() -> str:
    return importlib.metadata.version("nvidia-cutlass")


def include_dirs() -> list[str]:
    """Include directories for nvcc: CUDA, CUTLASS include and tools/util, the interface's extras."""
    source = Path(_cutlass.CUTLASS_PATH)
    dirs = list(cuda_include_dirs())
    for sub in ("include", "tools/util/include", "python/cutlass/cpp/include"):
        path = source / sub
        if path.is_dir():
            dirs.append(str(path))
    return dirs


class _TargetRegistry(_OptionRegistry):
    """The interface's option registry for one explicit target cc, built per kernel cc on demand.

    ``OptionRegistry(cc)`` generates every kernel cc's operations up front (about 8 s); only the
    kernel ccs actually asked for are generated here.
    """

    def __init__(self, target_cc: int):  # noqa: D107 - deliberately not calling super().__init__
        self.target_cc = target_cc
        self.registry: dict = {}

    def options_for_cc(self, cc: int, op_kind=_library.OperationKind.Gemm):
        key = (cc, op_kind)
        if key not in self.registry:
            kinds = [_library.GemmKind.Universal, _library.GemmKind.Universal3x]
            self.registry[key] = _ArchOptions(self.target_cc, cc, op_kind, kinds)
        return self.registry[key]


_registries: dict[int, _TargetRegistry] = {}


@contextlib.contextmanager
def target_registry(target_cc: int) -> Iterator[_TargetRegistry]:
    """Hold the interface lock with the option registry for ``target_cc`` installed."""
    if target_cc not in (75, 80, 86, 89, 90):
        raise ValueError(f"target_cc must be one of 75, 80, 86, 89, 90, got {target_cc!r}")
    with _LOCK:
        registry = _registries.get(target_cc)
        if registry is None:
            registry = _registries[target_cc] = _TargetRegistry(target_cc)
        previous = _cutlass._option_registry
        _cutlass._option_registry = registry
        try:
            yield registry
        finally:
            _cutlass._option_registry = previous


_DATA_TYPES = {
    "s8": "s8", "int8": "s8",
    "u8": "u8", "uint8": "u8",
    "s32": "s32", "int32": "s32",
    "f16": "f16", "float16": "f16", "half": "f16",
    "bf16": "bf16", "bfloat16": "bf16",
    "f32": "f32", "float32": "f32", "float": "f32",
    "void": "void",
}


def data_type(name: Any):
    """A ``cutlass_library.DataType`` from a short name ("s8", "f16"...) or a torch dtype."""
    if isinstance(name, _library.DataType):
        return name
    text = str(name).removeprefix("torch.")
    if text not in _DATA_TYPES:
        raise ValueError(f"unsupported element type {name!r}; expected one of {sorted(set(_DATA_TYPES.values()))}")
    return getattr(_library.DataType, _DATA_TYPES[text])


def layout_type(name: str):
    """``cutlass_library.LayoutType`` from "row"/"col" (or the enum member's own name)."""
    aliases = {"row": "RowMajor", "col": "ColumnMajor", "column": "ColumnMajor"}
    return enum_member(_library.LayoutType, aliases.get(name, name))


def enum_member(enum_type, name: str | None):
    """``enum_type[name]`` with an error listing the valid names; None stays None."""
    if name is None:
        return None
    try:
        return enum_type[name]
    except KeyError:
        valid = ", ".join(m.name for m in enum_type)
        raise ValueError(f"{name!r} is not a {enum_type.__name__}; valid: {valid}") from None


def gemm_plan(kernel_cc: int, *, element_A, element_B, element_C, element_D, element_accumulator,
              layout_A: str, layout_B: str, layout_C: str = "row"):
    """A ``cutlass_cppgen.op.Gemm`` with ``cc = kernel_cc`` (call inside :func:`target_registry`).

    ``cc`` is set to the kernel cc rather than the device's: the interface picks the EVT emitter
    and checks epilogue shared memory by ``cc``, so a Sm80 kernel meant for a Hopper GPU needs
    ``cc=80`` (docs/design.md).
    """
    if _cutlass._option_registry is None or not isinstance(_cutlass._option_registry, _TargetRegistry):
        raise RuntimeError("gemm_plan must be called inside bridge.target_registry(target_cc)")
    return _cutlass.op.Gemm(
        element_A=data_type(element_A), element_B=data_type(element_B),
        element_C=data_type(element_C), element_D=data_type(element_D),
        element_accumulator=data_type(element_accumulator),
        layout_A=layout_type(layout_A), layout_B=layout_type(layout_B), layout_C=layout_type(layout_C),
        cc=kernel_cc, kernel_cc=kernel_cc,
    )


def tile_description(plan, *, threadblock_shape, stages, warp_count, cluster_shape,
                     kernel_schedule: str | None, epilogue_schedule: str | None,
                     tile_scheduler: str | None):
    """A backend ``TileDescription`` for ``plan``'s math instruction with the given shape/schedules.

    Schedules left as None mean the interface's defaults (``ScheduleAuto``, ``Default``), the only
    ones allowed below Sm90.
    """
    default = _cutlass.utils.datatypes.td_from_profiler_op(
        plan.possible_operations.default_operation(plan._math_operation))
    return default.clone_and_update({
        "threadblock_shape": list(threadblock_shape),
        "stages": stages,
        "warp_count": list(warp_count) if warp_count is not None else None,
        "cluster_shape": list(cluster_shape),
        "kernel_schedule": enum_member(_library.KernelScheduleType, kernel_schedule or "ScheduleAuto"),
        "epilogue_schedule": enum_member(_library.EpilogueScheduleType, epilogue_schedule or "ScheduleAuto"),
        "tile_scheduler": enum_member(_library.TileSchedulerType, tile_scheduler or "Default"),
    })


def trace_epilogue(fn: Callable, example_tensors: Mapping[str, Any], kernel_cc: int, plan=None):
    """Trace ``fn`` (an epilogue function) into an EVT visitor for ``kernel_cc`` (75, 80 or 90).

    With ``plan`` (a :func:`gemm_plan` of the same ``kernel_cc``) the visitor also becomes the
    plan's epilogue. Sm75 gets the Sm80 (CUTLASS 2.x) visitor, which uses no Sm80 instruction
    (plain global loads/stores); the mainloop keeps the plan's Sm75 arch tag, mma shape and stages.
    """
    if kernel_cc not in (75, 80, 90):
        raise ValueError(f"EVT epilogues need kernel_cc 75, 80 or 90, got {kernel_cc}")
    if plan is not None and plan.cc != kernel_cc:
        raise ValueError(f"plan is for cc {plan.cc}, not kernel_cc {kernel_cc}")
    evt_cc = 80 if kernel_cc == 75 else kernel_cc
    with _LOCK:
        visitor = _cutlass.epilogue.trace(fn, dict(example_tensors), cc=evt_cc)
        if plan is not None and kernel_cc == 75:
            # The plan's epilogue_visitor setter looks cc 75 up in the interface's cc map (KeyError).
            plan.epilogue_functor = _cutlass.backend.evt.EpilogueFunctorVisitor(evt_cc, visitor)
        elif plan is not None:
            plan.epilogue_visitor = visitor
        return visitor


def substitute_template(template: str, values: Mapping[str, str]) -> str:
    return _library.SubstituteTemplate(template, dict(values))


def gemm_arguments_3x_types(operation, uses_default_epilogue: bool):
    """The interface's ctypes ``Arguments`` type of a CUTLASS 3 (Sm90) GEMM operation."""
    c_types = _cutlass.backend.c_types
    td = operation.tile_description
    mainloop = c_types.get_mainloop_arguments_3x(
        td.kernel_schedule, operation.A.element, operation.B.element,
        operation.A.alignment, operation.B.alignment)
    scheduler = c_types.get_tile_scheduler_arguments_3x(td.tile_scheduler)
    arguments, epilogue_arguments, epilogue_params, hw_info = c_types.get_gemm_arguments_3x(
        mainloop, operation.epilogue_functor, scheduler, uses_default_epilogue)
    return {
        "arguments": arguments,
        "mainloop": mainloop,
        "epilogue_arguments": epilogue_arguments,
        "epilogue_params": epilogue_params,
        "hw_info": hw_info,
        "scheduler": scheduler,
        "stride": c_types.StrideBatched_,
        "problem_size": c_types.GemmCoordBatched_,
        "dim3": c_types.dim3_,
    }


def gemm_coord_type():
    """The interface's ctypes ``GemmCoord_`` (2.x problem size)."""
    return _cutlass.backend.c_types.GemmCoord_
