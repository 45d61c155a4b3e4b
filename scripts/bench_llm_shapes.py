#!/usr/bin/env python3
"""Benchmark weight-only W4 / W8 linear on the weight shapes of Llama models against cuBLAS, per M (issue 23).

Shapes (N x K of W, y = x @ W^T, x [M, K]): Llama-3-8B qkv 6144 x 4096 (GQA 32/8 heads of 128), the
issue's qkv row 12288 x 4096 (3 x 4096), o 4096 x 4096, gate+up 28672 x 4096, gate (or up: the unfused
layout of Hugging Face checkpoints and of bench_llama's decoder) 14336 x 4096, down 4096 x 14336;
Llama-3-70B qkv 10240 x 8192, o 8192 x 8192, gate+up 57344 x 8192, down 8192 x 28672; Llama-3.2-1B
(hidden 2048, MLP 8192, 32/8 heads of 64) and Llama-3.2-3B (hidden 3072, MLP 8192, 24/8 heads of 128)
qkv, o, gate+up, down. M = 1, 2, 4, 8, 16, 32, 64; fp16 and bf16 activations. Each row times cuBLAS
(``F.linear`` with the dense weight in the activation dtype) and ``cutlass_ops.linear`` with the
weight quantized once per (shape, bits) on the GPU (``quantize_weight(W, bits=4 or 8, block_size=128,
symmetric=False)``, minmax), reused across M and dtype.

Device us per call from CUDA graphs (``_timing.graph_us``: median of 10 replays of a graph of >= 60
calls; no host time, no launch gaps), each graph rotating (``_timing.Rotating``) over enough copies of
the weight and of x that the bytes it reads exceed 3x the L2 size (at least 2 copies, each called
equally often). The read floor of a row = (packed weight + packed scale/offset words + x + y bytes) /
the device-to-device copy bandwidth, measured once per run (``bench_weight_only.copy_bandwidth``);
% BW = floor / time, as in bench_weight_only.py. Targets, "!" marking the cell that misses one: M = 1
at >= 80% of copy BW; M = 2..16 within 1.3x of the same shape's M = 1 time; W4 at M = 32 and 64 >= 2x
faster than cuBLAS. A summary counts the shapes meeting each target per dtype and bits.

    python scripts/bench_llm_shapes.py [--quick] [--shapes 8B 70B/down 4096x14336] [--M 1 16]
        [--dtypes fp16] [--bits 4] [--rules | --gemm-small-m] [--out PATH]
        # default table: scripts/results/<gpu>/llm_shapes.md

``--rules`` times the rule-based dispatch (the tuning file off: ``CUTLASS_OPS_TUNED=0``) on the weights above and on
OTHER_SHAPES, weights of other models that no tuning file names (Qwen2.5-7B qkv 4608 x 3584, o, gate+up, down;
Qwen2.5-0.5B qkv, o, gate+up, down; Phi-3-mini qkv 9216 x 3072; the unfused k projection of Llama-3-8B / 70B, 1024
rows), to measure what a GPU or a model without tuned entries gets (default table:
scripts/results/<gpu>/llm_shapes_rules.md); ``--shapes`` then picks among both lists.

``--gemm-small-m`` turns on ``weight_only.dispatch.GEMM_SMALL_M_DEFAULT`` for the run (strategy "gemm_small_m"
by default for ``GEMM_SMALL_M_MIN_M`` <= M <= 64 on sm_80+ fp16/bf16), to measure the switch before flipping it in
the source
(default table: scripts/results/<gpu>/llm_shapes_gemm_small_m.md).

The table is rewritten after each shape (a run cut short keeps what it measured); progress goes to
stderr through logging.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import io
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _read_floor import read_floor_us
from _timing import Rotating, graph_us, table, write_report
from bench_weight_only import copy_bandwidth, weight_bytes

import cutlass_ops
from cutlass_ops.weight_only import choose_strategy, tuned

log = logging.getLogger("bench_llm_shapes")

GROUP = 128
SHAPES = (  # (model, layer, N, K)
    ("8B", "qkv", 6144, 4096), ("8B", "qkv-12288", 12288, 4096), ("8B", "o", 4096, 4096),
    ("8B", "gate_up", 28672, 4096), ("8B", "gate", 14336, 4096), ("8B", "down", 4096, 14336),
    ("70B", "qkv", 10240, 8192), ("70B", "o", 8192, 8192), ("70B", "gate_up", 57344, 8192),
    ("70B", "down", 8192, 28672),
    ("3.2-1B", "qkv", 3072, 2048), ("3.2-1B", "o", 2048, 2048), ("3.2-1B", "gate_up", 16384, 2048),
    ("3.2-1B", "down", 2048, 8192),
    ("3.2-3B", "qkv", 5120, 3072), ("3.2-3B", "o", 3072, 3072), ("3.2-3B", "gate_up", 16384, 3072),
    ("3.2-3B", "down", 3072, 8192),
)
# Weights of other models, timed with --rules (no tuning file names them)
OTHER_SHAPES = (
    ("Qwen2.5-7B", "qkv", 4608, 3584), ("Qwen2.5-7B", "o", 3584, 3584), ("Qwen2.5-7B", "gate_up", 37888, 3584),
    ("Qwen2.5-7B", "down", 3584, 18944), ("Qwen2.5-0.5B", "qkv", 1152, 896), ("Qwen2.5-0.5B", "o", 896, 896),
    ("Qwen2.5-0.5B", "gate_up", 9728, 896), ("Qwen2.5-0.5B", "down", 896, 4864), ("Phi-3-mini", "qkv", 9216, 3072),
    ("8B", "k", 1024, 4096), ("70B", "k", 1024, 8192),
)
QUICK_SHAPES = ("8B/qkv", "8B/o", "8B/gate_up", "8B/down")
M_VALUES = (1, 2, 4, 8, 16, 32, 64)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ROTATE_L2 = 3      # bytes read by one pass over the rotated copies >= 3x L2
MIN_COPIES, MIN_REPS = 2, 60  # reps: the graph launch latency, timed once per replay, spread thin
BW_TARGET, FLAT_TARGET, FLAT_MAX_M, FAST_TARGET, FAST_M, FAST_BITS = 0.80, 1.3, 16, 2.0, (32, 64), 4
TARGETS = {"bw": f"M = 1 >= {BW_TARGET:.0%} of copy BW",
           "flat": f"M = 2..{FLAT_MAX_M} within {FLAT_TARGET}x of own M = 1",
           "fast": f"W4 at M = {' and '.join(map(str, FAST_M))} >= {FAST_TARGET:.0f}x faster than cuBLAS"}


def name(shape) -> str:
    return f"{shape[0]}/{shape[1]}"


def selected(shape, tokens) -> bool:
    """A --shapes token picks a shape by its full name (8B/qkv), its model (70B), its layer (down) or N x K."""
    model, layer, N, K = shape
    keys = {name(shape).lower(), model.lower(), layer.lower(), f"{N}x{K}"}
    return any(t.lower() in keys for t in tokens)


def copies_for(nbytes: int, l2: int) -> int:
    return max(MIN_COPIES, math.ceil(ROTATE_L2 * l2 / nbytes))


def rotated_us(call, copies: int) -> float:
    """graph_us of call(i) rotating over ``copies`` operand sets, the graph holding each at least once;
    every copy is called once first (its plans are built outside the capture)."""
    for i in range(copies):
        call(i)
    torch.cuda.synchronize()
    return graph_us(Rotating(call, copies), reps=copies * math.ceil(MIN_REPS / copies))


def weight_copies(master: torch.Tensor, bits: int, l2: int, block_size: int = GROUP, symmetric: bool = False) -> list:
    """The weight quantized once on the GPU, plus clones (same values, other addresses) for the rotation."""
    qw = cutlass_ops.quantize_weight(master, bits=bits, block_size=block_size, symmetric=symmetric)
    clone = lambda: dataclasses.replace(qw, qweight=qw.qweight.clone(), scale=qw.scale.clone(),  # noqa: E731
                                        offset=qw.offset.clone())
    return [qw] + [clone() for _ in range(copies_for(weight_bytes(qw), l2) - 1)]


def measure_shape(shape, args, l2: int, cc: int, results: dict, qbytes: dict, reads: dict) -> None:
    """Time every (dtype, M) of one shape into results[(shape name, dtype, M)] = {"dense" | bits: us};
    qbytes[(shape name, bits)] = packed weight + scale/offset bytes read per call; reads[(shape name, bits)] =
    the bare read kernel's best us over those bytes, timed the same way (``_read_floor.read_floor_us`` with graph_us)."""
    _, _, N, K = shape
    t0 = time.perf_counter()
    torch.cuda.reset_peak_memory_stats()
    master = torch.randn(N, K, device="cuda", dtype=torch.float16).mul_(0.02)
    qws = {bits: weight_copies(master, bits, l2) for bits in args.bits}
    qbytes.update({(name(shape), bits): weight_bytes(q[0]) for bits, q in qws.items()})
    for bits, q in qws.items():
        nbytes = weight_bytes(q[0])
        copies = copies_for(nbytes, l2)
        reps = copies * math.ceil(MIN_REPS / copies)  # as rotated_us times the GEMVs
        reads[(name(shape), bits)] = read_floor_us(nbytes, lambda call: graph_us(call, reps=reps), copies)[0]
    torch.cuda.synchronize()
    log.info("%s %dx%d: quantized %s in %.1f s", name(shape), N, K, ", ".join(
        f"W{b} {len(q)} x {weight_bytes(q[0]) / 1e6:.1f} MB" for b, q in qws.items()), time.perf_counter() - t0)
    for dt in args.dtypes:
        dtype = DTYPES[dt]
        w = master.to(dtype)
        ws = [w] + [w.clone() for _ in range(copies_for(w.numel() * w.element_size(), l2) - 1)]
        for M in args.M:
            t1 = time.perf_counter()
            xs = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in range(max(map(len, [ws, *qws.values()])))]
            r = {"dense": rotated_us(lambda i: F.linear(xs[i], ws[i]), len(ws))}
            for bits, q in qws.items():
                r[bits] = rotated_us(lambda i, q=q: cutlass_ops.linear(xs[i], q[i]), len(q))
            results[(name(shape), dt, M)] = r
            log.info("  %s M=%d: cuBLAS %.1f us (%d copies), %s  [%.2f s]", dt, M, r["dense"], len(ws), ", ".join(
                f"W{b} {r[b]:.1f} us ({choose_strategy(M, dtype, q[0], cc)})" for b, q in qws.items()),
                time.perf_counter() - t1)
    log.info("%s done in %.1f s, peak %.2f GB allocated", name(shape), time.perf_counter() - t0,
             torch.cuda.max_memory_allocated() / 1e9)


