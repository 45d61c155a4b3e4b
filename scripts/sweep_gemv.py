#!/usr/bin/env python3
"""Sweep the small-M weight-only GEMV variants on the GPU (a benchmark, not a test).

Times every ``GemvMmaConfig`` / ``StreamConfig`` variant below (``cutlass_ops.weight_only``) at
M = 1 (and the best ones at M = 8 and 16) on N = K = 8192 and N = 28672, K = 8192, int4 and int8,
group 128, fp16 activations, against the device-to-device copy bandwidth measured in the same run.
Each variant's output is compared with the default plan's before it is timed (a variant that
disagrees is reported, not timed).

    python3 scripts/sweep_gemv.py [--bits 4] [--jobs 16]   # -> scripts/results/<gpu>/sweep_gemv.md
    python3 scripts/sweep_gemv.py --floor-only             # -> scripts/results/<gpu>/read_floor.md

The variants are compiled first in parallel processes (NVRTC, into the project's kernel cache).
"""
from __future__ import annotations

import argparse
import itertools
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

GROUP = 128
SHAPES = ((8192, 8192), (28672, 8192))  # (N, K)


def mma_configs():
    from cutlass_ops.weight_only import GemvMmaConfig

    for rt, unroll, mb in itertools.product((1, 2), (2, 4, 8), (1, 2, 3)):
        if rt * unroll > 8:  # weight registers: 16 bytes x 2 halves x row_tiles x unroll <= 128 words
            continue
        for warps, splits in ((8, None), (4, None), (8, 2)):
            yield GemvMmaConfig(row_tiles=rt, unroll=unroll, min_blocks=mb, warps=warps, splits=splits)


def stream_configs():
    from cutlass_ops.weight_only import StreamConfig

    for rows, warps, mb in itertools.product((1, 2, 4, 8), (4, 8), (2, 4)):
        yield StreamConfig(rows=rows, warps=warps, min_blocks=mb)


def _compile(job) -> str:
    from custom_kernels.nvrtc import compile_file

    filename, defines, arch = job
    compile_file(filename, arch, defines=dict(defines))
    return f"{filename} {dict(defines)}"


def precompile(bits_list, arch: str, jobs: int) -> None:
    modules = set()  # (source, defines): gemv_mma.cu per GemvMmaConfig, gemv_stream.cu per StreamConfig
    for bits in bits_list:
        base = (("WO_BITS", bits), ("WO_ELEMENT", 0))
        for filename, configs in (("gemv_mma.cu", mma_configs()), ("gemv_stream.cu", stream_configs())):
            for cfg in configs:
                modules.add((filename, tuple(sorted(dict(base, **cfg.defines()).items()))))
    with ProcessPoolExecutor(jobs) as pool:
        for _ in pool.map(_compile, [(f, d, arch) for f, d in sorted(modules)]):
            pass
    print(f"compiled {len(modules)} variants of gemv_mma.cu / gemv_stream.cu for sm_{arch}", flush=True)


def read_floor(sizes_mb, bench_us, bw: float) -> list[str]:
    """The streaming-read floor (scripts/_read_floor.py) for each size, as markdown lines."""
    from _read_floor import empty_kernel_us, read_floor_us

    lines = ["## Streaming-read floor (bare kernel, no math)", "",
             "| MB read | best us | % copy BW | blocks/SM x 256 threads, UNROLL | empty kernel us |", "|---|---|---|---|---|"]
    empty = empty_kernel_us(bench_us)
    for mb in sizes_mb:
        nbytes = int(mb * 1e6) // 16 * 16
        us, per_sm, unroll = read_floor_us(nbytes, bench_us)
        lines.append(f"| {mb:.1f} | {us:.1f} | {100 * nbytes / (us * 1e-6) / bw:.0f}% | {per_sm}, {unroll} | {empty:.1f} |")
        print(lines[-1], flush=True)
    return lines + [""]


