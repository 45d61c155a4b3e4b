#!/usr/bin/env python3
"""Host time per call of the public API, beside torch's own calls: the number that decides eager speed.

Each row is the minimum over ``--rounds`` rounds of the mean host time of ``--calls`` back-to-back
calls (the GPU keeps up: the problems are small), with grad mode off (inference) and on. The
minimum, not the median: host timings on a shared machine only ever get slower, so the least
disturbed round is the one that measures the code.

To compare two checkouts (the acceptance of a host-side change), run this script alternately in
each, several times, on one machine, each with its own ``CUTLASS_OPS_CACHE_DIR`` and with only
the public API in common::

    for i in 1 2 3; do
      PYTHONPATH=old python3 scripts/host_time.py --out /tmp/old_$i.md
      PYTHONPATH=new python3 scripts/host_time.py --out /tmp/new_$i.md
    done
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from _timing import table, write_report


def rows(device: str) -> dict:
    import cutlass_ops as co

    qw = co.quantize_weight(torch.randn(1024, 1024), bits=4, block_size=128).to(device)
    x1 = torch.randn(1, 1024, device=device, dtype=torch.float16)
    A = torch.randint(-128, 128, (32, 1024), dtype=torch.int8, device=device)
    B = torch.randint(-128, 128, (1024, 1024), dtype=torch.int8, device=device)
    s_row, s_col = torch.rand(32, device=device), torch.rand(1024, device=device)
    bias = torch.rand(1024, device=device)
    D = torch.empty(32, 1024, dtype=torch.float16, device=device)
    lin = torch.nn.Linear(1024, 1024, device=device, dtype=torch.float16)
    return {
        "nn.Linear fp16, M=1 (yardstick)": lambda: lin(x1),
        "torch._int_mm, M=32 (yardstick)": lambda: torch._int_mm(A, B.t()),
        "cutlass_ops.linear W4A16, M=1": lambda: co.linear(x1, qw),
        "cutlass_ops.int8_gemm dequant -> f16, M=32": lambda: co.int8_gemm(
            A, B, "dequant", scale_row=s_row, scale_col=s_col, bias=bias, out_dtype=torch.float16),
        "cutlass_ops.int8_gemm dequant, out=D, M=32": lambda: co.int8_gemm(
            A, B, "dequant", scale_row=s_row, scale_col=s_col, bias=bias, out=D),
    }


def host_us(fn, calls: int, rounds: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/host_time.md")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_time.py needs a GPU")
    calls = rows("cuda")
    with torch.no_grad():
        inference = {name: host_us(fn, args.calls, args.rounds) for name, fn in calls.items()}
    grad = {name: host_us(fn, args.calls, args.rounds) for name, fn in calls.items()}
    body = table(["call", "host us (no_grad)", "host us (grad mode)"],
                 [[name, inference[name], grad[name]] for name in calls])
    write_report([f"{torch.cuda.get_device_name()}; min over {args.rounds} rounds of {args.calls} calls.", "", body],
                 args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
