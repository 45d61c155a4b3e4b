"""int8 x int8 GEMMs on CUTLASS kernels built ahead of time: ``int8_gemm`` and ``int8_gemm_requant``.

D[M, N] = epilogue(A[M, K] @ B[N, K]^T) with A the int8 activations and B the int8 weight in the
torch Linear layout. ``arch`` picks the kernel generation: 90 (wgmma + TMA, Hopper only), 80
(mma.sync, runs on Ampere and later), 75 (Turing mma.sync m8n8k16, runs on Turing and later); every
generation has every epilogue (EVT; Sm75 uses the Sm80 visitor). None takes the device's own (90 on
Hopper). Kernels come from the build cache (``scripts/build_kernels.py`` fills it); one missing
from the cache is built on first use (tens of seconds, logged).

Tiles come from ``tuning/default.json`` (overridden by ``tuning/<gpu name>.json``), per kernel
generation and M bucket ("small": M <= small_m_max, "medium": M <= medium_m_max, else "large").
A bucket's entry may carry ``float_out``: a complete tile (the same keys as the entry) used instead
of the entry's own when D is f16, bf16 or f32, for tiles whose int8 (and int32) outputs do not build
or are slower.
"""
from __future__ import annotations

import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import epilogues

from .gemm_build import GemmKernelSpec, build, lookup
from .gemm_fast import FastPath
from .gemm_launch import GemmKernel

log = logging.getLogger(__name__)

__all__ = ["Int8Gemm", "get_plan", "int8_gemm", "int8_gemm_checked", "int8_gemm_requant", "kernel_spec", "configured_specs", "resolve_arch",
           "alignment_D", "target_arch_for", "bucket_for", "BUCKETS", "FLOAT_OUTPUTS"]

TUNING_DIR = Path(__file__).resolve().parent / "tuning"
_DTYPE_NAMES = {torch.int32: "s32", torch.int8: "s8", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.float32: "f32"}
_ELEMENT_BYTES = {"s8": 1, "f16": 2, "bf16": 2, "s32": 4, "f32": 4}
# M buckets, smallest first: "small" M <= small_m_max < "medium" M <= medium_m_max < "large".
BUCKETS = ("small", "medium", "large")
# Output types a bucket's "float_out" tile applies to.
FLOAT_OUTPUTS = frozenset({"f16", "bf16", "f32"})
# A and B rows must be 16-byte aligned: every kernel here loads int8 operands 16 elements at a time
# (cp.async / TMA), the only alignment the generator offers for int8 TensorOp GEMMs.
ALIGNMENT_K = 16


def alignment_D(kernel_cc: int, element_D: str) -> int:
    """Elements per access of D: 16 bytes, except the 2.x int32 epilogue, built with 8 (generator's)."""
    if kernel_cc != 90 and element_D == "s32":
        return 8
    return 16 // _ELEMENT_BYTES[element_D]


def target_arch_for(kernel_cc: int, device_cc: int) -> str:
    """nvcc target for a kernel generation on a GPU of ``device_cc``: sm_90a for Sm90 kernels."""
    if kernel_cc == 90:
        if device_cc != 90:
            raise ValueError(f"Sm90 kernels need a Hopper GPU (compute capability 9.0), not {device_cc / 10:.1f}")
        return "90a"
    if device_cc < kernel_cc:
        raise ValueError(f"Sm{kernel_cc} kernels cannot run on compute capability {device_cc / 10:.1f}")
    return str(device_cc)


def resolve_arch(arch: int | None, device_cc: int) -> int:
    """The kernel generation for ``arch`` (None: the device's own) on a GPU of ``device_cc``."""
    if arch is None:
        if device_cc == 90:
            return 90
        if 80 <= device_cc < 90:
            return 80
        if device_cc == 75:
            return 75
        raise ValueError(f"no int8 CUTLASS kernels for compute capability {device_cc / 10:.1f}; pass arch=80 or 75")
    if arch not in (75, 80, 90):
        raise ValueError(f"arch must be None, 75, 80 or 90, got {arch!r}")
    target_arch_for(arch, device_cc)  # raises if the GPU cannot run it
    return arch


