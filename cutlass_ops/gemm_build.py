"""Ahead-of-time build of CUTLASS int8 GEMM kernels: emit with the interface, compile with nvcc.

A :class:`GemmKernelSpec` names one kernel completely (kernel generation, target arch, element
types, tile, schedules, alignments, epilogue). :func:`build` emits its sources the way the
interface's ``compiler.emit_compile_`` does (``operation.emit()`` + ``KernelTemplate`` /
``HostTemplate`` + includes, plus a small host function of ours that writes ``Params`` into a
caller's buffer), compiles the device cubin and the host library with nvcc for an explicit target
(no GPU needed) and stores them in a content-addressed directory under ``cache_dir("cutlass")``:

    kernels/<name>-<key>/kernel.cubin   device code, loaded with custom_kernels.launcher.Module
    kernels/<name>-<key>/host.so        <kernel>_get_param_size, ..., <kernel>_cutlass_ops_params
    kernels/<name>-<key>/meta.json      kernel name, param/smem size, block, cluster, argument layout
    kernels/<name>-<key>/build.log      the nvcc commands and their output
    index/<spec-key>.json               spec -> kernel directory (lookups need no CUTLASS import)

The key of a kernel directory covers the emitted sources, the nvcc flags, the nvcc version and the
target arch. The meta's argument layout (:mod:`cutlass_ops.gemm_args`) lets
:mod:`cutlass_ops.gemm_launch` fill the ``Arguments`` struct at run time without the interface.
"""
from __future__ import annotations

import ctypes
import dataclasses
import inspect
import json
import logging
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import epilogues
from custom_kernels.cache import atomic_write, cache_dir, content_key
from custom_kernels.cuda_paths import nvcc_path

from .gemm_args import argument_layout

log = logging.getLogger(__name__)

# Bump when the emitted templates or the meta format change: it is part of every index key.
BUILD_FORMAT = 2
KERNEL_CCS = (75, 80, 90)
# Example problem used to trace EVT epilogues and to lay out the Arguments template. Its strides
# must not be 0 or 1 (the interface turns those into compile-time constants).
EXAMPLE_M, EXAMPLE_N, EXAMPLE_K = 384, 640, 256

COMMON_FLAGS = (
    "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",
    "-Xcudafe", "--diag_suppress=esa_on_defaulted_function_ignored",
)
# Sm90 kernels call griddepcontrol (CUTLASS's GDC): the producer waits on the previous grid before its
# first load, and the consumers release the next grid after their last mainloop, so a kernel launched
# with programmatic dependent launch overlaps its start with the end of the one before it.
SM90_DEVICE_FLAGS = ("-DCUTLASS_ENABLE_GDC_FOR_SM90",)
# The host library links libcudart dynamically (40 KB instead of 1 MB per kernel); at load time
# the soname resolves to the libcudart.so.13 that torch has already loaded (see gemm_launch).
HOST_FLAGS = ("-x", "cu", "-Xcompiler=-fPIC", "-Xcompiler=-fpermissive", "-Xcompiler=-w",
              "-shared", "-cudart", "shared", "-Xlinker", "-s")

