"""What names one compiled CUTLASS int8 GEMM kernel: :class:`GemmKernelSpec`.

A spec is plain data (no CUTLASS import): the kernel generation, the nvcc target, element types,
tile, schedules, alignments and epilogue. Its :meth:`~GemmKernelSpec.index_key` keys the
spec -> kernel index of the build cache (:mod:`cutlass_ops.cutlass.build`).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass
from typing import Any

import epilogues
from custom_kernels.cache import content_key

__all__ = ["GemmKernelSpec", "KERNEL_CCS", "BUILD_FORMAT", "SM90_DEVICE_FLAGS"]

# Bump when the emitted templates or the meta format change: it is part of every index key.
BUILD_FORMAT = 2
KERNEL_CCS = (75, 80, 90)
# Sm90 kernels call griddepcontrol (CUTLASS's GDC): the producer waits on the previous grid before its
# first load, and the consumers release the next grid after their last mainloop, so a kernel launched
# with programmatic dependent launch overlaps its start with the end of the one before it.
SM90_DEVICE_FLAGS = ("-DCUTLASS_ENABLE_GDC_FOR_SM90",)
# The fewest elements per access CUTLASS 2.x's int32-accumulator epilogue iterators take for C of this type.
_MIN_ALIGNMENT_AS_C = {"s8": 4, "f16": 8, "bf16": 8}


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
    def device_flags(self) -> tuple[str, ...]:
        """Extra nvcc flags of the device code: grid dependency control for Sm90 (PDL-launchable)."""
        return SM90_DEVICE_FLAGS if self.kernel_cc == 90 else ()

    @property
    def element_C(self) -> str:
        """C operand type: the epilogue's matrix C if it has one, else D (2.x) or void (Sm90).

        A 2.x kernel storing an int8, f16 or bf16 D fewer elements at a time than CUTLASS's epilogue
        iterators for that type take (DefaultIteratorsTensorOp from int32: int8 4, 8 or 16; f16 / bf16 8)
        gets an int32 C instead: C's type picks those iterators, and an EVT epilogue never reads C (it
        stores D itself, in D's type)."""
        if "C" in epilogues.get(self.epilogue).input_names:
            return "f32"
        if self.kernel_cc == 90:
            return "void"
        if self.alignment_D < _MIN_ALIGNMENT_AS_C.get(self.element_D, 1):
            return "s32"
        return self.element_D

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
                           "nvidia-cutlass==4.2.0.0", str(BUILD_FORMAT), *self.device_flags)