def floor_us(qw_bytes: int, M: int, N: int, K: int, bw: float) -> float:
    """Read floor: packed weight + scale/offset words + x + y (2-byte elements) at copy bandwidth."""
    return (qw_bytes + 2 * M * K + 2 * M * N) / bw * 1e6


def verdicts(M: int, bits: int, t: float, t1: float | None, dense: float, floor: float) -> dict:
    """target -> met, for the targets that apply to this row and bits."""
    v = {}
    if M == 1:
        v["bw"] = floor / t >= BW_TARGET
    elif M <= FLAT_MAX_M and t1 is not None:
        v["flat"] = t / t1 <= FLAT_TARGET
    if M in FAST_M and bits == FAST_BITS:
        v["fast"] = dense / t >= FAST_TARGET
    return v


def report(shapes, args, results: dict, qbytes: dict, reads: dict, bw: float, l2: int, failed: list) -> list[str]:
    """The markdown lines: header, the one table (rows with "!" where a target is missed), summary."""
    rows, met = [], {}  # met[(dtype, bits, target)][shape name] = every applicable row met it
    for shape in shapes:
        _, _, N, K = shape
        for dt in args.dtypes:
            for M in args.M:
                r = results.get((name(shape), dt, M))
                if r is None:
                    continue
                r1 = results.get((name(shape), dt, 1))
                cells = {}
                for bits in (4, 8):
                    if bits not in r:
                        cells[bits] = ["-"] * 6
                        continue
                    t, fl = r[bits], floor_us(qbytes[(name(shape), bits)], M, N, K, bw)
                    v = verdicts(M, bits, t, r1[bits] if r1 and M > 1 else None, r["dense"], fl)
                    for target, ok in v.items():
                        key = met.setdefault((dt, bits, target), {})
                        key[name(shape)] = key.get(name(shape), True) and ok
                    mark = lambda target: "!" if v.get(target) is False else ""  # noqa: E731
                    cells[bits] = [f"{t:.1f}", f"{fl:.1f}", f"{100 * fl / t:.0f}%{mark('bw')}",
                                   f"{r['dense'] / t:.2f}x{mark('fast')}",
                                   f"{t / r1[bits]:.2f}{mark('flat')}" if r1 and M > 1 else "-",
                                   f"{reads[(name(shape), bits)]:.1f} ({100 * reads[(name(shape), bits)] / t:.0f}%)"
                                   if M == 1 and (name(shape), bits) in reads else "-"]
                c4, c8 = cells[4], cells[8]
                rows.append([name(shape), f"{N} x {K}", dt, M, r["dense"], c4[0], c8[0], c4[1], c8[1],
                             c4[2], c8[2], c4[3], c8[3], c4[4], c8[4], c4[5], c8[5]])
    header = ["shape", "N x K", "dtype", "M", "cuBLAS us", "W4 us", "W8 us", "W4 floor us", "W8 floor us",
              "W4 % BW", "W8 % BW", "W4 vs cuBLAS", "W8 vs cuBLAS", "W4 / M=1", "W8 / M=1",
              "W4 read kernel us (% of it)", "W8 read kernel us (% of it)"]
    lines = [f"# Weight-only linear on Llama weight shapes, {torch.cuda.get_device_name()}", "",
             f"Copy bandwidth {bw / 1e12:.2f} TB/s (device to device, read + write), L2 {l2 / 2**20:.0f} MiB. Device "
             f"us per call: CUDA graphs of >= {MIN_REPS} calls (median of 10 replays), each rotating over enough "
             f"copies of the weight and x to read >= {ROTATE_L2}x L2. cuBLAS: `F.linear` with the dense weight in the "
             f"activation dtype; W4 / W8: `cutlass_ops.linear`, asymmetric minmax, block {GROUP}. floor: (packed "
             "weight + scale/offset words + x + y bytes) / copy BW; % BW: floor / time; vs cuBLAS: cuBLAS time / "
             "time; / M=1: time / the same shape's M = 1 time in the same dtype; read kernel (M = 1 rows): the best time of a "
             "bare kernel that only reads the packed weight + scale/offset bytes (scripts/kernels/read_bandwidth.cu, "
             "best of its launch shapes), timed the same way, and read kernel time / W time: what any GEMV reading "
             "those bytes in one launch could reach, launch and ramp included."
             + (" Default dispatch with `GEMM_SMALL_M_DEFAULT` on."
                if getattr(args, "gemm_small_m", False) else "")
             + (" Rule-based dispatch: the tuning file off (`CUTLASS_OPS_TUNED=0`), Llama weights and others that no"
                " tuning file names." if getattr(args, "rules", False) else ""), "",
             "Targets (! marks a miss): " + "; ".join(TARGETS.values()) + ".", "",
             table(header, rows), "", "Summary (shapes meeting each target, of those measured):", ""]
    for dt in args.dtypes:
        for bits in args.bits:
            parts = []
            for target, text in TARGETS.items():
                shapes_met = met.get((dt, bits, target))
                if shapes_met:
                    missed = [s for s, ok in shapes_met.items() if not ok]
                    parts.append(f"{text}: {len(shapes_met) - len(missed)}/{len(shapes_met)}"
                                 + (f" (missed: {', '.join(missed)})" if missed else ""))
            lines.append(f"- {dt} W{bits}: " + ("; ".join(parts) or "no target applies to the measured M"))
    lines += [f"- failed: {f}" for f in failed]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/llm_shapes.md")
    parser.add_argument("--quick", action="store_true",
                        help=f"{', '.join(QUICK_SHAPES)}; M = 1, 16, 64; fp16 (the filters below still apply)")
    parser.add_argument("--shapes", nargs="+", metavar="S",
                        help="names (8B/qkv), models (70B), layers (down) or NxK (4096x14336), of SHAPES "
                             "(with --rules and OTHER_SHAPES); default all")
    parser.add_argument("--M", type=int, nargs="+", help=f"default {' '.join(map(str, M_VALUES))}")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help="default fp16 bf16")
    parser.add_argument("--bits", type=int, nargs="+", choices=(4, 8), default=[4, 8], help="default 4 8")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--rules", action="store_true",
                      help="the rule-based dispatch (tuning file off) on these weights and OTHER_SHAPES")
    mode.add_argument("--gemm-small-m", action="store_true",
                      help="default dispatch with weight_only.dispatch.GEMM_SMALL_M_DEFAULT on")
    args = parser.parse_args(argv)
    args.M = sorted(set(args.M or ((1, 16, 64) if args.quick else M_VALUES)))
    args.dtypes = args.dtypes or (["fp16"] if args.quick else list(DTYPES))
    args.bits = sorted(set(args.bits))
    return args


