#!/usr/bin/env python3
"""GPU suite in one command: the full pytest run (GPU tests included) plus the benchmarks.

Each benchmark writes its own table to scripts/results/<gpu>/<bench>.md (overwriting the previous
run's). The suite writes a summary (commit, date, GPU, versions, the pytest summary line, each
benchmark's status and a link to its table) to scripts/results/<gpu>/gpu_suite.md (or ``--out``). Raw logs (the
pytest output, each benchmark's stdout and stderr) go to $OUT when set (the lent GPU machine brings
$OUT back; the results tables are copied there too, under results/<gpu>/), else to a new temporary
directory; never into scripts/results.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _timing import report_header, report_path

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


def run_bench(script: Path, table: Path, log_path: Path, timeout: int) -> str:
    """Run one benchmark (it writes ``table`` itself); its output goes to ``log_path``. Returns the
    summary's line for it: where its table is, or why there is none."""
    cmd = [sys.executable, str(script), "--out", str(table)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        log_path.write_text(f"{exc.stdout or ''}{exc.stderr or ''}")
        return f"_{script.name}: timed out after {timeout} s (log: {log_path})_\n"
    log_path.write_text(proc.stdout + proc.stderr)
    if table.exists() and proc.returncode == 0:
        return f"Table: [{table.name}]({table.name}).\n"
    tail = (proc.stdout + proc.stderr)[-3000:]
    return f"_{script.name} failed (exit {proc.returncode}; log: {log_path})_\n```\n{tail}\n```\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=None, help="summary (default: scripts/results/<gpu>/gpu_suite.md)")
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
    out = args.out or report_path("gpu_suite")
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(os.environ["OUT"]) / "logs" if os.environ.get("OUT") else Path(tempfile.mkdtemp(prefix="gpu_suite-"))
    logs.mkdir(parents=True, exist_ok=True)

    report = [f"# GPU suite: {gpu}", "", report_header("gpu_suite", gpu), ""]
    report += ["| component | version |", "|---|---|"] + [f"| {k} | {v} |" for k, v in versions().items()] + [""]
    rc = 0
    tables = []
    if not args.skip_tests:
        rc, summary = run_pytest(logs / "pytest.log", args.pytest_args)
        report += [f"## pytest {' '.join(args.pytest_args)}", "", f"    {summary}", ""]
        print(f"pytest: {summary}", flush=True)
    if not args.skip_bench:
        for name in args.bench:
            script = ROOT / "scripts" / name
            if not script.exists():
                continue
            print(f"benchmark {name} ...", flush=True)
            table = report_path(script.stem, gpu)
            section = run_bench(script, table, logs / f"{script.stem}.log", args.bench_timeout)
            tables.append(table)
            report += [f"## {script.stem}", "", section, ""]
    out.write_text("\n".join(report))
    print("\n".join(report))
    print(f"summary: {out}; logs: {logs}", file=sys.stderr)
    dest = os.environ.get("OUT")
    if dest:  # the lent GPU machine brings back only $OUT: the tables too
        where = Path(dest) / "results" / out.parent.name
        where.mkdir(parents=True, exist_ok=True)
        for f in [out, *tables]:
            if f.exists():
                shutil.copy(f, where)
    return rc


if __name__ == "__main__":
    sys.exit(main())