# Our host entry points, appended after the interface's HostTemplate. They write Params into the
# caller's buffer (the interface's get_params leaks a `new char[]` per call) and report the launch.
# Params are compared byte for byte across builds (pointer patching), and their padding bytes come
# from whatever was on the stack; the builder therefore runs in a frame over freshly zeroed stack.
_HOST_EXTRA_COMMON = r"""
#include <cstring>
namespace ${operation_name}_cutlass_ops {
__attribute__((noinline)) void scrub_stack() {
  char region[1 << 15];
  std::memset(region, 0, sizeof(region));
  asm volatile("" : : "r"(region) : "memory");  // keep the memset: the region is "used"
}
}  // namespace
"""
_HOST_EXTRA_2X = _HOST_EXTRA_COMMON + r"""
namespace ${operation_name}_cutlass_ops {
__attribute__((noinline)) int build(${operation_name}_base::Arguments const* args, void* workspace,
                                    char* params_out, int* launch_out) {
  using Kernel = ${operation_name}_base;
  if (Kernel::can_implement(*args) != cutlass::Status::kSuccess) return 1;
  Kernel::Params params(*args, -1, -1);
  params.semaphore = static_cast<int*>(workspace);
  std::memcpy(params_out, &params, sizeof(params));
  dim3 grid = typename Kernel::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  launch_out[0] = grid.x; launch_out[1] = grid.y; launch_out[2] = grid.z;
  launch_out[3] = Kernel::kThreadCount; launch_out[4] = 1; launch_out[5] = 1;
  return 0;
}
}  // namespace
extern "C" {
  // cutlass_ops: Params of `args` into `params_out`; grid and block into launch_out[0..5].
  int ${operation_name}_cutlass_ops_params(${operation_name}_base::Arguments const* args, void* workspace,
                                           char* params_out, int* launch_out) {
    ${operation_name}_cutlass_ops::scrub_stack();
    return ${operation_name}_cutlass_ops::build(args, workspace, params_out, launch_out);
  }
  unsigned long long ${operation_name}_cutlass_ops_workspace_size(${operation_name}_base::Arguments const*) {
    return 0;  // GemmUniversal in mode kGemm with one split uses no workspace
  }
}
"""
_HOST_EXTRA_3X = _HOST_EXTRA_COMMON + r"""
namespace ${operation_name}_cutlass_ops {
__attribute__((noinline)) int build(${operation_name}_base::Arguments const* args, void* workspace,
                                    char* params_out, int* launch_out) {
  using Kernel = ${operation_name}_base;
  if (!Kernel::can_implement(*args)) return 1;
  typename Kernel::Params params = Kernel::to_underlying_arguments(*args, workspace);
  std::memcpy(params_out, &params, sizeof(params));
  dim3 grid = Kernel::get_grid_shape(params);
  dim3 block = Kernel::get_block_shape();
  launch_out[0] = grid.x; launch_out[1] = grid.y; launch_out[2] = grid.z;
  launch_out[3] = block.x; launch_out[4] = block.y; launch_out[5] = block.z;
  return 0;
}
}  // namespace
extern "C" {
  // cutlass_ops: Params of `args` into `params_out`; grid and block into launch_out[0..5].
  int ${operation_name}_cutlass_ops_params(${operation_name}_base::Arguments const* args, void* workspace,
                                           char* params_out, int* launch_out) {
    ${operation_name}_cutlass_ops::scrub_stack();
    return ${operation_name}_cutlass_ops::build(args, workspace, params_out, launch_out);
  }
  unsigned long long ${operation_name}_cutlass_ops_workspace_size(${operation_name}_base::Arguments const* args) {
    return ${operation_name}_base::get_workspace_size(*args);
  }
}
"""


class CutlassBuildError(RuntimeError):
    """Emission or nvcc compilation of a CUTLASS kernel failed; the message holds nvcc's output."""


