"""The ``cutlass-ops`` command on a CPU machine: ``info`` prints every key, counts what a cache and a
prebuilt tree hold, and says "no GPU"; ``build --list`` is scripts/build_kernels.py's list."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEYS = ("cutlass-ops", "python", "torch", "torch CUDA", "driver", "GPUs", "nvrtc", "cuda-bindings",
        "nvidia-cutlass", "nvcc", "cache", "prebuilt", "C++ launch path")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)


def test_info_prints_every_key(tmp_path):
    cache, prebuilt = tmp_path / "cache", tmp_path / "prebuilt"
    (cache / "nvrtc").mkdir(parents=True)
    (cache / "nvrtc" / "gemv_mma-sm90a-0123abcd.cubin").write_bytes(b"x")
    (cache / "nvrtc" / "quant_a-sm80-4567ef01.cubin").write_bytes(b"x")
    (prebuilt / "cutlass" / "kernels" / "sm80_none-0123").mkdir(parents=True)
    (prebuilt / "cutlass" / "kernels" / "sm80_none-0123" / "meta.json").write_text("{}")
    (prebuilt / "cutlass" / "kernels" / "incomplete-4567").mkdir()  # no meta.json: not counted
    proc = run("-m", "cutlass_ops.cli", "info",
               env={"CUTLASS_OPS_CACHE_DIR": str(cache), "CUTLASS_OPS_PREBUILT_DIR": str(prebuilt)})
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(":", 1) for line in proc.stdout.splitlines())
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert tuple(rows) == KEYS, proc.stdout
    assert rows["cache"] == f"{cache} (2 NVRTC cubins (sm_80, sm_90a), 0 CUTLASS kernels)"
    assert rows["prebuilt"] == f"{prebuilt} (0 NVRTC cubins, 1 CUTLASS kernels)"
    import torch

    if not torch.cuda.is_available():
        assert rows["driver"] == rows["GPUs"] == "no GPU"


def test_build_list_matches_the_script():
    args = ("--arch", "80", "90", "--epilogue", "none", "--list")
    cli = run("-m", "cutlass_ops.cli", "build", *args)
    script = run(str(REPO / "scripts" / "build_kernels.py"), *args)
    assert cli.returncode == script.returncode == 0, cli.stderr + script.stderr
    assert cli.stdout == script.stdout and len(cli.stdout.split()) > 3
