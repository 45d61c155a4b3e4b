#!/usr/bin/env python3
"""Can a GEMV's weights be brought into L2 while the kernels before it leave the memory idle?

In a decode step every weight-only GEMV follows kernels that barely touch memory (norms, rope, attention at
batch 1: ~15 us per layer on an H200), then streams its weights from HBM. This probe times, per Llama-3-8B
W4A16 weight (M = 1, fp16, block 128), a CUDA graph that rotates over copies of the weight (L2 defeated) and
for each copy runs

    [prefetch of the GEMV's bytes] -> [an idle kernel of S us (torch.cuda._sleep)] -> [cutlass_ops.linear]

against the same graph without the prefetch. The prefetch kernels (``scripts/kernels/l2_prefetch.cu``) are
fire-and-forget: ``bulk`` issues one ``cp.async.bulk.prefetch.L2`` per 64 KB, ``lines`` one
``prefetch.global.L2::evict_last`` per 128-byte line. Reported per weight and S: the GEMV's own time (graph
time minus the graph of the same prefetch and sleep without the GEMV), the whole sequence's time, and the
GEMV with its weight already in L2 (the same copy every call) as the bound.

    python scripts/probe_l2_prefetch.py [--sleep-us 0 4 10] [--out PATH]
        # -> scripts/results/<gpu>/l2_prefetch_probe.md
    python scripts/probe_l2_prefetch.py --compile-only   # the kernels for sm_90a, no GPU

A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger("probe_l2_prefetch")
SOURCE = Path(__file__).resolve().parent / "kernels" / "l2_prefetch.cu"
SHAPES = (("8B o", 4096, 4096), ("8B qkv", 6144, 4096), ("8B gate", 14336, 4096), ("8B down", 4096, 14336))
CHUNK = 64 * 1024


def build(arch: str):
    from custom_kernels.nvrtc import compile_source

    return compile_source(SOURCE.read_text(), arch, name="l2_prefetch.cu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sleep-us", type=float, nargs="+", default=[0.0, 4.0, 10.0])
    ap.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/l2_prefetch_probe.md")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
    if args.compile_only:
        print(f"sm_90a: {len(build('90a').data)} bytes")
        return 0

    import torch
    from _timing import graph_us, sleep_cycles_per_us, table, write_report
    from bench_llm_shapes import rotated_us, weight_copies

    import cutlass_ops
    from custom_kernels.launch import I64, U32, KernelArgs, Launch, LaunchConfig, Module, Ptr
    from cutlass_ops.weight_only import recipe

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        log.error("needs an sm_90 GPU (bulk prefetch)")
        return 2

    class BulkArgs(KernelArgs):
        _fields_ = [("src", Ptr), ("bytes", I64), ("chunk", U32)]

    class LineArgs(KernelArgs):
        _fields_ = [("src", Ptr), ("bytes", I64)]

    module = Module(build("90a").data, name="l2_prefetch")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size

    def prefetchers(tensors):
        """{form: callable issuing the prefetch of every tensor the GEMV reads}."""
        bulk = [Launch(module.kernel("prefetch_bulk"), LaunchConfig.of(sms, 128),
                       BulkArgs(src=t.data_ptr(), bytes=t.numel() * t.element_size() // 16 * 16, chunk=CHUNK))
                for t in tensors]
        lines = [Launch(module.kernel("prefetch_lines"), LaunchConfig.of(4 * sms, 256),
                        LineArgs(src=t.data_ptr(), bytes=t.numel() * t.element_size())) for t in tensors]
        return {"bulk": lambda: [b() for b in bulk], "lines": lambda: [b() for b in lines]}

    cycles_per_us = sleep_cycles_per_us()
    log.info("sleep: %.0f cycles per us", cycles_per_us)

    rows = []
    for label, N, K in SHAPES:
        master = torch.randn(N, K, device="cuda", dtype=torch.float16).mul_(0.02)
        qws = weight_copies(master, 4, l2)  # W4 g128 asymmetric, copies reading >= 3x L2
        qw, x = qws[0], torch.randn(1, K, device="cuda", dtype=torch.float16)
        reads = []
        for q in qws:
            cutlass_ops.linear(x, q)
            # the GEMV reads the packed weight and the plan's derived (scale, offset) words: the recipe's keep
            # after the weight's own (qweight, scale, offset)
            derived = recipe(q, torch.float16, 1, K, 0, False, 0).keep[3:]
            reads.append(prefetchers([q.qweight, *derived]))
        nbytes = sum(t.numel() * t.element_size() for t in (qw.qweight, *derived))

        def timed(fn):
            return rotated_us(fn, len(qws))

        hot = graph_us(lambda: cutlass_ops.linear(x, qw), reps=60)
        for sleep_us in args.sleep_us:
            cycles = int(sleep_us * cycles_per_us)
            sleep = (lambda: torch.cuda._sleep(cycles)) if cycles else (lambda: None)
            base = timed(lambda i: (sleep(), cutlass_ops.linear(x, qws[i])))
            idle = timed(lambda i: sleep()) if cycles else 0.0
            row = [label, f"{nbytes / 1e6:.1f}", f"{sleep_us:g}", f"{hot:.1f}", f"{base - idle:.1f}"]
            for form in ("bulk", "lines"):
                seq = timed(lambda i, f=form: (reads[i][f](), sleep(), cutlass_ops.linear(x, qws[i])))
                alone = timed(lambda i, f=form: (reads[i][f](), sleep()))
                row += [f"{seq - alone:.1f}", f"{alone - idle:.1f}", f"{seq:.1f} / {base:.1f}"]
            rows.append(row)
            log.info("%s", " | ".join(row))
        del qws, reads
        torch.cuda.empty_cache()

    head = ["weight", "MB read", "idle us", "GEMV, weight in L2", "GEMV after idle",
            "bulk: GEMV", "bulk: prefetch + idle - idle", "bulk: sequence / without",
            "lines: GEMV", "lines: prefetch + idle - idle", "lines: sequence / without"]
    lines = [f"L2 prefetch of a GEMV's weights during idle kernels ({torch.cuda.get_device_name()}, W4A16 g128, "
             "M = 1, fp16). us per call from CUDA graphs rotating over weight copies (>= 3x L2). GEMV: graph "
             "time minus the same graph without the GEMV; sequence: prefetch + idle + GEMV, against idle + GEMV.",
             "", table(head, rows), ""]
    write_report(lines, args.out, "l2_prefetch_probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