@dataclass(frozen=True)
class GemmKernelSpec:
    """Everything that determines one compiled int8 GEMM kernel.

    ``kernel_cc`` is the CUTLASS kernel generation (75: mma.sync m8n8k16, 80: mma.sync m16n8k32,
    90: wgmma + TMA); ``target_arch`` the nvcc target ("90a" for kernel_cc 90; a Sm75/Sm80 kernel
    may target "90" to run on Hopper). B is the weight W [N, K] row-major, i.e. a column-major
    K x N operand. ``threadblock_shape`` is per cluster on Sm90 (interface convention).
    """

    kernel_cc: int
    target_arch: str
    epilogue: str = "none"
    element_D: str = "s32"
    threadblock_shape: tuple[int, int, int] = (128, 128, 64)
    stages: int | None = None  # None: the interface's default / Sm90 auto carve-out
    warp_count: tuple[int, int, int] | None = None  # None: taken from the generator's tile list
    cluster_shape: tuple[int, int, int] = (1, 1, 1)
    kernel_schedule: str | None = None  # Sm90 only, e.g. "TmaWarpSpecializedCooperative"
    epilogue_schedule: str | None = None  # Sm90 only, e.g. "TmaWarpSpecializedCooperative"
    tile_scheduler: str | None = None
    alignment_A: int = 16
    alignment_B: int = 16
    alignment_D: int = 8
    element_A: str = "s8"
    element_B: str = "s8"
    element_accumulator: str = "s32"

    def __post_init__(self):
        if self.kernel_cc not in KERNEL_CCS:
            raise ValueError(f"kernel_cc must be one of {KERNEL_CCS}, got {self.kernel_cc!r}")
        target = str(self.target_arch)
        if target.rstrip("a") not in ("75", "80", "86", "89", "90") or target.count("a") > 1:
            raise ValueError(f"target_arch must be 75, 80, 86, 89, 90 or 90a, got {self.target_arch!r}")
        if int(target.rstrip("a")) < self.kernel_cc:
            raise ValueError(f"kernel_cc {self.kernel_cc} cannot run on target_arch sm_{target}")
        if self.kernel_cc == 90 and target != "90a":
            raise ValueError("Sm90 kernels (wgmma, TMA) need target_arch '90a'")
        spec = epilogues.get(self.epilogue)
        if self.element_D not in spec.output_dtypes:
            raise ValueError(f"epilogue {self.epilogue!r} writes {spec.output_dtypes}, not element_D={self.element_D!r}")
        if (self.element_A, self.element_B, self.element_accumulator) != ("s8", "s8", "s32"):
            raise ValueError("only int8 x int8 -> int32 GEMMs are built here")
        for name in ("threadblock_shape", "cluster_shape", "warp_count"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))
        object.__setattr__(self, "target_arch", target)

    @property
    def api(self) -> str:
        """"3x" for CUTLASS 3 (Sm90) kernels, "2x" for the CUTLASS 2 ones."""
        return "3x" if self.kernel_cc == 90 else "2x"

    @property
    def target_cc(self) -> int:
        return int(self.target_arch.rstrip("a"))

    @property
    def element_C(self) -> str:
        """C operand type: the epilogue's matrix C if it has one, else D (2.x) or void (Sm90)."""
        if "C" in epilogues.get(self.epilogue).input_names:
            return "f32"
        return "void" if self.kernel_cc == 90 else self.element_D

    @property
    def name(self) -> str:
        """A readable id, e.g. ``sm90_dequant_f16_128x256x128_c1x2x1_a16x16x8_t90a``."""
        tb = "x".join(map(str, self.threadblock_shape))
        cl = "x".join(map(str, self.cluster_shape))
        sched = {"TmaWarpSpecializedCooperative": "coop", "TmaWarpSpecializedPingpong": "pingpong",
                 "TmaWarpSpecialized": "ws"}.get(self.kernel_schedule or "", "")
        stages = f"_s{self.stages}" if self.stages else ""
        parts = [f"sm{self.kernel_cc}", self.epilogue, self.element_D, f"{tb}{stages}", f"c{cl}"]
        if sched:
            parts.append(sched)
        parts += [f"a{self.alignment_A}x{self.alignment_B}x{self.alignment_D}", f"t{self.target_arch}"]
        return "_".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GemmKernelSpec":
        return cls(**data)

    def index_key(self) -> str:
        """Key of the spec -> kernel index: the spec, the epilogue's source, interface and format."""
        fn_source = inspect.getsource(epilogues.get(self.epilogue).fn)
        return content_key(json.dumps(self.to_dict(), sort_keys=True), fn_source,
                           "nvidia-cutlass==4.2.0.0", str(BUILD_FORMAT), *_device_flags(self))


@dataclass(frozen=True)
class GemmArtifact:
    """A built kernel on disk."""

    directory: Path
    meta: dict

    @property
    def cubin_path(self) -> Path:
        return self.directory / "kernel.cubin"

    @property
    def host_path(self) -> Path:
        return self.directory / "host.so"

    @classmethod
    def load(cls, directory: Path) -> "GemmArtifact | None":
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            return None
        meta = json.loads(meta_path.read_text())
        art = cls(directory, meta)
        if not (art.cubin_path.is_file() and art.host_path.is_file()):
            return None
        return art


