"""The case table: every sanitizer case, the kernel families they belong to, and the compute-sanitizer
filters that match the project's kernels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


FAMILIES = ("gemv_mma", "gemv_stream", "gemv_simt", "gemm_mma", "gemm_simt", "gemm_small_m", "gemm_wgmma", "dequant_weight",
            "gemv_dp4a",
            "converters_test",
            "conv", "quant_a", "scheme2_epilogue", "w8a8_kblock_fused", "w8a8_kblock_wgmma", "quantize_weight",
            "quant_token", "pad_rows")
ALIASES = {"gemv": ("gemv_mma", "gemv_stream", "gemv_simt"), "gemm": ("gemm_mma", "gemm_simt", "gemm_small_m", "gemm_wgmma"),
           "dequant": "dequant_weight",
           "dp4a": "gemv_dp4a", "converters": "converters_test",
           "quant": "quant_a", "scheme2": "scheme2_epilogue", "w8a8": "w8a8_kblock_fused",
           "wgmma": "w8a8_kblock_wgmma"}

# Substrings (compute-sanitizer kns= filters) that together match every project kernel and, as far
# as we know, no torch / cuBLAS kernel; --check-coverage checks the first half of that claim.
SANITIZER_PREFIXES = ("gemv_", "gemm_mma_mt", "gemm_simt", "gemm_small_m", "gemm_wgmma", "conv_", "splitk_reduce", "gather_k", "dequant_", "quantize_q8_1",
                      "test_int", "test_uint", "quant_a_", "precompute_sum_bq", "precompute_bvec", "bias_act_", "w8a8_kblock_gemm",
                      "w8a8_kblock_wgmma", "w8a8_row_planes", "quantize_weight_",
                      "quant_token_", "pad_rows_", "unpad_rows")

# Kernels no case can reach, with the reason (checked by --check-coverage). Empty: all are reached.
UNREACHABLE: dict[str, str] = {}


@dataclass(frozen=True)
class KernelRef:
    """One kernel a case launches: source file, extern "C" name and the NVRTC defines of its module."""

    file: str
    name: str
    defines: tuple[tuple[str, int], ...] = ()


@dataclass
class Case:
    name: str
    family: str
    refs: tuple[KernelRef, ...]
    fn: Callable[[], object]
    min_cc: int = 0  # compute capability the path needs (e.g. 80 for mma.sync)
    note: str = ""
    optional: bool = False  # only with --tunables (kernel variants of tuning knobs: extra NVRTC modules)
    selftest: bool = False  # only with --plant-oob (a deliberate out-of-bounds write)

    @property
    def kernels(self) -> list[str]:
        return sorted({r.name for r in self.refs})


CASES: list[Case] = []


def _add(name: str, family: str, refs, fn, min_cc: int = 0, note: str = "", optional: bool = False,
         selftest: bool = False) -> None:
    assert family in FAMILIES, family
    assert all(c.name != name for c in CASES), f"duplicate case {name}"
    CASES.append(Case(name, family, tuple(refs), fn, min_cc, note, optional, selftest))


def _ref(file: str, name: str, defines: dict | None = None) -> KernelRef:
    return KernelRef(file, name, tuple(sorted((defines or {}).items())))


_DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
_DT_NAME = {v: k for k, v in _DT.items()}


def family_names(families: list[str] | None) -> set[str] | None:
    """The families ``--family`` names (aliases expanded); None for all."""
    if not families:
        return None
    wanted: set[str] = set()
    for f in families:  # an alias names one family or several
        alias = ALIASES.get(f, f)
        wanted.update((alias,) if isinstance(alias, str) else alias)
    return wanted
