"""The int8 GEMM plan: ``plan = get_plan(device, arch, epilogue, element_D, M)``, then
``plan(A, B, out=None, **epilogue_inputs)`` per call.

D[M, N] = epilogue(A[M, K] @ B[N, K]^T) with A the int8 activations and B the int8 weight in the
torch Linear layout. A plan is one kernel (:class:`GemmKernelSpec`, picked by :mod:`.tuning` per M
bucket), loaded lazily from the build cache (built first if ``scripts/build_kernels.py`` did not).

The operands' general rules (int8, 2-D, contiguous, the same K, one CUDA device) are the caller's
(``cutlass_ops.int8_gemm`` checks them once); a plan checks only its kernel's rules (the epilogue's
inputs, D, 16-byte aligned pointers) with cheap inline tests, calling the precise checks for their
messages only when one fails. Any N and K: an N that is not a multiple of 16 bytes of D runs on the
plan's any-N kernel (:func:`.tuning.any_n_spec`: D stored one element at a time, nothing padded along N;
Sm75 plans have none and pad N), a K that is not a multiple of 16 on zero-padded A and B (:mod:`.padding`).
A shape seen before goes through the C++ per-call path (:mod:`.fast`), which hands back whatever is not
the plain case.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

import epilogues
from custom_kernels.device import capability, sm_count

from .build import build, lookup
from .fast import FastPath
from .kernel import GemmKernel
from .padding import pad_operands, padded_sizes, unpad_registration, unpad_rows
from .spec import GemmKernelSpec
from .tuning import (ALIGNMENT_K, ANY_N_LARGE_TILE, ANY_N_NARROW_TILE, ANY_N_TILE, BUCKETS, any_n_spec, bucket_limits,
                     kernel_spec, resolve_arch, target_arch_for)

log = logging.getLogger(__name__)

__all__ = ["Int8Gemm", "get_plan", "plan_for", "check_sizes"]

# pads_N on Sm90 plans: padded at M <= this, and where the any-N grid has at least this many waves of CTAs (1.9:
# the H200's M = 1024, N = 1000 int8 D any-N grid of 256 CTAs on 132 SMs is one where padding won)
PADDED_N_MAX_SMALL_M = 64
PADDED_N_WAVES = 1.9

_DTYPE_NAMES = {torch.int32: "s32", torch.int8: "s8", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.float32: "f32"}


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
    """One int8 GEMM kernel (a plan): ``plan(A, B, out=None, **epilogue_inputs)`` launches it on
    torch's current stream and returns D. ``any_n``: the plan that takes the N this kernel cannot store
    (N % spec.alignment_D != 0), or None (pad N); ``any_n_narrow``: the any-N plan of a narrower tile, taken
    where ``any_n``'s grid would leave SMs idle; ``any_n_wide``: the large bucket's any-N plan of a wider
    tile, taken where its tiles alone fill the GPU (:meth:`any_n_for`); any of them may be None."""

    def __init__(self, spec: GemmKernelSpec, any_n: "Int8Gemm | None" = None, any_n_wide: "Int8Gemm | None" = None,
                 any_n_narrow: "Int8Gemm | None" = None):
        self.spec = spec
        self.any_n = any_n
        self.any_n_wide = any_n_wide
        self.any_n_narrow = any_n_narrow
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
        return self.run(A, B, out, inputs, A.get_device())

    def run(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, inputs: dict[str, Any],
            device: int) -> torch.Tensor:
        """``plan(A, B, out, **inputs)`` with the inputs as one dict and A's device index given.

        The C++ path takes a shape seen before unless it hands the call back (None). An N this kernel cannot
        store goes to the any-N plan (:meth:`any_n_for`) or runs over N padded (C++ once Python has padded)."""
        N = B.shape[0]
        padded_N = bool(N % self.spec.alignment_D)
        if padded_N:
            any_n = self.any_n_for(A.shape[0], N, device)
            if any_n is not None:
                return any_n.run(A, B, out, inputs, device)  # it pads K only, if at all
        fast = self._fast
        if fast:
            D = fast.run(A, B, device, out, inputs, False, padded_N)
            if D is not None:
                return D
        K = A.shape[1]
        if not (A.shape[0] and N and K):
            return self._empty(A, B, out, inputs, device)
        if K % ALIGNMENT_K or padded_N:
            return self._run_padded(A, B, out, inputs, device)
        M, N, K, pointers, nonnull, scalars, out = self._arguments(A, B, out, device, inputs)
        kernel = self._kernel or self.kernel
        kernel.launch(M, N, K, pointers, scalars, device=device, nonnull=nonnull)
        if fast is False:
            fast = self._fast = FastPath.create(kernel, self._slots, self.out_dtype, self.spec.alignment_D,
                                                bool(self._scalars))
        if fast:
            fast.register(M, N, K, nonnull, device, pointers)
        return out

    def _run_padded(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, inputs: dict[str, Any],
                     device: int) -> torch.Tensor:
        """K not a multiple of 16 or N not of alignment_D: this kernel on zero-padded operands (exact:
        zero K columns add 0 to the accumulator), D = D_pad[:, :N] as a contiguous [M, N] (or in ``out``) by one
        copy kernel (:func:`.padding.unpad_rows`).

        The inputs and ``out`` are checked against the caller's M and N first, so errors name those."""
        M, K = A.shape
        N = B.shape[0]
        for name, kind in self._inputs:
            value = inputs.get(name)
            if value is not None:
                _check_input(name, kind, value, M, N, device)
        if out is not None and (out.shape != (M, N) or out.dtype != self.out_dtype or not out.is_contiguous()
                                or out.get_device() != device):
            _bad_out(out, M, N, self.out_dtype, A)
        N_pad, K_pad = padded_sizes(N, K, self.spec.alignment_D)
        A_pad, B_pad, inputs_pad = pad_operands(A, B, inputs, self._inputs, N_pad, K_pad)
        if N_pad == N:  # only K padded: D_pad is D
            return self.run(A_pad, B_pad, out, inputs_pad, device)
        D_pad = self.run(A_pad, B_pad, None, inputs_pad, device)
        D = unpad_rows(D_pad, N, out)
        fast = self._fast
        if fast and K_pad == K and not torch.cuda.is_current_stream_capturing():
            # B's and the per-column inputs' kept copies (made outside capture): the next call takes C++
            pairs = [(B, B_pad)] + [(inputs[name], inputs_pad[name]) for name, kind in self._inputs
                                    if kind == "per_col" and inputs.get(name) is not None]
            fast.register_padded(pairs, N_pad, unpad_registration(device, N, D.element_size()))
        return D

    def run_fast(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, inputs: dict[str, Any],
                 device: int) -> torch.Tensor | None:
        """The C++ per-call path alone, for ``cutlass_ops.int8_gemm``: D, or None when it hands the call
        back (then :meth:`run`), which includes per-column inputs not yet marked by :meth:`mark_finite`.
        An N this kernel cannot store goes to the any-N plan's C++ path, or (:meth:`any_n_for` None) to this
        plan's on the padded copies registered by the Python path's first such call."""
        N = B.shape[0]
        any_n = self.any_n_for(A.shape[0], N, device) if N % self.spec.alignment_D else None
        fast = self._fast
        D = fast.run(A, B, device, out, inputs, True, bool(N % self.spec.alignment_D) and any_n is None) \
            if fast else None
        if D is None and any_n is not None:
            return any_n.run_fast(A, B, out, inputs, device)
        return D

    def any_n_for(self, M: int, N: int, device: int) -> "Int8Gemm | None":
        """The any-N plan for an unaligned N, or None: this plan runs on N padded (Sm75 plans; and outside
        CUDA-graph capture where :meth:`pads_N` says so). While capturing nothing is kept, so a padded call
        would copy B in every replay: graphs take the any-N kernels (:meth:`_any_n_plan`)."""
        if self.any_n is None or not N % self.spec.alignment_D:
            return None
        if self.pads_N(M, N, device) and not torch.cuda.is_current_stream_capturing():
            return None
        return self._any_n_plan(M, N, device)

    def _any_n_plan(self, M: int, N: int, device: int) -> "Int8Gemm":
        """Of the any-N plans, the wide-tile one where its tiles fill the SMs (H200, M = 1024: N = 4097 1.70x the
        aligned time per element against the small tile's 2.48x, but N = 257 1.96x against 1.03x: 24 CTAs);
        the narrow-tile one where the any-N tile's would not (H200, M = 64: N = 257 1.41-1.55x -> 1.26-1.33x,
        N = 1000 1.57-1.64x -> 1.45-1.49x; tuning.ANY_N_NARROW_TILE); else the any-N tile's."""
        sms = sm_count(device)
        wide = self.any_n_wide
        if wide is not None and _ctas(wide, M, N) >= sms:
            return wide
        narrow = self.any_n_narrow
        if narrow is not None and _ctas(self.any_n, M, N) < sms:
            return narrow
        return self.any_n

    def pads_N(self, M: int, N: int, device: int) -> bool:
        """Whether an unaligned N runs on this plan's kernel over N_pad (B's padded copy kept, then unpad_rows
        into D) rather than on an any-N kernel, outside graph capture. At M = 1 D_pad's one row is D: 1.00-1.04x
        the aligned time per element (H200) against the any-N kernel's 1.4-1.55x. On Sm90 plans also at
        M <= 64, where the any-N kernels are a few CTAs streaming K alone (H200, M = 2..64, N = 257 / 1000 / 4097,
        K = 4096: 1.12-1.26x against 1.27-1.49x), and where the any-N grid takes about two waves or more of its
        tiles while the padded N adds no wave of this kernel's (M = 1024 N = 1000 int8 D: 1.20x against 1.53x;
        M = 2048 / 4096, N = 1000 1.22-1.25x against 1.79-2.57x). Elsewhere the any-N kernels won or tied (M =
        128..512, where the aligned medium tiles are slow; N = 4097 at M = 1024, whose padded grid of 136 tiles
        takes a second wave: 1.74-1.89x against 1.73-1.74x; docs/design.md section 2)."""
        if M == 1:
            return True
        if self.spec.kernel_cc != 90 or self.any_n is None:
            return False
        if M <= PADDED_N_MAX_SMALL_M:
            return True
        sms = sm_count(device)
        if _ctas(self._any_n_plan(M, N, device), M, N) < PADDED_N_WAVES * sms:
            return False
        align = self.spec.alignment_D
        return -(-_ctas(self, M, N + align - N % align) // sms) == -(-_ctas(self, M, N - N % align) // sms)

    def mark_finite(self, tensors: list[torch.Tensor]) -> None:
        """Per-column inputs checked for NaN / Inf, so that the C++ path takes them from now on (the
        extension keeps one set for every plan: either plan's path marks them)."""
        for plan in (self, self.any_n, self.any_n_narrow, self.any_n_wide):
            if plan is not None and plan._fast:
                plan._fast.mark_finite(tensors)
                return

    def _empty(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, inputs: dict[str, Any],
               device: int) -> torch.Tensor:
        """M, N or K = 0, without a launch: an empty D, or (K = 0) the epilogue of a zero accumulator."""
        M, N = A.shape[0], B.shape[0]
        if out is None:
            out = torch.empty(M, N, dtype=self.out_dtype, device=A.device)
        elif out.shape != (M, N) or out.dtype != self.out_dtype or out.get_device() != device:
            raise ValueError(f"out must be a {self.out_dtype} tensor [M={M}, N={N}] on {A.device}, "
                             f"got {out.dtype} {tuple(out.shape)} on {out.device}")
        if M and N:  # K = 0: the accumulator is zero; the epilogue's float64 reference gives D
            accum = torch.zeros(M, N, dtype=torch.float64)
            out.copy_(self.epilogue.reference(accum, self.spec.element_D, **inputs))
        return out

    def launch_arguments(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                         **inputs: Any) -> tuple[int, int, int, list[int], tuple[float, ...], torch.Tensor]:
        """Check the operands against this kernel; (M, N, K, pointers in kernel order, scalars, D)."""
        M, N, K, pointers, _, scalars, out = self._arguments(A, B, out, A.get_device(), inputs)
        return M, N, K, pointers, scalars, out

    def _arguments(self, A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None, device: int,
                   inputs: dict[str, Any]) -> tuple[int, int, int, list[int], int, tuple[float, ...], torch.Tensor]:
        """launch_arguments plus the bit mask of non-null pointers, with the inputs as one dict.

        A per-call host path: cheap inline checks, with the precise checks (and their messages)
        called only when an inline check fails."""
        M, K = A.shape
        N = B.shape[0]
        if not (M and N and K) or K % ALIGNMENT_K or N % self.spec.alignment_D:
            check_sizes(M, N, K, self.spec.alignment_D, self.spec.element_D)
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
            _bad_out(out, M, N, self.out_dtype, A)
        pointers[slots.D] = d = out.data_ptr()
        misaligned |= d
        if slots.C_is_D:
            pointers[slots.C] = d  # 2.x LinearCombination reads C only when beta != 0 (never here)
        if misaligned & 15:
            bad = [n for n, p in zip(self.kernel.pointer_names, pointers) if p & 15]
            raise ValueError(f"{', '.join(bad)} must start on a 16-byte boundary (vectorized / TMA access); "
                             f"a storage offset makes them misaligned: pass fresh contiguous tensors")
        return M, N, K, pointers, nonnull, scalars, out

    def _pointer_slots(self) -> _Slots:
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


def _bad_out(out: torch.Tensor, M: int, N: int, dtype: torch.dtype, A: torch.Tensor):
    raise ValueError(f"out must be a contiguous {dtype} tensor [M={M}, N={N}] on {A.device}, "
                     f"got {out.dtype} {tuple(out.shape)} on {out.device}")


def check_sizes(M: int, N: int, K: int, align_D: int, element_D: str) -> None:
    """The kernels' own size rules: a non-empty problem, K a multiple of 16, N of D's alignment (a plan
    runs other sizes on padded operands; ``launch_arguments``, which launches as given, refuses them)."""
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"empty GEMM: M={M}, N={N}, K={K}")
    if K % ALIGNMENT_K:
        raise ValueError(f"K={K} must be a multiple of {ALIGNMENT_K} (int8 rows of A and B are read in "
                         f"16-byte vectors); pad A [M={M}, K] and B [N={N}, K] with zero columns")
    if N % align_D:
        raise ValueError(f"N={N} must be a multiple of {align_D} for {element_D} output (16-byte stores of D)")


