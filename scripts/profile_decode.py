#!/usr/bin/env python3
"""Where one decode step of the Llama-style decoder spends its GPU time, kernel by kernel.

The decoder of ``bench_llama.py`` (random weights; 8 layers of hidden 4096, MLP 14336, GQA 32/8) is
compiled with ``torch.compile(mode="reduce-overhead", fullgraph=True)`` for each ``--modes`` entry and
one token after a ``--context``-token cache at ``--batch``; after warm-up, ``torch.profiler`` records
``--steps`` replays of the step's CUDA graph. Reported per mode: the step's wall time on the GPU (first
kernel start to last kernel end, per replay), the sum of kernel times, the gaps between kernels, and the
kernels grouped by name (calls per step, us per step, share), with each group's class: our weight-only
GEMVs and GEMMs, the split-K reduction, torch / inductor kernels, attention, cuBLAS. It answers what
``bench_llama.md``'s "no linears" row leaves open: why the W4A16 step's linears take longer in the
model than the same GEMVs timed alone (``llm_shapes.md``).

    python scripts/profile_decode.py [--modes fp16,W4A16] [--batch 1] [--layers 8] [--out PATH]
        # -> scripts/results/<gpu>/profile_decode.md

A benchmark, not a test (it needs a GPU).
"""
from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

log = logging.getLogger("profile_decode")

# kernel name pattern -> class (first match wins)
CLASSES = (
    (r"^(gemv_|gemm_small_m|gemm_mma|gemm_simt|gather_k|dequant_weight)", "ours: weight-only"),
    (r"^splitk_reduce", "ours: split-K reduction"),
    (r"^(quant_|precompute_|w8a8_|bias_act_|cutlass|sm90_|sm80_|sm75_)", "ours: W8A8 / CUTLASS"),
    (r"(flash|fmha|attention|sdpa|efficient)", "attention"),
    (r"(gemm|gemv|cublas|cutlass|sm90_xmma|nvjet)", "cuBLAS"),
    (r"^triton_", "inductor (triton)"),
)


def kernel_class(name: str) -> str:
    for pattern, cls in CLASSES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return cls
    return "other torch"


def short(name: str, width: int = 70) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[:width - 3] + "..."


def step_events(events, steps: int):
    """Split the profiled kernels into ``steps`` equal consecutive groups (one per replay)."""
    kernels = sorted((e for e in events if e.device_type.name == "CUDA" and e.device_time_total > 0),
                     key=lambda e: e.time_range.start)
    per = len(kernels) // steps
    return [kernels[i * per:(i + 1) * per] for i in range(steps)] if per else []


def summarize(groups) -> tuple[dict, list[tuple[str, str, float, float]]]:
    """(step stats, rows (class, kernel, calls per step, us per step)) over the replays."""
    walls, busy, gaps = [], [], []
    by_name: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, int] = defaultdict(int)
    for kernels in groups:
        start, end = kernels[0].time_range.start, max(k.time_range.end for k in kernels)
        walls.append(end - start)
        busy.append(sum(k.time_range.end - k.time_range.start for k in kernels))
        gaps.append(sum(max(0, b.time_range.start - a.time_range.end) for a, b in zip(kernels, kernels[1:])))
        for k in kernels:
            by_name[k.name].append(k.time_range.end - k.time_range.start)
            calls[k.name] += 1
    n = len(groups)
    rows = [(kernel_class(name), name, calls[name] / n, sum(times) / n) for name, times in by_name.items()]
    rows.sort(key=lambda r: -r[3])
    stats = {"wall": statistics.median(walls), "busy": statistics.median(busy), "gaps": statistics.median(gaps),
             "kernels": statistics.median(len(k) for k in groups)}
    return stats, rows


def profile_mode(args, mode: str):
    import torch
    from torch.profiler import ProfilerActivity, profile

    import bench_llama

    model = bench_llama.build(args, mode)
    d = 4096
    x = torch.randn(args.batch, 1, d, device="cuda", dtype=model.cos.dtype)
    pos = torch.tensor([args.context], device="cuda")
    step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        model(x, pos)  # eager first: the per-weight kernel data lives outside the graph pool
        for _ in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            step(x, pos)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                torch.compiler.cudagraph_mark_step_begin()
                step(x, pos)
            torch.cuda.synchronize()
    groups = step_events(prof.events(), args.steps)
    del model, step
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return summarize(groups) if groups else (None, [])


def report(args, results: dict) -> list[str]:
    lines = [f"Decode step of the Llama-style decoder ({args.layers} layers, batch {args.batch}, one token after "
             f"{args.context}), compiled with mode=\"reduce-overhead\"; torch.profiler over {args.steps} replays "
             "of the step's CUDA graph, medians per step. wall: first kernel start to last kernel end; busy: sum of "
             "kernel times; gaps: idle time between consecutive kernels.", ""]
    for mode, (stats, rows) in results.items():
        if stats is None:
            lines += [f"## {mode}", "", "no kernels recorded", ""]
            continue
        lines += [f"## {mode}", "",
                  f"wall {stats['wall']:.1f} us, busy {stats['busy']:.1f} us, gaps {stats['gaps']:.1f} us, "
                  f"{stats['kernels']} kernels per step", ""]
        by_class: dict[str, float] = defaultdict(float)
        for cls, _, _, us in rows:
            by_class[cls] += us
        lines += ["| class | us per step | share of busy |", "|---|---|---|"]
        lines += [f"| {cls} | {us:.1f} | {100 * us / stats['busy']:.0f}% |"
                  for cls, us in sorted(by_class.items(), key=lambda kv: -kv[1])]
        lines += ["", "| class | kernel | calls per step | us per step | us per call |", "|---|---|---|---|---|"]
        lines += [f"| {cls} | `{short(name)}` | {calls:.0f} | {us:.1f} | {us / calls:.2f} |"
                  for cls, name, calls, us in rows[:args.top]]
        lines.append("")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fp16,W4A16", help="comma-separated modes of bench_llama.MODES")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernel rows per mode")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/profile_decode.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
    import torch

    import bench_llama

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in bench_llama.MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {list(bench_llama.MODES)}")
    if not torch.cuda.is_available():
        log.error("needs a CUDA GPU")
        return 1
    args.prefill = args.context  # bench_llama.build sizes the KV cache from it
    results = {}
    for mode in modes:
        log.info("profiling %s", mode)
        results[mode] = profile_mode(args, mode)
    from _timing import write_report

    write_report(report(args, results), args.out, "profile_decode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
