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

For the weight-only modes a second table goes linear by linear (qkv, o, gate, up, down: the layer's call
order): what each GEMV adds to the step in the model (its end minus the later of its start and the latest end
of the kernels before it, median over layers and replays) and its launch-to-end span, against the same weight's GEMV timed in
this run back to back (CUDA graph, weight copies rotated past L2), behind an idle kernel of
``--idle-us`` (as in the model, where it follows inductor's kernels), and the bare read kernel of its bytes
(``_read_floor``); then what the GEMVs may take for the step to be 2.5x faster than the fp16 step.

``--inductor-pdl``: inductor's Triton kernels launched with PDL (``bench_llama.py --inductor-pdl``).

    python scripts/profile_decode.py [--modes fp16,W4A16] [--batch 1] [--layers 8] [--inductor-pdl] [--out PATH]
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


LINEARS = ("qkv", "o", "gate", "up", "down")  # bench_llama.Layer's call order
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate": (14336, 4096), "up": (14336, 4096), "down": (4096, 14336)}


def linear_times(groups, layers: int):
    """{linear: (added us, span us)} medians over layers and replays, from each step's weight-only GEMVs in call
    order (None if a step does not hold one per linear and layer). added: the GEMV's end minus the later of its
    start and the latest end of the kernels before it (the step time only it occupies); span: its start (launch,
    before a PDL wait) to its end."""
    added, span = defaultdict(list), defaultdict(list)
    for kernels in groups:
        ours = [k for k, e in enumerate(kernels) if kernel_class(e.name) == "ours: weight-only"]
        if len(ours) != len(LINEARS) * layers:
            return None
        for j, k in enumerate(ours):
            e = kernels[k]
            before = max((p.time_range.end for p in kernels[:k]), default=e.time_range.start)
            name = LINEARS[j % len(LINEARS)]
            added[name].append(e.time_range.end - max(before, e.time_range.start))
            span[name].append(e.time_range.end - e.time_range.start)
    return {n: (statistics.median(added[n]), statistics.median(span[n])) for n in LINEARS}


def standalone_times(config, idle_us: float) -> dict:
    """{(N, K): (back to back us, behind an idle kernel us, read kernel us)} for the layer's weights quantized
    as ``config`` (a WeightOnlyConfig), M = 1 fp16, each timed in a CUDA graph rotating over weight copies
    (``bench_llm_shapes.rotated_us``, as ``llm_shapes.md`` times them)."""
    import math

    import torch
    from _read_floor import read_floor_us
    from _timing import graph_us, sleep_cycles_per_us
    from bench_llm_shapes import MIN_REPS, rotated_us, weight_copies
    from bench_weight_only import weight_bytes

    import cutlass_ops

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    cycles = int(idle_us * sleep_cycles_per_us())
    out = {}
    for N, K in sorted(set(SHAPES.values())):
        master = torch.randn(N, K, device="cuda", dtype=torch.float16).mul_(0.02)
        qws = weight_copies(master, config.bits, l2, block_size=config.block_size, symmetric=config.symmetric)
        copies, nbytes = len(qws), weight_bytes(qws[0])
        x = torch.randn(1, K, device="cuda", dtype=torch.float16)
        back = rotated_us(lambda i: cutlass_ops.linear(x, qws[i]), copies)
        idle = rotated_us(lambda i: torch.cuda._sleep(cycles), copies)
        behind = rotated_us(lambda i: (torch.cuda._sleep(cycles), cutlass_ops.linear(x, qws[i])), copies) - idle
        reps = copies * math.ceil(MIN_REPS / copies)  # as rotated_us
        read = read_floor_us(nbytes, lambda call: graph_us(call, reps=reps), copies)[0]
        out[(N, K)] = (back, behind, read)
        log.info("  %d x %d: back to back %.1f us, behind %.0f us idle %.1f, read kernel %.1f", N, K, back, idle_us,
                 behind, read)
        del qws, master
        torch.cuda.empty_cache()
    return out


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
    if not groups:
        return None, [], None
    return (*summarize(groups), linear_times(groups, args.layers))


def report(args, results: dict) -> list[str]:
    lines = [f"Decode step of the Llama-style decoder ({args.layers} layers, batch {args.batch}, one token after "
             f"{args.context}), compiled with mode=\"reduce-overhead\"; torch.profiler over {args.steps} replays "
             "of the step's CUDA graph, medians per step. wall: first kernel start to last kernel end; busy: sum of "
             "kernel times; gaps: idle time between consecutive kernels."
             + (" Inductor's Triton kernels launched with PDL (--inductor-pdl)." if args.inductor_pdl else ""), ""]
    for mode, (stats, rows, _) in results.items():
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
    lines += linear_report(args, results)
    return lines


def linear_report(args, results: dict) -> list[str]:
    """Linear by linear, for each weight-only mode with a standalone timing (see the module docstring)."""
    lines = []
    fp16 = results.get("fp16", (None,))[0]
    for mode, (stats, _, per_linear) in results.items():
        alone = args.standalone.get(mode)
        if stats is None or per_linear is None or alone is None:
            continue
        lines += [f"## {mode}: linear by linear", "",
                  f"Per call, us. added: what the GEMV adds to the step in the model; span: its launch-to-end time "
                  f"there; back to back / behind {args.idle_us:g} us idle / read kernel: the same weight timed alone "
                  f"in this run (M = 1, CUDA graphs, weight copies rotated past L2).", "",
                  "| linear | N x K | added | span | back to back | behind idle | read kernel |",
                  "|---|---|---|---|---|---|---|"]
        totals = [0.0] * 5
        for name in LINEARS:
            N, K = SHAPES[name]
            added, span = per_linear[name]
            back, behind, read = alone[(N, K)]
            lines.append(f"| {name} | {N} x {K} | {added:.1f} | {span:.1f} | {back:.1f} | {behind:.1f} | {read:.1f} |")
            totals = [t + v * args.layers for t, v in zip(totals, (added, span, back, behind, read))]
        lines.append("| step (x %d layers) | | %s |" % (args.layers, " | ".join(f"{t:.0f}" for t in totals)))
        lines.append("")
        if fp16 is not None:
            rest = stats["wall"] - totals[0]
            budget = fp16["wall"] / 2.5 - rest
            lines += [f"Step wall {stats['wall']:.0f} us, of which the GEMVs add {totals[0]:.0f} and the rest "
                      f"{rest:.0f}. 2.5x the fp16 step ({fp16['wall']:.0f} us) needs {fp16['wall'] / 2.5:.0f} us: "
                      f"{budget:.0f} us for the {len(LINEARS) * args.layers} GEMVs, against {totals[4]:.0f} us for "
                      f"their bare read kernels back to back ({budget / totals[4]:.2f}x).", ""]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fp16,W4A16", help="comma-separated modes of bench_llama.MODES")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="kernel rows per mode")
    parser.add_argument("--idle-us", type=float, default=5.0,
                        help="idle kernel before each standalone GEMV of the linear table (default 5)")
    parser.add_argument("--no-standalone", action="store_true", help="skip the linear-by-linear table")
    parser.add_argument("--inductor-pdl", action="store_true",
                        help="torch._inductor.config.triton.enable_pdl = True (Hopper+)")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/profile_decode.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
    import torch

    import bench_llama

    if args.inductor_pdl:
        bench_llama.use_inductor_pdl()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in bench_llama.MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {list(bench_llama.MODES)}")
    if not torch.cuda.is_available():
        log.error("needs a CUDA GPU")
        return 1
    args.prefill = args.context  # bench_llama.build sizes the KV cache from it
    args.mlp = "separate"  # gate and up as two linears: LINEARS' order
    results, args.standalone = {}, {}
    for mode in modes:
        log.info("profiling %s", mode)
        results[mode] = profile_mode(args, mode)
        config = bench_llama.MODES[mode]
        if not args.no_standalone and type(config).__name__ == "WeightOnlyConfig":
            log.info("timing %s's weights alone", mode)
            args.standalone[mode] = standalone_times(config, args.idle_us)
    from _timing import write_report

    write_report(report(args, results), args.out, "profile_decode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