def _gpu_file_name(gpu_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_") + ".json"


@functools.lru_cache(maxsize=None)
def tuning(gpu_name: str | None = None) -> dict[str, Any]:
    """Tile table: default.json updated (per kernel cc and bucket) by ``<gpu_name>.json`` if present.

    A bucket entry of the GPU file replaces default.json's entry whole (its ``float_out`` too)."""
    table = json.loads((TUNING_DIR / "default.json").read_text())
    source = TUNING_DIR / "default.json"
    if gpu_name:
        path = TUNING_DIR / _gpu_file_name(gpu_name)
        if path.is_file():
            override = json.loads(path.read_text())
            for key, value in override.items():
                if isinstance(value, dict) and isinstance(table.get(key), dict):
                    table[key] = {**table[key], **value}
                else:
                    table[key] = value
            source = path
            log.info("int8 GEMM tiles from %s", path)
    small, medium = table.get("small_m_max"), table.get("medium_m_max")
    if not (isinstance(small, int) and isinstance(medium, int) and 0 < small <= medium):
        raise ValueError(f"{source}: need integers 0 < small_m_max <= medium_m_max, got "
                         f"small_m_max={small!r}, medium_m_max={medium!r}")
    return table


def _bucket_limits(table: dict[str, Any]) -> tuple[int, int]:
    return table["small_m_max"], table["medium_m_max"]


def bucket_for(M: int, gpu_name: str | None = None) -> str:
    """The M bucket ("small", "medium" or "large") of a GEMM with M rows under ``gpu_name``'s tiles."""
    return _bucket(M, tuning(gpu_name))


def _bucket(M: int, table: dict[str, Any]) -> str:
    small, medium = _bucket_limits(table)
    return "small" if M <= small else "medium" if M <= medium else "large"


def kernel_spec(kernel_cc: int, target_arch: str, epilogue: str, element_D: str, bucket: str,
                gpu_name: str | None = None) -> GemmKernelSpec:
    """The spec of the kernel used for (kernel generation, target, epilogue, output type, M bucket).

    A float D (f16, bf16, f32) takes the bucket's ``float_out`` tile where the entry has one."""
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {BUCKETS}, got {bucket!r}")
    generation = tuning(gpu_name).get(str(kernel_cc), {})
    if bucket not in generation:
        raise ValueError(f"no {bucket!r} tile for Sm{kernel_cc} in the tuning tables (default.json"
                         f"{' + ' + _gpu_file_name(gpu_name) if gpu_name else ''})")
    tile = generation[bucket]
    if element_D in FLOAT_OUTPUTS and "float_out" in tile:
        tile = tile["float_out"]
    return GemmKernelSpec(
        kernel_cc=kernel_cc, target_arch=target_arch, epilogue=epilogue, element_D=element_D,
        threadblock_shape=tuple(tile["threadblock_shape"]), stages=tile.get("stages"),
        warp_count=tuple(tile["warp_count"]) if tile.get("warp_count") else None,
        cluster_shape=tuple(tile.get("cluster_shape", (1, 1, 1))),
        kernel_schedule=tile.get("kernel_schedule"), epilogue_schedule=tile.get("epilogue_schedule"),
        tile_scheduler=tile.get("tile_scheduler"), alignment_D=alignment_D(kernel_cc, element_D))


def configured_specs(target: int | str, epilogue_names: list[str] | None = None,
                     buckets: tuple[str, ...] = BUCKETS, gpu_name: str | None = None) -> list[GemmKernelSpec]:
    """Every kernel ``int8_gemm`` may launch on a GPU of compute capability ``target``, each once
    (buckets sharing a tile share a kernel)."""
    device_cc = int(str(target).rstrip("a"))
    specs: dict[GemmKernelSpec, None] = {}
    for kernel_cc in (90, 80, 75):
        if kernel_cc > device_cc or (kernel_cc == 90 and device_cc != 90):
            continue
        for name in epilogue_names or epilogues.names():
            epi = epilogues.get(name)
            for element_D in epi.output_dtypes:
                for bucket in buckets:
                    specs.setdefault(kernel_spec(kernel_cc, target_arch_for(kernel_cc, device_cc), name, element_D,
                                                 bucket, gpu_name))
    return list(specs)


@dataclass(frozen=True)
class _Slots:
    """The kernel's pointer list: its length, the slots of A, B, D and C (-1: none), whether C
    takes D's pointer, the always-set pointers, and per epilogue tensor input (name, kind, slot,
    required)."""

    count: int
    A: int
    B: int
    D: int
    C: int
    C_is_D: bool
    always: int  # bit mask of the pointers every call sets (A, B, D and C when it is D)
    inputs: tuple[tuple[str, str, int, bool], ...]


class Int8Gemm:
    """One int8 GEMM kernel (a plan): validation of the operands and the launch."""

    def __init__(self, spec: GemmKernelSpec):
        self.spec = spec
        self.epilogue = epilogues.get(spec.epilogue)
        self.out_dtype = epilogues.OUTPUT_DTYPES[spec.element_D]
        self._kernel: GemmKernel | None = None
        self._inputs = self.epilogue.tensor_inputs
        self._scalars = tuple(n for n, k in self.epilogue.inputs if k == "scalar")
        self._c_is_d = spec.api == "2x" and not self.epilogue.evt
        self._slots: _Slots | None = None
        self._fast: FastPath | None | bool = False  # False: not set up yet; None: Python path only

    @property
    def kernel(self) -> GemmKernel:
        """The loaded kernel; built into the cache first if ``build_kernels.py`` did not."""
        if self._kernel is None:
            artifact = lookup(self.spec)
            if artifact is None:
                log.warning("CUTLASS kernel %s is not in the cache; building it now (run "
                            "scripts/build_kernels.py ahead of time to avoid this)", self.spec.name)
                artifact, _ = build(self.spec)
            self._kernel = GemmKernel(artifact)
        return self._kernel

    def __call__(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                 **inputs: Any) -> torch.Tensor:
        M, N, K, pointers, nonnull, scalars, out = self._arguments(A, B, out, None, inputs)
        self.kernel.launch(M, N, K, pointers, scalars, device=A.get_device(), nonnull=nonnull)
        return out

    def launch_checked(self, A: torch.Tensor, B: torch.Tensor, device: int, out: torch.Tensor | None,
                       inputs: dict[str, Any]) -> torch.Tensor:
        """__call__ for operands the public API has already checked (int8, 2-D, contiguous, same K,
        A and B on ``device``): the shape rules of this kernel and the inputs are still checked.

        A shape seen before goes through the C++ path (gemm_fast), unless it hands the call back."""
        fast = self._fast
        if fast:
            D = fast.run(A, B, device, out, inputs)
            if D is not None:
                return D
        M, N, K, pointers, nonnull, scalars, out = self._arguments(A, B, out, device, inputs)
        self._kernel.launch(M, N, K, pointers, scalars, device=device, nonnull=nonnull)
        if fast is False:
            fast = self._fast = FastPath.create(self._kernel, self._slots, self.out_dtype, self.spec.alignment_D,
                                                bool(self._scalars))
        if fast:
            fast.register(M, N, K, nonnull, device, pointers)
        return out

    def launch_arguments(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                         _checked_device: int | None = None,
                         **inputs: Any) -> tuple[int, int, int, list[int], tuple[float, ...], torch.Tensor]:
        """Validate the operands; (M, N, K, pointers in kernel order, scalars, D) for the launch."""
        M, N, K, pointers, _, scalars, out = self._arguments(A, B, out, _checked_device, inputs)
        return M, N, K, pointers, scalars, out

    def _arguments(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, _checked_device: int | None,
                   inputs: dict[str, Any]) -> tuple[int, int, int, list[int], int, tuple[float, ...], torch.Tensor]:
        """launch_arguments plus the bit mask of non-null pointers, with the inputs as one dict.

        A per-call host path: cheap inline checks, with the general checks (and their messages)
        called only when an inline check fails."""
        if _checked_device is None:
            M, N, K = _check_operands(A, B, self.spec.alignment_D, self.spec.element_D)
            device = A.get_device()
        else:  # types, ranks, contiguity and devices already checked by the caller
            M, K = A.shape
            N = B.shape[0]
            if not (M and N and K) or K % ALIGNMENT_K or N % self.spec.alignment_D:
                _check_sizes(M, N, K, self.spec.alignment_D, self.spec.element_D)
            device = _checked_device
        slots = self._slots or self._pointer_slots()
        pointers = [0] * slots.count
        pointers[slots.A] = a = A.data_ptr()
        pointers[slots.B] = b = B.data_ptr()
        misaligned = a | b
        nonnull = slots.always
        given = 0
        for name, kind, slot, required in slots.inputs:
            value = inputs.get(name)
            if value is None:
                given += name in inputs  # passed as None: absent
                if required:
                    raise ValueError(f"epilogue {self.spec.epilogue!r} needs {name} ({kind}, float32)")
                continue
            given += 1
            if not (value.__class__ is torch.Tensor and value.dtype is torch.float32
                    and (value.numel() == M if kind == "per_row" else value.numel() == N if kind == "per_col"
                         else value.shape == (M, N))
                    and value.is_contiguous() and value.get_device() == device):
                _check_input(name, kind, value, M, N, device)
            pointers[slot] = p = value.data_ptr()
            misaligned |= p
            nonnull |= 1 << slot
        if self._scalars:
            scalars = tuple(float(inputs[name]) if name in inputs else _missing(self.spec.epilogue, name)
                            for name in self._scalars)
            given += len(scalars)
        else:
            scalars = ()
        if given != len(inputs):
            unexpected = sorted(set(inputs) - set(self.epilogue.input_names))
            raise TypeError(f"epilogue {self.spec.epilogue!r} takes {list(self.epilogue.input_names)}; "
                            f"unexpected {unexpected or sorted(k for k, v in inputs.items() if v is None)}")
        if out is None:
            # sizes as separate ints: torch's argument parser takes them faster than a tuple
            out = torch.empty(M, N, dtype=self.out_dtype, device=_cuda_device(device))
        elif out.shape != (M, N) or out.dtype != self.out_dtype or not out.is_contiguous() or out.get_device() != device:
            raise ValueError(f"out must be a contiguous {self.out_dtype} tensor [M={M}, N={N}] on {A.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        pointers[slots.D] = d = out.data_ptr()
        misaligned |= d
        if slots.C_is_D:
            pointers[slots.C] = d  # 2.x LinearCombination reads C only when beta != 0 (never here)
        if misaligned & 15:
            bad = [n for n, p in zip(self.kernel.pointer_names, pointers) if p & 15]
            raise ValueError(f"{', '.join(bad)} must start on a 16-byte boundary (vectorized / TMA access); "
                             f"a storage offset makes them misaligned: pass fresh contiguous tensors")
        return M, N, K, pointers, nonnull, scalars, out

    def _pointer_slots(self) -> "_Slots":
        """Where each operand goes in the kernel's pointer list (made once, on the first call)."""
        names = self.kernel.pointer_names
        index = {name: i for i, name in enumerate(names)}
        inputs = tuple((name, kind, index[name], name not in self.epilogue.optional)
                       for name, kind in self._inputs if name in index)
        missing = [name for name, _ in self._inputs if name not in index]
        if missing or not {"A", "B", "D"} <= set(index):
            raise RuntimeError(f"kernel {self.spec.name} has pointers {names}; expected A, B, D and "
                               f"{[n for n, _ in self._inputs]}")
        c_is_d = self._c_is_d and "C" in index and "C" not in {n for n, _ in self._inputs}
        always = (1 << index["A"]) | (1 << index["B"]) | (1 << index["D"]) | ((1 << index["C"]) if c_is_d else 0)
        self._slots = _Slots(len(names), index["A"], index["B"], index["D"], index.get("C", -1), c_is_d, always,
                             inputs)
        return self._slots


def _missing(epilogue: str, name: str):
    raise ValueError(f"epilogue {epilogue!r} needs the scalar {name}")


def _check_sizes(M: int, N: int, K: int, align_D: int, element_D: str) -> None:
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"empty GEMM: M={M}, N={N}, K={K}")
    if K % ALIGNMENT_K:
        raise ValueError(f"K={K} must be a multiple of {ALIGNMENT_K} (int8 rows of A and B are read in "
                         f"16-byte vectors); pad A [M={M}, K] and B [N={N}, K] with zero columns")
    if N % align_D:
        raise ValueError(f"N={N} must be a multiple of {align_D} for {element_D} output (16-byte stores of D)")


def _check_operands(A: torch.Tensor, B: torch.Tensor, align_D: int, element_D: str) -> tuple[int, int, int]:
    if A.dtype != torch.int8 or B.dtype != torch.int8:
        raise TypeError(f"A and B must be int8, got A {A.dtype} and B {B.dtype}")
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"A must be [M, K] and B [N, K], got A {tuple(A.shape)} and B {tuple(B.shape)}")
    M, K = A.shape
    N, K_B = B.shape
    if K != K_B:
        raise ValueError(f"A is [M={M}, K={K}] but B is [N={N}, K={K_B}]: K must match")
    _check_sizes(M, N, K, align_D, element_D)
    if not A.is_cuda or B.get_device() != A.get_device():
        raise ValueError(f"A and B must be on the same CUDA device, got {A.device} and {B.device}")
    if not (A.is_contiguous() and B.is_contiguous()):
        raise ValueError("A [M, K] and B [N, K] must be contiguous row-major tensors")
    return M, N, K