def main() -> int:
    import torch

    from _timing import write_report
    from bench_weight_only import Rotating, bench_us, copy_bandwidth, weight_bytes
    from cutlass_ops.formats import quantize_weight
    from custom_kernels.device import target_arch
    from cutlass_ops import weight_only as wo

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/sweep_gemv.md "
                   "(read_floor.md with --floor-only)")
    p.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--top", type=int, default=4, help="variants per strategy re-timed at M = 8 and 16")
    p.add_argument("--floor-only", action="store_true", help="only the streaming-read floor")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    bw = copy_bandwidth()
    lines = [f"# Small-M weight-only GEMV sweep on {torch.cuda.get_device_name()}", "",
             f"Device-to-device copy: {bw / 1e12:.2f} TB/s. fp16 activations, group {GROUP}; median us "
             f"(triton do_bench, L2 flushed; 3 weight copies rotated). % = weight + scale bytes / time / copy BW.", ""]
    lines += read_floor([8.9, 35.7, 124.8], bench_us, bw)
    if args.floor_only:
        write_report(lines, args.out, "read_floor")
        return 0
    precompile(args.bits, target_arch(), args.jobs)
    best: dict = {}
    for N, K in SHAPES:
        for bits in args.bits:
            copies = 3 if N * K <= 8192 * 8192 else 2
            qws = [quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=bits, block_size=GROUP)
                   for _ in range(copies)]
            moved = weight_bytes(qws[0])
            rows = []
            for strategy, configs in (("gemv_mma", list(mma_configs())), ("gemv_stream", list(stream_configs()))):
                for M in (1,):
                    xs = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(copies)]
                    ref = wo.linear_weight_only(xs[0], qws[0], strategy="gemv_simt").float()
                    tol = 2e-2 * ref.abs().max().item() + 1e-3
                    for cfg in configs:
                        try:
                            got = wo.linear_weight_only(xs[0], qws[0], strategy=strategy, config=cfg).float()
                        except Exception as exc:  # noqa: BLE001 - a variant that cannot launch is reported
                            rows.append((float("inf"), strategy, M, cfg, f"failed: {type(exc).__name__}: {exc}"[:120]))
                            continue
                        err = (got - ref).abs().max().item()
                        if not err <= tol:
                            rows.append((float("inf"), strategy, M, cfg, f"WRONG: max err {err:.3g} > {tol:.3g}"))
                            continue
                        us = bench_us(Rotating(lambda i, c=cfg, s=strategy, x=xs: wo.linear_weight_only(
                            x[i], qws[i], strategy=s, config=c), copies), rep_ms=30)
                        rows.append((us, strategy, M, cfg, ""))
            rows.sort(key=lambda r: r[0])
            lines += [f"## N = {N}, K = {K}, int{bits}, M = 1 ({moved / 1e6:.1f} MB of weights + scales)", "",
                      "| us | % copy BW | strategy | config | note |", "|---|---|---|---|---|"]
            for us, strategy, M, cfg, note in rows:
                pct = f"{100 * (moved + 2 * K + 2 * N) / (us * 1e-6) / bw:.0f}%" if us != float("inf") else "-"
                lines.append(f"| {us:.1f} | {pct} | {strategy} | {cfg} | {note} |")
            lines.append("")
            print("\n".join(lines[-len(rows) - 4:]), flush=True)
            # The best variants of each strategy at M = 8 and 16 (gemv_mma only for 16).
            lines += [f"Best M = 1 variants at larger M (N = {N}, K = {K}, int{bits}):", "",
                      "| strategy | config | M=1 | M=8 | M=16 |", "|---|---|---|---|---|"]
            for strategy in ("gemv_mma", "gemv_stream"):
                ranked = [r for r in rows if r[1] == strategy and r[0] != float("inf")][:args.top]
                default = wo.GemvMmaConfig() if strategy == "gemv_mma" else wo.StreamConfig()
                if not any(r[3] == default for r in ranked):
                    ranked += [r for r in rows if r[1] == strategy and r[3] == default]
                for us1, _, _, cfg, _ in ranked:
                    cells = [f"{us1:.1f}"]
                    for M in (8, 16):
                        if strategy == "gemv_stream" and M > 8:
                            cells.append("-")
                            continue
                        xs = [torch.randn(M, K, device="cuda", dtype=torch.float16) for _ in range(copies)]
                        try:
                            us = bench_us(Rotating(lambda i, c=cfg, s=strategy, x=xs: wo.linear_weight_only(
                                x[i], qws[i], strategy=s, config=c), copies), rep_ms=30)
                            cells.append(f"{us:.1f}")
                        except Exception as exc:  # noqa: BLE001
                            cells.append(f"failed: {type(exc).__name__}")
                    lines.append(f"| {strategy} | {cfg}{' (default)' if cfg == default else ''} | " + " | ".join(cells) + " |")
                    best.setdefault((N, K, bits, strategy), (us1, cfg))
            lines.append("")
            print("\n".join(lines[-12:]), flush=True)
            del qws
            torch.cuda.empty_cache()
    lines += ["## Best M = 1 variant per shape", "", "| N | K | bits | strategy | us | config |", "|---|---|---|---|---|---|"]
    for (N, K, bits, strategy), (us, cfg) in sorted(best.items()):
        lines.append(f"| {N} | {K} | {bits} | {strategy} | {us:.1f} | {cfg} |")
    write_report(lines, args.out, "sweep_gemv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