def _ctas(plan: Int8Gemm, M: int, N: int) -> int:
    """CTAs of ``plan``'s grid for an M x N problem."""
    tile_M, tile_N = plan.spec.threadblock_shape[:2]
    return -(-M // tile_M) * -(-N // tile_N)


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


# ------------------------------------------------------------------------------------------------
# the plan cache: one plan per (device, arch, epilogue, D type, M bucket) - a bounded set
# ------------------------------------------------------------------------------------------------

_gpu_names: dict[int, str] = {}


def _gpu_name(device: int) -> str:
    name = _gpu_names.get(device)
    if name is None:
        name = _gpu_names[device] = torch.cuda.get_device_name(device)
    return name


_plans: dict[tuple, Int8Gemm] = {}  # (device, arch, epilogue, element_D, bucket) -> plan
_any_n_plans: dict[tuple, Int8Gemm] = {}  # (device, any-N spec) -> its plan, shared by the buckets' plans


def get_plan(device: int, arch: int | None, epilogue: str, element_D: str | None, M: int) -> Int8Gemm:
    """The (cached) plan for a GEMM of M rows on ``device`` with this arch, epilogue and D type."""
    gpu_name = _gpu_name(device)
    small, medium = bucket_limits(gpu_name)
    bucket = BUCKETS[0 if M <= small else 1 if M <= medium else 2]
    key = (device, arch, epilogue, element_D, bucket)
    plan = _plans.get(key)
    if plan is None:
        epi = epilogues.get(epilogue)
        device_cc = capability(device)
        kernel_cc = resolve_arch(arch, device_cc)
        element = element_D or epi.default_output
        if element not in epi.output_dtypes:
            raise ValueError(f"epilogue {epilogue!r} writes {list(epi.output_dtypes)}, not {element!r}")
        spec = kernel_spec(kernel_cc, target_arch_for(kernel_cc, device_cc), epilogue, element, bucket, gpu_name)

        def tile_plan(tile: str) -> Int8Gemm | None:
            return _any_n_plan(device, any_n_spec(kernel_cc, device_cc, epilogue, element, gpu_name, tile))

        any_n, narrow = tile_plan(ANY_N_TILE), tile_plan(ANY_N_NARROW_TILE)
        wide = tile_plan(ANY_N_LARGE_TILE) if bucket == BUCKETS[-1] else None  # the wide tile: large M only
        plan = _plans[key] = Int8Gemm(spec, any_n, wide if wide is not any_n else None,
                                      narrow if narrow is not any_n else None)
    return plan


def _any_n_plan(device: int, spec: GemmKernelSpec | None) -> Int8Gemm | None:
    """The plan of an any-N kernel on ``device`` (None: no such kernel); its kernel loads on first use."""
    if spec is None:
        return None
    plan = _any_n_plans.get((device, spec))
    if plan is None:
        plan = _any_n_plans[(device, spec)] = Int8Gemm(spec)
    return plan


_DEVICES: dict[int, torch.device] = {}  # device index -> torch.device (made once, not per call)


def _cuda_device(index: int) -> torch.device:
    found = _DEVICES.get(index)
    if found is None:
        found = _DEVICES[index] = torch.device("cuda", index)
    return found


_loaded: dict[tuple, Int8Gemm] = {}  # (device, arch, epilogue, out_dtype, bucket index) -> loaded plan
_limits: dict[int, tuple[int, int]] = {}  # device -> (small_m_max, medium_m_max)


def plan_for(M: int, device: int, epilogue: str, arch: int | None, out_dtype: torch.dtype | str | None) -> Int8Gemm:
    """The loaded plan for M rows on ``device`` (two int compares and one dict lookup per call);
    ``out_dtype``: a torch dtype, an element name ("f16") or None (the epilogue's default)."""
    limits = _limits.get(device)
    if limits is None:
        limits = _limits[device] = bucket_limits(_gpu_name(device))
    # 0, 1, 2: the index in BUCKETS of M's bucket (two int compares, no table lookups per call)
    key = (device, arch, epilogue, out_dtype, 0 if M <= limits[0] else 1 if M <= limits[1] else 2)
    plan = _loaded.get(key)
    if plan is None:
        element_D = _DTYPE_NAMES.get(out_dtype, out_dtype) if out_dtype is not None else None
        plan = get_plan(device, arch, epilogue, element_D, M)
        plan.kernel  # load it now: the per-call path expects a loaded kernel
        _loaded[key] = plan
    return plan