def lookup(spec: GemmKernelSpec) -> GemmArtifact | None:
    """The built kernel of ``spec`` from the index, or None. Imports no CUTLASS, runs no nvcc."""
    entry = cache_dir("cutlass", "index") / f"{spec.index_key()}.json"
    if not entry.is_file():
        return None
    directory = cache_dir("cutlass", "kernels") / json.loads(entry.read_text())["directory"]
    return GemmArtifact.load(directory)


# ----------------------------------------------------------------------------------------------
# Emission (through the bridge: the only module importing cutlass_cppgen)
# ----------------------------------------------------------------------------------------------


@dataclass
class EmittedGemm:
    spec: GemmKernelSpec
    operation: Any  # cutlass_cppgen.backend.GemmOperationUniversal
    kernel_name: str
    device_source: str
    host_source: str


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
    host_includes = list(dict.fromkeys(["builtin_types.h", "device_launch_parameters.h", "cstddef", *includes]))
    device = "".join(f'#include "{i}"\n' for i in includes) + body + bridge.substitute_template(rt.KernelTemplate, values)
    extra = _HOST_EXTRA_3X if spec.api == "3x" else _HOST_EXTRA_2X
    host = ("".join(f'#include "{i}"\n' for i in host_includes) + body
            + bridge.substitute_template(rt.HostTemplate, values) + bridge.substitute_template(extra, values))
    return EmittedGemm(spec, operation, name, device, host)


# ----------------------------------------------------------------------------------------------
# Compilation and the cache
# ----------------------------------------------------------------------------------------------


def _gencode(target_arch: str) -> str:
    return f"-gencode=arch=compute_{target_arch},code=sm_{target_arch}"


def _commands(spec: GemmKernelSpec, workdir: Path) -> tuple[list[str], list[str]]:
    from . import bridge

    includes = [f"-I{d}" for d in bridge.include_dirs()]
    nvcc = nvcc_path()
    device = [nvcc, *COMMON_FLAGS, *_device_flags(spec), *includes, _gencode(spec.target_arch), "-cubin",
              "-o", str(workdir / "kernel.cubin"), str(workdir / "device.cu")]
    host = [nvcc, *COMMON_FLAGS, *HOST_FLAGS, *includes, _gencode(spec.target_arch),
            "-o", str(workdir / "host.so"), str(workdir / "host.cu")]
    return device, host


def _device_flags(spec: GemmKernelSpec) -> tuple[str, ...]:
    return SM90_DEVICE_FLAGS if spec.kernel_cc == 90 else ()


def _flags_text(spec: GemmKernelSpec) -> str:
    # Include directories are machine paths: kept out of the key so a carried cache still hits.
    return " ".join([*COMMON_FLAGS, *_device_flags(spec), "|", *HOST_FLAGS, "|", _gencode(spec.target_arch)])


def _run_nvcc(commands: list[list[str]], workdir: Path) -> list[tuple[list[str], int, str, float]]:
    """Run the nvcc commands concurrently in ``workdir``; (command, returncode, output, seconds) each."""

    def run(cmd: list[str]) -> tuple[list[str], int, str, float]:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return cmd, proc.returncode, proc.stdout, time.perf_counter() - t0

    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(run, commands))


def _query_host_library(path: Path, kernel_name: str, api: str) -> dict[str, Any]:
    """Param size, shared memory, block shape and epilogue kind from the freshly built host library."""
    lib = ctypes.CDLL(str(path))
    get = lambda suffix, restype: _function(lib, f"{kernel_name}_{suffix}", restype)  # noqa: E731
    info: dict[str, Any] = {
        "param_size": int(get("get_param_size", ctypes.c_int)()),
        "smem_bytes": int(get("shared_memory_size", ctypes.c_int)()),
    }
    if api == "3x":
        info["uses_default_epilogue"] = bool(get("uses_default_epilogue", ctypes.c_bool)())
        dim3 = type("dim3", (ctypes.Structure,), {"_fields_": [("x", ctypes.c_int), ("y", ctypes.c_int), ("z", ctypes.c_int)]})
        block = get("get_block_shape", dim3)()
        info["block"] = [block.x, block.y, block.z]
    return info