def _check_input(name: str, kind: str, value: torch.Tensor, M: int, N: int, device: int) -> None:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor")
    numel = value.numel()
    if (numel != M if kind == "per_row" else numel != N if kind == "per_col"
            else tuple(value.shape) != (M, N)):
        shape = {"per_row": f"[M={M}] or [M, 1]", "per_col": f"[N={N}] or [1, N]", "matrix": f"[M={M}, N={N}]"}[kind]
        raise ValueError(f"{name} must be {shape}, got {tuple(value.shape)}")
    if value.get_device() != device or not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous on cuda:{device}, got {value.device}")


@functools.lru_cache(maxsize=None)
def _device_info(device: int) -> tuple[int, str]:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor, torch.cuda.get_device_name(device)


_plans: dict[tuple, Int8Gemm] = {}


def get_plan(device: int, arch: int | None, epilogue: str, element_D: str | None, M: int) -> Int8Gemm:
    """The (cached) plan for a GEMM of M rows on ``device`` with this arch, epilogue and D type."""
    device_cc, gpu_name = _device_info(device)
    table = tuning(gpu_name)
    bucket = _bucket(M, table)
    key = (device, arch, epilogue, element_D, bucket)
    plan = _plans.get(key)
    if plan is None:
        epi = epilogues.get(epilogue)
        kernel_cc = resolve_arch(arch, device_cc)
        element = element_D or epi.default_output
        if element not in epi.output_dtypes:
            raise ValueError(f"epilogue {epilogue!r} writes {list(epi.output_dtypes)}, not {element!r}")
        spec = kernel_spec(kernel_cc, target_arch_for(kernel_cc, device_cc), epilogue, element, bucket, gpu_name)
        plan = _plans[key] = Int8Gemm(spec)
    return plan


