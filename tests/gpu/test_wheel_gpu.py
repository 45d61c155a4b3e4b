"""From the built wheel alone, with no toolkit: every public op's first call within 50 ms, with no
compile and no process started (scripts/check_wheel_gpu.py on ``$CUTLASS_OPS_WHEEL``).

Build the wheel on the GPU machine first, e.g. from its filled cache:
``python scripts/build_wheel.py --arch 90 --cutlass --from-cache "$CUTLASS_OPS_CACHE_DIR" --host-ext``;
then ``CUTLASS_OPS_WHEEL=dist/cutlass_ops-0.1.0-py3-none-any.whl pytest tests/gpu/test_wheel_gpu.py``.
The report goes to ``$OUT/wheel_check.md`` when ``OUT`` is set.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WHEEL = os.environ.get("CUTLASS_OPS_WHEEL")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(not WHEEL, reason="set CUTLASS_OPS_WHEEL to a wheel built by scripts/build_wheel.py")]


def test_every_public_op_runs_from_the_wheel_without_compiling(tmp_path):
    out = Path(os.environ["OUT"]) / "wheel_check.md" if os.environ.get("OUT") else tmp_path / "wheel_check.md"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_wheel_gpu.py"), WHEEL, "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]
