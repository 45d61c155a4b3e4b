#!/usr/bin/env python3
"""Benchmark the weight-only linear kernels (W4A16, W8A16) against fp16 cuBLAS and torch's tinygemm.

Prints markdown tables (and writes them to scripts/results/<gpu>/bench_weight_only.md, or --out): kernel time per M for N = K = 8192 and
N = 28672, K = 8192, the achieved fraction of device-to-device copy bandwidth (measured in the
same run), per-strategy times at small M, and host time per call at M = 1.

Times are medians of triton.testing.do_bench (which flushes L2 before every call) when triton is
installed, else of CUDA events around each call after an L2-sized flush. Several weight copies
are rotated anyway, so that no weight stays in L2 between calls.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from _read_floor import read_floor_us
from _timing import Rotating, host_us, write_report

from custom_kernels.device import capability
from cutlass_ops.formats import quantize_weight
from cutlass_ops import weight_only as wo

M_VALUES = (1, 16, 64, 256, 4096)
SHAPES = ((8192, 8192), (28672, 8192))  # (N, K)
GROUP = 128


def bench_us(fn, rep_ms: int = 100) -> float:
    """Median device time of fn() in microseconds."""
    try:
        from triton.testing import do_bench

        return 1e3 * do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    except ImportError:
        pass
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    times = []
    for _ in range(30):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = bench_us(lambda: dst.copy_(src))
    return 2 * nbytes / (us * 1e-6)


def tinygemm(N: int, K: int, copies: int):
    """torch._weight_int4pack_mm (group 128) on random packed weights, or (None, reason)."""
    try:
        packed, scales = [], []
        for _ in range(copies):
            q = torch.randint(0, 16, (N, K), dtype=torch.int32, device="cuda")
            w_uint8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
            try:
                packed.append(torch._convert_weight_to_int4pack(w_uint8, 8))
            except RuntimeError:  # older torch took int32 [N, K]
                packed.append(torch._convert_weight_to_int4pack(q, 8))
            sz = torch.rand(K // GROUP, N, 2, device="cuda").to(torch.bfloat16)
            scales.append(sz)

        def run(x, i):
            return torch._weight_int4pack_mm(x, packed[i], GROUP, scales[i])

        run(torch.randn(1, K, device="cuda", dtype=torch.bfloat16), 0)
        return run, None
    except (RuntimeError, AttributeError, TypeError) as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"


def weight_bytes(qw) -> int:
    """Bytes the fp16 kernels stream per call: packed weights + (scale, offset) half pairs."""
    return qw.qweight.numel() + 4 * qw.scale.numel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_weight_only.md")
    parser.add_argument("--copies", type=int, default=3, help="weight copies rotated between calls")
    parser.add_argument("--quick", action="store_true", help="only N = K = 8192")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    cc = capability()  # the dispatch and strategy checks of this GPU
    lines = [f"# Weight-only linear benchmark on {dev}", ""]
    bw = copy_bandwidth()
    lines.append(f"Device-to-device copy: {bw / 1e12:.2f} TB/s (read + write). Times: median us.")
    lines.append("")

    shapes = SHAPES[:1] if args.quick else SHAPES
    for N, K in shapes:
        copies = args.copies if N * K <= 8192 * 8192 else 2
        w16 = [torch.randn(N, K, device="cuda", dtype=torch.float16) * 0.02 for _ in range(1)]
        qw4 = [quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=4, block_size=GROUP)
               for _ in range(copies)]
        qw8 = [quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=8, block_size=GROUP)
               for _ in range(copies)]
        tg, tg_problem = tinygemm(N, K, copies)
        lines.append(f"## N = {N}, K = {K} (group {GROUP})")
        lines.append("")
        if tg_problem:
            lines.append(f"tinygemm unavailable: {tg_problem}")
            lines.append("")
        floor_us, _, _ = read_floor_us(weight_bytes(qw4[0]) // 16 * 16, lambda f: bench_us(f, rep_ms=30))
        lines.append(f"Streaming-read floor of the W4A16 weight + scale bytes ({weight_bytes(qw4[0]) / 1e6:.1f} MB): "
                     f"{floor_us:.1f} us = {100 * weight_bytes(qw4[0]) / (floor_us * 1e-6) / bw:.0f}% of copy "
                     f"bandwidth (a bare kernel that only reads them, launch included; scripts/_read_floor.py).")
        lines.append("")
        lines.append("| M | fp16 cuBLAS | tinygemm | W4A16 (strategy) | W8A16 (strategy) | W4A16 vs fp16 | "
                     "W4A16 GB/s | W4A16 % of copy BW | W4A16 % of read floor |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for M in M_VALUES:
            x16 = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(copies)]
            xbf = [x.to(torch.bfloat16) for x in x16]
            t16 = bench_us(lambda: torch.matmul(x16[0], w16[0].T))
            ttg = bench_us(Rotating(lambda i: tg(xbf[i], i), copies)) if tg else float("nan")
            t4 = bench_us(Rotating(lambda i: wo.linear_weight_only(x16[i], qw4[i]), copies))
            t8 = bench_us(Rotating(lambda i: wo.linear_weight_only(x16[i], qw8[i]), copies))
            s4 = wo.choose_strategy(M, torch.float16, qw4[0], cc)
            s8 = wo.choose_strategy(M, torch.float16, qw8[0], cc)
            moved = weight_bytes(qw4[0]) + 2 * M * K + 2 * M * N
            gbs = moved / (t4 * 1e-6) / 1e9
            floor_pct = f"{100 * floor_us / t4:.0f}%" if M == 1 else ""
            lines.append(f"| {M} | {t16:.1f} | {ttg:.1f} | {t4:.1f} ({s4}) | {t8:.1f} ({s8}) | "
                         f"{t16 / t4:.2f}x | {gbs:.0f} | {100 * moved / (t4 * 1e-6) / bw:.0f}% | {floor_pct} |")
            print(lines[-1], flush=True)
        lines.append("")

        lines.append(f"Kernel variants, W4A16 / W8A16, N = {N}, K = {K} (us):")
        lines.append("")
        lines.append("| M | strategy | variant | W4A16 | W8A16 |")
        lines.append("|---|---|---|---|---|")
        variants = [("gemv_mma", None), ("gemv_simt", None), ("gemv_dp4a", None), ("gemm_small_m", None),
                    ("gemm_wgmma", None)]  # the default variant of each strategy (no tuned entry)
        variants += [("gemm_mma", c) for c in wo.GEMM_CONFIGS]
        for M in (1, 8, 16, 32, 64, 128, 256, 4096):
            x16 = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(copies)]
            for strategy, config in variants:
                if (strategy == "gemv_mma" and M > 64 or strategy == "gemm_mma" and M < 16
                        or strategy == "gemm_small_m" and M < 8 or strategy == "gemm_wgmma" and M < 16):
                    continue
                row = []
                for qws in (qw4, qw8):
                    if wo.strategy_problem(strategy, M, torch.float16, qws[0], cc) is not None:
                        row.append("-")
                        continue
                    fn = Rotating(lambda i, s=strategy, c=config, q=qws:
                                  wo.linear_weight_only(x16[i], q[i], strategy=s, config=c), copies)
                    row.append(f"{bench_us(fn, rep_ms=40):.1f}")
                if row != ["-", "-"]:
                    name = "" if config is None else f"m_tile={config.m_tile}"
                    lines.append(f"| {M} | {strategy} | {name} | {row[0]} | {row[1]} |")
                    print(lines[-1], flush=True)
        lines.append("")
        del w16, qw4, qw8, tg
        torch.cuda.empty_cache()

    # Host cost: a problem small enough that the GPU keeps up with the launches.
    import cutlass_ops

    N = K = 1024
    qw = quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=4, block_size=GROUP)
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    lines.append("Host time per call at M = 1 (N = K = 1024, us):")
    lines.append("")
    lines.append("| call | us |")
    lines.append("|---|---|")
    for name, fn in (("linear_weight_only (W4A16)", lambda: wo.linear_weight_only(x, qw)),
                     ("cutlass_ops.linear (W4A16)", lambda: cutlass_ops.linear(x, qw)),
                     ("torch.matmul fp16", lambda: torch.matmul(x, w.T))):
        lines.append(f"| {name} | {host_us(fn, iters=3000, warmup=50):.1f} |")
        print(lines[-1], flush=True)
    lines.append("")

    write_report(lines, args.out, "bench_weight_only")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