def shape_pool(args: argparse.Namespace) -> tuple:
    """SHAPES, with --rules and OTHER_SHAPES."""
    return SHAPES + OTHER_SHAPES if args.rules else SHAPES


def selected_shapes(args: argparse.Namespace) -> list:
    """The shapes of :func:`shape_pool`, those of --quick, then those --shapes picks."""
    pool = shape_pool(args)
    shapes = [s for s in pool if name(s) in QUICK_SHAPES] if args.quick else list(pool)
    return [s for s in shapes if selected(s, args.shapes)] if args.shapes else shapes


def apply_mode(args: argparse.Namespace) -> None:
    """--rules: the tuning file off for this process (read at each dispatch); --gemm-small-m: that strategy on."""
    if args.rules:
        os.environ[tuned.ENV_SWITCH] = "0"
    if args.gemm_small_m:
        from cutlass_ops.weight_only import dispatch

        dispatch.GEMM_SMALL_M_DEFAULT = True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    apply_mode(args)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
    if not torch.cuda.is_available():
        log.error("needs a CUDA GPU")
        return 1
    shapes = selected_shapes(args)
    if not shapes:
        log.error("--shapes selects none of %s", ", ".join(name(s) for s in shape_pool(args)))
        return 2
    start = time.perf_counter()
    torch.manual_seed(0)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    major, minor = torch.cuda.get_device_capability()
    bw = copy_bandwidth()
    log.info("copy bandwidth %.2f TB/s, L2 %.0f MiB; %d shapes x M %s x %s x W%s", bw / 1e12, l2 / 2**20,
             len(shapes), args.M, args.dtypes, args.bits)
    results, qbytes, reads, failed = {}, {}, {}, []
    with torch.inference_mode():
        for k, shape in enumerate(shapes):
            try:
                measure_shape(shape, args, l2, 10 * major + minor, results, qbytes, reads)
            except Exception as exc:  # report what was measured and go on with the next shape
                log.exception("%s failed", name(shape))
                failed.append(f"{name(shape)}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}")
            gc.collect()
            torch.cuda.empty_cache()
            last = k == len(shapes) - 1
            with contextlib.redirect_stdout(io.StringIO()) if not last else contextlib.nullcontext():
                write_report(report(shapes, args, results, qbytes, reads, bw, l2, failed), args.out,
                             "llm_shapes_gemm_small_m" if args.gemm_small_m else
                             "llm_shapes_rules" if args.rules else "llm_shapes")
    log.info("done: %d shapes in %.0f s%s", len(shapes), time.perf_counter() - start,
             f", {len(failed)} failed" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
