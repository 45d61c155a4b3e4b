"""Timing helpers shared by the benchmarks (not a test module).

``call_us``: wall time per call as a user makes it (host cost included): many back-to-back
calls between two synchronizations. ``host_us``: host time per call alone (the enqueue cost).
``kernel_us``: median device time per call from CUDA events around each call (warm, L2 rotated
by the caller's choice of inputs; host-bound calls include their launch gaps). ``graph_us``:
device time per call from a CUDA graph of repeated calls (no host cost, no launch gaps).
``write_report``: a benchmark's table, headed by the commit and date, to
``scripts/results/<gpu>/<bench>.md`` (one current table per GPU and benchmark; ``--out`` overrides).
"""
from __future__ import annotations

import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "scripts" / "results"


def _timed_calls(fn, iters: int, warmup: int) -> tuple[float, float]:
    """(host us per call, wall us per call) over ``iters`` back-to-back calls after a warm-up:
    host = until the last call returned, wall = until the GPU finished them."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / iters * 1e6, (t2 - t0) / iters * 1e6


def call_us(fn, iters: int = 50, warmup: int = 5, repeats: int = 3) -> float:
    """Median over ``repeats`` loops of ``iters`` calls of the wall us per call (one host hiccup
    moves one loop; the first call's launch latency is spread over ``iters`` calls)."""
    return statistics.median(_timed_calls(fn, iters, warmup)[1] for _ in range(repeats))


def host_us(fn, iters: int = 200, warmup: int = 5, repeats: int = 5) -> float:
    """Median over ``repeats`` loops of the host us per call (each loop short enough that the
    launch queue never fills, so the GPU's speed does not leak into the host time)."""
    return statistics.median(_timed_calls(fn, max(1, iters // repeats), warmup)[0] for _ in range(repeats))


def graph_of(fn, reps: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``reps`` calls of fn (launch gaps and host overhead removed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (compiles, caches)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph


def graph_us(fn, reps: int = 20, iters: int = 10) -> float:
    """Device us per call: median over ``iters`` replays of a CUDA graph of ``reps`` calls, / reps
    (no host time and no launch gaps, so small problems are not timed as their host cost)."""
    graph = graph_of(fn, reps)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def kernel_us(fn, iters: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def sleep_cycles_per_us() -> float:
    """GPU clock cycles per us of ``torch.cuda._sleep`` (a kernel that spins for a number of cycles: the GPU kept
    busy while the host enqueues, or an idle kernel in a CUDA graph), from one timed 20 M-cycle sleep."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    cycles = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1e3)


class Rotating:
    """Calls fn(i) with i cycling over ``count`` copies of the operands (a benchmark's way past the
    L2 cache; captured as such in a CUDA graph)."""

    def __init__(self, fn, count: int):
        self.fn, self.count, self.i = fn, count, 0

    def __call__(self):
        self.i = (self.i + 1) % self.count
        return self.fn(self.i)


def gpu_slug(name: str | None = None) -> str:
    """Directory name of a GPU under scripts/results: the device name lowercased, non-alphanumerics
    as '-', memory size and type dropped ('NVIDIA H100 80GB HBM3' -> 'nvidia-h100', 'NVIDIA H200' ->
    'nvidia-h200', 'NVIDIA H100 PCIe' -> 'nvidia-h100-pcie')."""
    name = name if name is not None else torch.cuda.get_device_name()
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower())
             if w and not re.fullmatch(r"\d+gb|hbm\d*e?", w)]
    return "-".join(words) or "unknown-gpu"


def git_commit() -> str:
    """Short hash of the checkout's HEAD ('unknown' outside a git checkout), '+changes' when
    tracked files differ from it (the measured code is then not exactly that commit).
    ``CUTLASS_OPS_BENCH_COMMIT``, when set, is taken as it is: for a copy of a working tree whose git metadata
    is not the tree's own (a remote GPU machine given the files but a stale ``.git``)."""
    override = os.environ.get("CUTLASS_OPS_BENCH_COMMIT", "").strip()
    if override:
        return override
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "") if head else "unknown"


def report_path(bench: str, gpu: str | None = None) -> Path:
    """scripts/results/<gpu slug>/<bench>.md: the one current table of this benchmark on this GPU."""
    return RESULTS_DIR / gpu_slug(gpu) / f"{bench}.md"


def report_header(bench: str, gpu: str | None = None) -> str:
    """The provenance line every results table starts with: commit, date, producer, GPU."""
    gpu = gpu if gpu is not None else torch.cuda.get_device_name()
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    script = Path(sys.argv[0]).name if sys.argv else ""
    producer = f"scripts/{script}" if script.endswith(".py") else f"`{bench}`"
    return f"Measured on commit `{git_commit()}` ({now}) by {producer} on {gpu}."


def write_report(lines: list[str], out: Path | None = None, bench: str | None = None) -> str:
    """Join ``lines`` into a markdown report under a provenance line (commit, date), print it and
    write it to ``out``; by default to scripts/results/<gpu>/<bench>.md (overwritten on a re-run),
    ``bench`` defaulting to the running script's name."""
    bench = bench or Path(sys.argv[0]).stem
    report = report_header(bench) + "\n\n" + "\n".join(lines).rstrip("\n") + "\n"
    print(report)
    out = Path(out) if out is not None else report_path(bench)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"written to {out}", file=sys.stderr)
    return report


def table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
