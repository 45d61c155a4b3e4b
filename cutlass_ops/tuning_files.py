"""Where the per-GPU tuning files live and how a GPU's file is named (``cutlass_ops/tuning/<gpu>.json``).

One file per GPU model holds both the int8 GEMM tiles (:mod:`cutlass_ops.cutlass.tuning`) and the
weight-only entries (:mod:`cutlass_ops.weight_only.tuned`). Kept apart from both so that reading the
weight-only table does not import the CUTLASS family (about 14 ms of a fresh process's first ``linear``).
"""
from __future__ import annotations

import re
from pathlib import Path

__all__ = ["TUNING_DIR", "gpu_file_name"]

TUNING_DIR = Path(__file__).resolve().parent / "tuning"


def gpu_file_name(gpu_name: str) -> str:
    """The tuning file of a GPU: its name with non-alphanumerics as '_', e.g. NVIDIA_H100_80GB_HBM3.json."""
    return re.sub(r"[^A-Za-z0-9]+", "_", gpu_name).strip("_") + ".json"