_DEVICES: dict[int, torch.device] = {}  # device index -> torch.device (made once, not per call)


def _cuda_device(index: int) -> torch.device:
    found = _DEVICES.get(index)
    if found is None:
        found = _DEVICES[index] = torch.device("cuda", index)
    return found


_fast_plans: dict[tuple, Int8Gemm] = {}  # (device, arch, epilogue, out_dtype, bucket index) -> plan
_bucket_limits_by_device: dict[int, tuple[int, int]] = {}  # device -> (small_m_max, medium_m_max)


def int8_gemm(A: torch.Tensor, B: torch.Tensor, epilogue: str = "none", *, arch: int | None = None,
              out_dtype: torch.dtype | str | None = None, out: torch.Tensor | None = None,
              _checked: bool = False, **epilogue_args: Any) -> torch.Tensor:
    """D = epilogue(A @ B^T) with A [M, K] int8 and B [N, K] int8, on a CUTLASS kernel.

    ``_checked``: the caller (``cutlass_ops.int8_gemm``) has checked the operands' types, ranks,
    contiguity and devices; only the kernel's own rules are checked again.

    ``epilogue`` names an entry of the ``epilogues`` registry ("none" -> int32 D; "dequant",
    "dequant_relu", "dequant_relu6" -> f16/bf16/f32 with scale_row [M], scale_col [N], bias [N];
    "requant"; "kblock_accumulate"); its inputs are passed as keyword arguments. ``arch`` forces a
    kernel generation (75, 80, 90). Requires K % 16 == 0 and N a multiple of 16 bytes of D.
    """
    if not _checked and (not isinstance(A, torch.Tensor) or not A.is_cuda or A.dim() != 2):
        raise ValueError(f"A must be a 2-D CUDA tensor [M, K], got {type(A).__name__} "
                         f"{tuple(getattr(A, 'shape', ()))} on {getattr(A, 'device', None)}")
    if _checked:
        return int8_gemm_checked(A, B, epilogue, arch, out_dtype, out, epilogue_args)
    return _plan_for(A, A.get_device(), epilogue, arch, out_dtype)(A, B, out=out, **epilogue_args)


