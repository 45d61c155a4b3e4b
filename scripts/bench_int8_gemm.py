#!/usr/bin/env python3
"""Benchmark (not a test): CUTLASS int8 GEMM with the fused ``dequant`` epilogue, per kernel
generation, against torch._int_mm (cuBLASLt, int32 out, no scaling), timed as a user calls it.

Columns: wall us per call (host cost included, back-to-back calls; the paths of one shape take
turns over 5 rounds of 30 calls, in a rotating order and each after 0.1 s idle; median per path),
the ratio
torch/ours (>1 is faster than torch._int_mm), device us per call (a CUDA graph of 20 calls: no host
cost), host us per call (median of 5 loops).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _timing import call_us, graph_us, host_us, table, write_report

import cutlass_ops as ops

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16, 8192, 8192), (128, 8192, 8192), (1024, 8192, 8192)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_int8_gemm.md")
    p.add_argument("--archs", nargs="+", type=int, default=[90, 80, 75])
    args = p.parse_args()
    cc = torch.cuda.get_device_capability()
    archs = [a for a in args.archs if not (a == 90 and cc != (9, 0)) and a <= 10 * cc[0] + cc[1]]
    rows = []
    for M, N, K in SHAPES:
        A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
        B = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
        s_row = torch.rand(M, device="cuda") * 1e-2
        s_col = torch.rand(N, device="cuda") * 1e-2
        bias = torch.randn(N, device="cuda")
        # torch._int_mm needs M > 16: time M=16 at M=17 (what a caller would have to pad to)
        A_t = A if M > 16 else torch.randint(-128, 128, (17, K), dtype=torch.int8, device="cuda")
        calls = {"torch._int_mm": lambda: torch._int_mm(A_t, B.t())}
        for arch in archs:
            kwargs = dict(scale_row=s_row, scale_col=s_col, bias=bias, out_dtype=torch.float16)
            fn = lambda arch=arch, kwargs=kwargs: ops.int8_gemm(A, B, "dequant", arch=arch, **kwargs)  # noqa: E731
            try:
                fn()
            except Exception as exc:  # report the failure in the table, keep benchmarking the rest
                rows.append([f"{M}x{N}x{K}", f"Sm{arch} dequant", f"failed: {type(exc).__name__}: {exc}"[:120],
                             "", "", ""])
                continue
            calls[f"Sm{arch} dequant"] = fn
        # Wall time per call: the paths take turns, 5 rounds in a rotating order, each loop after a
        # short idle, median per path. At 8192^3 the GPU runs at its power limit and its clock follows
        # what ran just before: without the rotation and the idle, a path timed right after a hotter
        # one measured up to 20% slower than its own CUDA-graph time.
        walls: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(5):
            for name in names[r % len(names):] + names[:r % len(names)]:
                torch.cuda.synchronize()
                time.sleep(0.1)
                walls[name].append(call_us(calls[name], iters=30, repeats=1))
        wall = {name: statistics.median(values) for name, values in walls.items()}
        for name, fn in calls.items():
            time.sleep(0.1)
            device = graph_us(fn)
            rows.append([f"{M}x{N}x{K}", name, wall[name], f"{wall['torch._int_mm'] / wall[name]:.2f}", device,
                         host_us(fn)])
    text = (f"GPU: {torch.cuda.get_device_name()}\n\n"
            + table(["M x N x K", "kernel", "call us", "torch/ours", "device us", "host us"], rows))
    write_report([text], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
