"""Benchmark conv2d_weight_only (int4 / int8 weights, fp16 activations) against cuDNN fp16.

The 8 anchor layers in ``LAYERS`` below (padding k // 2). For each: cuDNN fp16 in NCHW and
channels_last (torch.nn.functional.conv2d, cudnn.benchmark on), ours with int4 and int8
weights in both layouts (strategy "auto"), and a split-K sweep of ours (int4, NHWC) to show
how far the automatic choice is from the best. Median kernel times (triton.testing.do_bench
when available, else CUDA events), a markdown table on stdout and in
scripts/results/<gpu>/bench_conv.md (or --out).

    python scripts/bench_conv.py
"""
from __future__ import annotations

import argparse
import logging
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from _timing import write_report

from cutlass_ops.formats import quantize_conv_weight
from cutlass_ops.conv import conv2d_weight_only

log = logging.getLogger("bench_conv")

# (batch, Ci, H (= W), Co, k, stride), padding k // 2
LAYERS = [
    (1, 64, 56, 64, 3, 1),
    (1, 256, 56, 64, 1, 1),
    (1, 128, 28, 128, 3, 1),
    (1, 512, 7, 512, 3, 1),
    (8, 64, 56, 64, 3, 1),
    (8, 256, 14, 256, 3, 1),
    (8, 512, 7, 2048, 1, 1),
    (1, 128, 56, 128, 3, 2),
]
SPLITS = (1, 2, 4, 8, 16, 32)


def bench_eager_us(fn) -> float:
    """Median time per eager call in microseconds (host launch cost shows when it exceeds the kernel's)."""
    try:
        from triton.testing import do_bench

        return 1000.0 * do_bench(fn, warmup=25, rep=100, return_mode="median")
    except ImportError:
        return _event_median_us(fn, 1)


def _event_median_us(fn, calls: int, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def bench_graph_us(fn, calls: int = 20) -> float:
    """Median GPU time per call in microseconds: `calls` calls captured in one CUDA graph, replayed."""
    fn()  # warm up (compiles, cudnn.benchmark autotuning) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return _event_median_us(graph.replay, calls)


def bench_layer(layer, block_size: int) -> dict:
    batch, Ci, H, Co, k, stride = layer
    pad = k // 2
    torch.manual_seed(0)
    w = torch.randn(Co, Ci, k, k) * 0.05
    x = torch.randn(batch, Ci, H, H, device="cuda", dtype=torch.float16)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w16 = w.half().cuda()
    w16_cl = w16.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(Co, device="cuda", dtype=torch.float16)
    row = {}
    fns = {"cudnn_nchw": lambda: F.conv2d(x, w16, bias, stride, pad),
           "cudnn_nhwc": lambda: F.conv2d(x_cl, w16_cl, bias, stride, pad)}
    qws = {bits: quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False).to("cuda")
           for bits in (4, 8)}
    for bits, qw in qws.items():
        for name, xin in (("nhwc", x_cl), ("nchw", x)):
            out = conv2d_weight_only(xin, qw, bias, stride, pad)
            # sanity: agree with cuDNN on the dequantized weight
            ref = F.conv2d(xin.float(), qw.dequantize(torch.float32).cuda(), bias.float(), stride, pad)
            row[f"w{bits}_{name}_relerr"] = ((out.float() - ref).norm() / ref.norm()).item()
            if row[f"w{bits}_{name}_relerr"] > 1e-2:
                log.warning("layer %s w%d %s: relative error %.2e", layer, bits, name,
                            row[f"w{bits}_{name}_relerr"])
            fns[f"w{bits}_{name}"] = (lambda xin=xin, qw=qw, out=out:
                                      conv2d_weight_only(xin, qw, bias, stride, pad, out=out))
    for key, fn in fns.items():
        row[key] = bench_graph_us(fn)
        row[key + "_eager"] = bench_eager_us(fn)
    # split-K sweep (int4, NHWC), GPU time
    out = torch.empty_like(F.conv2d(x_cl, w16_cl, bias, stride, pad))
    row["sweep"] = {s: bench_graph_us(lambda s=s: conv2d_weight_only(x_cl, qws[4], bias, stride, pad, out=out,
                                                                     strategy="igemm", split_k=s))
                    for s in SPLITS}
    row["weight_bytes"] = {4: qws[4].nbytes, 8: qws[8].nbytes, 16: w16.numel() * 2}
    return row


def host_overhead_us(layer, block_size: int, calls: int = 200) -> float:
    """Host time per call (asynchronous launches, timed with a host clock)."""
    import time

    batch, Ci, H, Co, k, stride = layer
    qw = quantize_conv_weight(torch.randn(Co, Ci, k, k), bits=4, block_size=block_size).to("cuda")
    x = torch.randn(batch, Ci, H, H, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    out = conv2d_weight_only(x, qw, None, stride, k // 2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        conv2d_weight_only(x, qw, None, stride, k // 2, out=out)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="default: scripts/results/<gpu>/bench_conv.md")
    p.add_argument("--block-size", type=int, default=64, help="quantization block along Ci (default 64)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.backends.cudnn.benchmark = True

    dev = torch.cuda.get_device_name()
    lines = [f"# conv2d_weight_only vs cuDNN fp16 ({dev}, block_size {args.block_size})", "",
             "GPU time per call in us (median, calls replayed from a CUDA graph); eager = median per eager",
             "call with do_bench (includes host launch cost where it exceeds the kernel time).", "",
             "| batch, Ci, HxW, Co, k, stride | cuDNN NCHW | cuDNN NHWC | w4 NHWC | w4 / cuDNN NHWC | w8 NHWC "
             "| w4 NCHW | w8 NCHW | w4 best split (us @ s) | eager: cuDNN NHWC / w4 NHWC |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for layer in LAYERS:
        r = bench_layer(layer, args.block_size)
        best_s = min(r["sweep"], key=r["sweep"].get)
        ratio = r["w4_nhwc"] / r["cudnn_nhwc"]
        ratios.append(ratio)
        b, ci, h, co, k, s = layer
        lines.append(f"| {b}, {ci}, {h}x{h}, {co}, {k}, {s} | {r['cudnn_nchw']:.1f} | {r['cudnn_nhwc']:.1f} "
                     f"| {r['w4_nhwc']:.1f} | {ratio:.2f}x | {r['w8_nhwc']:.1f} | {r['w4_nchw']:.1f} "
                     f"| {r['w8_nchw']:.1f} | {r['sweep'][best_s]:.1f} @ {best_s} "
                     f"| {r['cudnn_nhwc_eager']:.1f} / {r['w4_nhwc_eager']:.1f} |")
        log.info("%s", lines[-1])
        log.info("%s done: sweep %s, rel.err w4 %.1e w8 %.1e", layer,
                 {s: round(t, 1) for s, t in r["sweep"].items()}, r["w4_nhwc_relerr"], r["w8_nhwc_relerr"])
    geo = 1.0
    for x in ratios:
        geo *= x
    geo **= 1.0 / len(ratios)
    lines += ["", f"Geometric mean w4 NHWC / cuDNN NHWC (GPU time): {geo:.2f}x (target <= 1.5x). "
              f"Host time per call (layer 1, async launches): {host_overhead_us(LAYERS[0], args.block_size):.1f} us."]
    write_report(lines, args.out, "bench_conv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
