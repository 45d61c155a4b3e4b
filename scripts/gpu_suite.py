#!/usr/bin/env python3
"""GPU suite in one command: the full pytest run (GPU tests included) plus the benchmarks.

Writes one markdown report (pytest summary line, GPU name, versions, every benchmark table)
to ``--out`` (default: scripts/results/<date>-<gpu>.md; also copied to $OUT when set, for the
lent GPU machine), and the pytest log beside it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
BENCHES = ["bench_weight_only.py", "bench_int8_gemm.py", "bench_conv.py", "bench_w8a8.py", "bench_w8a8_fused.py",
           "profile_host.py"]


def versions() -> dict[str, str]:
    info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch CUDA": str(torch.version.cuda)}
    for mod in ("cuda.bindings", "cutlass_cppgen", "triton"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            info[mod] = getattr(m, "__version__", "?")
        except Exception as exc:  # report, don't fail: the suite still runs what it can
            info[mod] = f"unavailable ({type(exc).__name__})"
    try:
        from custom_kernels.nvrtc import nvrtc_version

        info["NVRTC"] = ".".join(map(str, nvrtc_version()))
    except Exception as exc:
        info["NVRTC"] = f"unavailable ({type(exc).__name__})"
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True)
        info["driver"] = out.stdout.strip()
    return info


def run_pytest(log_path: Path, extra: list[str]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    try:  # pytest-xdist, where installed: spread the tests (and their first NVRTC builds) over workers
        import xdist  # noqa: F401

        cmd += ["-n", str(min(8, os.cpu_count() or 1))]
    except ImportError:
        pass
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    log_path.write_text(text)
    lines = [l for l in text.splitlines() if re.search(r"\b(passed|failed|error|skipped)\b", l)]
    summary = lines[-1].strip("= ") if lines else f"no summary (exit {proc.returncode})"
    return proc.returncode, f"{summary} (exit {proc.returncode}, {time.time() - t0:.0f} s wall)"


def run_bench(script: Path, out: Path, timeout: int) -> str:
    cmd = [sys.executable, str(script), "--out", str(out)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"_{script.name}: timed out after {timeout} s_\n"
    if out.exists() and proc.returncode == 0:
        return out.read_text()
    tail = (proc.stdout + proc.stderr)[-3000:]
    return f"_{script.name} failed (exit {proc.returncode})_\n```\n{tail}\n```\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--bench", nargs="*", default=BENCHES, help="benchmark scripts to run")
    p.add_argument("--bench-timeout", type=int, default=240)
    p.add_argument("pytest_args", nargs="*", default=["-m", "gpu"],
                   help="pytest arguments (default: -m gpu, the GPU tests; CI runs the CPU tests)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_suite.py needs an NVIDIA GPU", file=sys.stderr)
        return 2

    gpu = torch.cuda.get_device_name()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    today = dt.date.today().isoformat()
    out = args.out or ROOT / "scripts" / "results" / f"{today}-{slug}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent

    report = [f"# GPU suite: {gpu}", "", f"date: {dt.datetime.now().isoformat(timespec='seconds')}", ""]
    report += ["| component | version |", "|---|---|"] + [f"| {k} | {v} |" for k, v in versions().items()] + [""]
    rc = 0
    if not args.skip_tests:
        rc, summary = run_pytest(work / f"{today}-{slug}-pytest.log", args.pytest_args)
        report += [f"## pytest {' '.join(args.pytest_args)}", "", f"    {summary}", ""]
        print(f"pytest: {summary}", flush=True)
    if not args.skip_bench:
        for name in args.bench:
            script = ROOT / "scripts" / name
            if not script.exists():
                continue
            print(f"benchmark {name} ...", flush=True)
            table = run_bench(script, work / f"{today}-{slug}-{script.stem}.md", args.bench_timeout)
            report += [f"## {script.stem}", "", table, ""]
    out.write_text("\n".join(report))
    print("\n".join(report))
    dest = os.environ.get("OUT")
    if dest and Path(dest).resolve() != work.resolve():
        for f in work.glob(f"{today}-{slug}*"):
            shutil.copy(f, dest)
    return rc


if __name__ == "__main__":
    sys.exit(main())