def int8_gemm_checked(A: torch.Tensor, B: torch.Tensor, epilogue: str, arch: int | None,
                      out_dtype: torch.dtype | str | None, out: torch.Tensor | None,
                      inputs: dict[str, Any], device: int | None = None) -> torch.Tensor:
    """int8_gemm for operands the caller has checked (int8, 2-D, contiguous, same K, A and B on one
    CUDA device, ``device`` when given), the epilogue inputs as one dict: the per-call path of
    ``cutlass_ops.int8_gemm``."""
    if device is None:
        device = A.get_device()
    return _plan_for(A, device, epilogue, arch, out_dtype).launch_checked(A, B, device, out, inputs)


def _plan_for(A: torch.Tensor, device: int, epilogue: str, arch: int | None,
              out_dtype: torch.dtype | str | None) -> Int8Gemm:
    """The loaded plan for A's device and M bucket (two int compares and one dict lookup per call)."""
    limits = _bucket_limits_by_device.get(device)
    if limits is None:
        limits = _bucket_limits_by_device[device] = _bucket_limits(tuning(_device_info(device)[1]))
    M = A.shape[0]
    # 0, 1, 2: the index in BUCKETS of _bucket(M) (two int compares, no table lookups per call)
    key = (device, arch, epilogue, out_dtype, 0 if M <= limits[0] else 1 if M <= limits[1] else 2)
    plan = _fast_plans.get(key)
    if plan is None:
        element_D = _DTYPE_NAMES.get(out_dtype, out_dtype) if out_dtype is not None else None
        plan = _fast_plans[key] = get_plan(device, arch, epilogue, element_D, M)
        plan.kernel  # load it now: launch_checked expects a loaded kernel
    return plan


def int8_gemm_requant(A_q: torch.Tensor, W_q: torch.Tensor, M_scale: torch.Tensor,
                      fused_bias: torch.Tensor | None, *, clamp: tuple[int, int] = (-128, 127),
                      arch: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """O_q = clamp(round_half_even(M_scale[n] * (A_q @ W_q^T + fused_bias[n])), *clamp) as int8."""
    lo, hi = (int(clamp[0]), int(clamp[1]))
    if not -128 <= lo <= hi <= 127:
        raise ValueError(f"clamp must satisfy -128 <= lo <= hi <= 127, got {clamp}")
    if (lo, hi) == (-128, 127):
        return int8_gemm(A_q, W_q, "requant", arch=arch, out=out, multiplier=M_scale, fused_bias=fused_bias)
    return int8_gemm(A_q, W_q, "requant_clamp", arch=arch, out=out, multiplier=M_scale, fused_bias=fused_bias,
                     lo=float(lo), hi=float(hi))