def _function(lib, name: str, restype):
    fn = getattr(lib, name)
    fn.restype = restype
    return fn


def build(spec: GemmKernelSpec, *, force: bool = False) -> tuple[GemmArtifact, bool]:
    """Emit and compile ``spec`` into the cache; returns (artifact, cache_hit). No GPU needed."""
    if not force:
        found = lookup(spec)
        if found is not None:
            return found, True
    from . import bridge

    t0 = time.perf_counter()
    emitted = emit(spec)
    key = content_key(emitted.device_source, emitted.host_source, _flags_text(spec), bridge.nvcc_version(),
                      spec.target_arch)
    directory = cache_dir("cutlass", "kernels") / f"{spec.name}-{key[:16]}"
    artifact = None if force else GemmArtifact.load(directory)
    hit = artifact is not None
    if artifact is None:
        artifact = _compile(spec, emitted, directory, key, t0)
    index_entry = {"directory": directory.name, "spec": spec.to_dict(), "kernel_name": emitted.kernel_name}
    atomic_write(cache_dir("cutlass", "index") / f"{spec.index_key()}.json", json.dumps(index_entry, indent=1).encode())
    return artifact, hit


def _compile(spec: GemmKernelSpec, emitted: EmittedGemm, directory: Path, key: str, t0: float) -> GemmArtifact:
    from . import bridge

    workdir = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=cache_dir("cutlass", "tmp")))
    try:
        (workdir / "device.cu").write_text(emitted.device_source)
        (workdir / "host.cu").write_text(emitted.host_source)
        device_cmd, host_cmd = _commands(spec, workdir)
        results = _run_nvcc([device_cmd, host_cmd], workdir)
        build_log = "".join(f"$ {' '.join(cmd)}\n[exit {rc}, {secs:.1f} s]\n{out}\n" for cmd, rc, out, secs in results)
        failed = [r for r in results if r[1] != 0]
        if failed:
            log_path = cache_dir("cutlass", "failed") / f"{spec.name}-{key[:16]}.log"
            atomic_write(log_path, (build_log + "\n// device.cu\n" + emitted.device_source).encode())
            outputs = "\n".join(out for _, _, out, _ in failed)
            raise CutlassBuildError(f"nvcc failed to build {spec.name} (log: {log_path}):\n{outputs}")
        info = _query_host_library(workdir / "host.so", emitted.kernel_name, spec.api)
        layout = argument_layout(emitted, info.get("uses_default_epilogue"), (EXAMPLE_M, EXAMPLE_N, EXAMPLE_K))
        epi = epilogues.get(spec.epilogue)
        meta = {
            "format": BUILD_FORMAT,
            "spec": spec.to_dict(),
            "kernel_name": emitted.kernel_name,
            "api": spec.api,
            "target_arch": spec.target_arch,
            "cluster": list(spec.cluster_shape) if spec.api == "3x" else [1, 1, 1],
            # launchable with programmatic dependent launch (it waits on the previous grid itself)
            "grid_dependency_control": bool(_device_flags(spec)),
            "pointers": ["A", "B", "C", "D", *[n for n, k in epi.inputs if k != "scalar" and n != "C"]],
            "scalars": [n for n, k in epi.inputs if k == "scalar"],
            "arguments": layout,
            "nvcc_version": bridge.nvcc_version(),
            "interface_version": bridge.interface_version(),
            "content_key": key,
            "build_seconds": round(time.perf_counter() - t0, 2),
            **info,
        }
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / "kernel.cubin", (workdir / "kernel.cubin").read_bytes())
        atomic_write(directory / "host.so", (workdir / "host.so").read_bytes())
        atomic_write(directory / "build.log", build_log.encode())
        atomic_write(directory / "device.cu", emitted.device_source.encode())
        atomic_write(directory / "meta.json", json.dumps(meta, indent=1).encode())  # written last: marks completion
        log.info("built %s in %.1f s", spec.name, meta["build_seconds"])
        return GemmArtifact(directory, meta)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
