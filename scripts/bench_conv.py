"""Benchmark conv2d_weight_only (int4 / int8 weights, fp16 activations) against cuDNN fp16.

The layer set, run at each batch of ``--batches`` (default 1 and 32; padding k // 2):

- the ResNet-50 layers: the distinct (Ci, H, Co, k, stride) of the 8 anchor layers in ``LAYERS``;
- the stem ``STEM``: Ci = 3, 7x7, stride 2, 224x224, Co = 64 (K = 147);
- the depthwise layers ``DEPTHWISE`` (groups = Ci = Co): 3x3 at 56x56 (128 channels) and a
  ConvNeXt-style 7x7 at 56x56 (96 channels).

For each layer: cuDNN fp16 in NCHW and channels_last (torch.nn.functional.conv2d, cudnn.benchmark
on), ours with int4 and int8 weights in both layouts (strategy "auto"), the ratio of ours to cuDNN
channels_last (issue 18's targets: every layer <= 1.5x, '!' marks a miss; the geometric mean of a
batch <= 1.0x), and with ``--splits`` a split-K sweep of ours (int4, NHWC, igemm layers only) to
show how far the automatic choice is from the best. ``--prefer S ...`` (depthwise, small_ci, igemm,
dequant_cudnn) times, on each layer one of those strategies can run, that strategy instead of "auto" (the
auto column names what ran; "auto" itself picks dequant_cudnn from ``DEQUANT_CUDNN_MIN_MACS``
multiply-adds on, depthwise for groups = Ci and small_ci for stems of <= 4 channels). The quantization block is ``--block-size`` where it divides K = Kh*Kw*Ci/groups, else the
largest divisor of K below it (the stem: 49 of 147; depthwise: the whole row, 9 or 49). A layer the
API refuses gets the cell "refused: <reason>".
GPU times from CUDA graphs of repeated calls (no host time, operands warm in L2 as a network's
activations would mostly be); eager = median per eager call (triton.testing.do_bench when
available, else CUDA events), host launch cost included. A markdown table on stdout and in
scripts/results/<gpu>/bench_conv.md (or --out).

    python scripts/bench_conv.py [--batches 1 32] [--block-size 64] [--splits [S ...]] [--prefer S ...]
                                 [--out PATH]
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from _timing import write_report

import cutlass_ops
from cutlass_ops.conv import DEQUANT_CUDNN_MIN_MACS, STAGED, ConvGeometry, auto_strategy as conv_auto_strategy, \
    conv2d_output_shape, conv2d_weight_only, strategy_problem
from cutlass_ops.conv.igemm import igemm_problem
from cutlass_ops.formats import quantize_conv_weight

log = logging.getLogger("bench_conv")


class Layer(NamedTuple):
    """One conv: x [batch, Ci, H, H] * w [Co, Ci / groups, k, k], stride, padding k // 2."""

    batch: int
    Ci: int
    H: int  # = W
    Co: int
    k: int
    stride: int
    groups: int = 1

    @property
    def K(self) -> int:
        """The GEMM K of one group (the weight's quantized row): k * k * Ci / groups."""
        return self.k * self.k * (self.Ci // self.groups)


# The 8 anchor layers of the earlier tables (ResNet-50 shapes at batch 1 and 8).
LAYERS = [
    Layer(1, 64, 56, 64, 3, 1),
    Layer(1, 256, 56, 64, 1, 1),
    Layer(1, 128, 28, 128, 3, 1),
    Layer(1, 512, 7, 512, 3, 1),
    Layer(8, 64, 56, 64, 3, 1),
    Layer(8, 256, 14, 256, 3, 1),
    Layer(8, 512, 7, 2048, 1, 1),
    Layer(1, 128, 56, 128, 3, 2),
]
# (Ci, H, Co, k, stride, groups) of the layers added to every batch
STEM = (3, 224, 64, 7, 2, 1)
DEPTHWISE = [(128, 56, 128, 3, 1, 128), (96, 56, 96, 7, 1, 96)]
BATCHES = (1, 32)
SPLITS = (1, 2, 4, 8, 16, 32)
RATIO_LIMIT = 1.5  # every layer: ours / cuDNN NHWC
GEOMEAN_LIMIT = 1.0  # per batch: the geometric mean of those ratios
GRAPH_CALLS = 20  # calls per CUDA graph


def resnet_shapes() -> list[tuple[int, ...]]:
    """The distinct (Ci, H, Co, k, stride, groups) of LAYERS, in their order."""
    return list(dict.fromkeys(layer[1:] for layer in LAYERS))


def layer_set(batches) -> list[Layer]:
    """Every benchmarked layer, batch by batch: the ResNet-50 shapes, the stem, the depthwise layers."""
    return [Layer(batch, *shape) for batch in batches for shape in (*resnet_shapes(), STEM, *DEPTHWISE)]


def layer_kind(layer: Layer) -> str:
    if layer.groups > 1 and layer.groups == layer.Ci == layer.Co:
        return "depthwise"
    if layer[1:] == STEM:
        return "stem"
    return "ResNet-50"


def layer_label(layer: Layer) -> str:
    """The table's first cell: batch, Ci, HxW, Co, k, stride, groups."""
    b, ci, h, co, k, s, g = layer
    return f"{b}, {ci}, {h}x{h}, {co}, {k}, {s}, {g}"


def block_size_for(K: int, requested: int) -> int:
    """``requested`` where it divides K, else the largest divisor of K below it (blocks run along K)."""
    if requested < 1:
        raise ValueError(f"block size must be >= 1, got {requested}")
    return max(d for d in range(1, min(K, requested) + 1) if K % d == 0)


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def refusal(exc: BaseException) -> str:
    """A table cell for an exception: 'refused: <first line of the message>' (no '|', at most 100 chars)."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0].replace("|", "/")
    text = text if len(text) <= 100 else text[:97] + "..."
    return f"refused: {text}"


def fmt_us(value) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def ratio_of(ours, ref) -> float | None:
    return ours / ref if isinstance(ours, float) and isinstance(ref, float) else None


def fmt_ratio(ratio: float | None, limit: float = RATIO_LIMIT) -> str:
    """'1.23x', with '!' past ``limit``; '-' when either time is missing (refused)."""
    if ratio is None:
        return "-"
    return f"{ratio:.2f}x" + ("!" if ratio > limit else "")


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------

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


def bench_graph_us(fn, calls: int = GRAPH_CALLS) -> float:
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


def layer_igemm_problem(layer: Layer, block_size: int) -> str | None:
    """Why igemm cannot run the layer in fp16 on an sm_80+ GPU (16-byte aligned operands), None if it can."""
    return igemm_problem(torch.float16, layer.Ci // layer.groups, layer.Co, layer.groups, block_size)


def auto_strategy(layer: Layer, block_size: int) -> str:
    """What strategy "auto" runs for this layer on an sm_80+ GPU (16-byte aligned operands)."""
    return conv_auto_strategy(layer_geometry(layer, block_size), torch.float16, layer_igemm_problem(layer, block_size))


def layer_geometry(layer: Layer, block_size: int) -> ConvGeometry:
    """The layer's conv geometry (padding k // 2, no dilation, no activation)."""
    pad = layer.k // 2
    Oh, Ow = conv2d_output_shape(layer.H, layer.H, layer.k, layer.k, (layer.stride,) * 2, (pad,) * 2, (1, 1))
    return ConvGeometry(layer.batch, layer.H, layer.H, layer.Ci, Oh, Ow, layer.Co, layer.k, layer.k, layer.stride,
                        layer.stride, pad, pad, 1, 1, block_size, 0, layer.groups)


PREFERABLE = (*STAGED, "igemm", "dequant_cudnn")  # what --prefer takes


def strategy_for(layer: Layer, block_size: int, prefer=()) -> str:
    """The first strategy of ``prefer`` that can run the layer (fp16), else "auto"."""
    for strategy in prefer:
        if strategy == "igemm":
            problem = layer_igemm_problem(layer, block_size)
        else:
            problem = strategy_problem(strategy, layer_geometry(layer, block_size), torch.float16)
        if problem is None:
            return strategy
    return "auto"


def bench_layer(layer: Layer, block_size: int, splits, prefer=()) -> dict:
    """Times (us, float) or refusals (str) of one layer: cudnn_<layout>, w<bits>_<layout>, their eager
    NHWC times, the split-K sweep; relative errors of ours against cuDNN on the dequantized weight."""
    batch, Ci, H, Co, k, stride, groups = layer
    pad = k // 2
    torch.manual_seed(0)
    w = torch.randn(Co, Ci // groups, k, k) * 0.05
    x = torch.randn(batch, Ci, H, H, device="cuda", dtype=torch.float16)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    w16 = w.half().cuda()
    w16_cl = w16.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(Co, device="cuda", dtype=torch.float16)
    strategy = strategy_for(layer, block_size, prefer)
    row: dict = {"block_size": block_size,
                 "strategy": auto_strategy(layer, block_size) if strategy == "auto" else strategy}
    fns = {"cudnn_nchw": lambda: F.conv2d(x, w16, bias, stride, pad, 1, groups),
           "cudnn_nhwc": lambda: F.conv2d(x_cl, w16_cl, bias, stride, pad, 1, groups)}
    qws = {}
    for bits in (4, 8):
        try:
            qws[bits] = quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False).to("cuda")
        except (ValueError, TypeError, RuntimeError) as exc:
            log.warning("layer %s w%d: quantize_conv_weight refused: %s", layer, bits, exc)
            row[f"w{bits}_nhwc"] = row[f"w{bits}_nchw"] = refusal(exc)
            continue
        qw = qws[bits]
        ref_w = qw.dequantize(torch.float32).cuda()
        for name, xin in (("nhwc", x_cl), ("nchw", x)):
            key = f"w{bits}_{name}"
            try:
                # the public API first (what a user calls, all its checks), then its kernel path with `out`
                out = cutlass_ops.conv2d(xin, qw, bias, stride, pad, groups=groups)
                conv2d_weight_only(xin, qw, bias, stride, pad, groups=groups, out=out, strategy=strategy)
            except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
                log.warning("layer %s %s refused: %s", layer, key, exc)
                row[key] = refusal(exc)
                continue
            # sanity: agree with cuDNN on the dequantized weight
            ref = F.conv2d(xin.float(), ref_w, bias.float(), stride, pad, 1, groups)
            err = row[key + "_relerr"] = ((out.float() - ref).norm() / ref.norm()).item()
            if err > 1e-2:
                log.warning("layer %s %s: relative error %.2e", layer, key, err)
            del ref
            # timed without `out`, as a model calls it (dequant_cudnn then returns cuDNN's output, no copy)
            fns[key] = (lambda xin=xin, qw=qw:
                        conv2d_weight_only(xin, qw, bias, stride, pad, groups=groups, strategy=strategy))
    for key, fn in fns.items():
        row[key] = bench_graph_us(fn)
        if key.endswith("_nhwc"):
            row[key + "_eager"] = bench_eager_us(fn)
    # split-K sweep (int4, NHWC, igemm), GPU time
    if splits and 4 in qws and row["strategy"] == "igemm" and isinstance(row.get("w4_nhwc"), float):
        out = torch.empty_like(F.conv2d(x_cl, w16_cl, bias, stride, pad, 1, groups))
        sweep = {}
        for s in splits:
            fn = (lambda s=s: conv2d_weight_only(x_cl, qws[4], bias, stride, pad, groups=groups, out=out,
                                                 strategy="igemm", split_k=s))
            try:
                sweep[s] = bench_graph_us(fn)
            except (ValueError, RuntimeError) as exc:
                log.warning("layer %s split_k=%d refused: %s", layer, s, exc)
        row["sweep"] = sweep
    return row


def host_overhead_us(layer: Layer, block_size: int, calls: int = 200) -> float:
    """Host time per call (asynchronous launches, timed with a host clock)."""
    import time

    batch, Ci, H, Co, k, stride, groups = layer
    qw = quantize_conv_weight(torch.randn(Co, Ci // groups, k, k), bits=4, block_size=block_size).to("cuda")
    x = torch.randn(batch, Ci, H, H, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    out = conv2d_weight_only(x, qw, None, stride, k // 2, groups=groups)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        conv2d_weight_only(x, qw, None, stride, k // 2, groups=groups, out=out)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

HEADER = ["layer", "batch, Ci, HxW, Co, k, stride, groups", "block", "auto", "cuDNN NCHW", "cuDNN NHWC",
          "w4 NHWC", "w4 / cuDNN", "w8 NHWC", "w8 / cuDNN", "w4 NCHW", "w8 NCHW",
          "eager: cuDNN / w4 / w8 NHWC"]


def table_row(layer: Layer, r: dict, with_sweep: bool) -> str:
    cells = [layer_kind(layer), layer_label(layer), str(r["block_size"]), r["strategy"],
             fmt_us(r["cudnn_nchw"]), fmt_us(r["cudnn_nhwc"]),
             fmt_us(r["w4_nhwc"]), fmt_ratio(ratio_of(r["w4_nhwc"], r["cudnn_nhwc"])),
             fmt_us(r["w8_nhwc"]), fmt_ratio(ratio_of(r["w8_nhwc"], r["cudnn_nhwc"])),
             fmt_us(r["w4_nchw"]), fmt_us(r["w8_nchw"]),
             " / ".join(fmt_us(r.get(f"{key}_eager", "-")) for key in ("cudnn_nhwc", "w4_nhwc", "w8_nhwc"))]
    if with_sweep:
        sweep = r.get("sweep")
        if sweep:
            best = min(sweep, key=sweep.get)
            cells.append(f"{sweep[best]:.1f} @ {best}")
        else:
            cells.append("n/a" if r["strategy"] != "igemm" else "-")
    return "| " + " | ".join(cells) + " |"


def batch_summary(batch: int, results: list[tuple[Layer, dict]]) -> list[str]:
    """Issue 18's targets for one batch, per weight type: geometric mean of ours / cuDNN NHWC (all
    layers timed, and the ResNet-50 layers alone) and how many layers are within RATIO_LIMIT."""
    lines = []
    for bits in (4, 8):
        key = f"w{bits}_nhwc"
        ratios = [(layer, ratio_of(r[key], r["cudnn_nhwc"])) for layer, r in results]
        timed = [(layer, x) for layer, x in ratios if x is not None]
        missed = [f"{layer_kind(layer)} {layer_label(layer)} ({x:.2f}x)" for layer, x in timed if x > RATIO_LIMIT]
        refused = [f"{layer_kind(layer)} {layer_label(layer)}" for layer, x in ratios if x is None]
        geo = geomean(x for _, x in timed)
        geo_resnet = geomean(x for layer, x in timed if layer_kind(layer) == "ResNet-50")
        mark = "!" if not geo <= GEOMEAN_LIMIT else ""
        line = (f"- batch {batch}, w{bits} NHWC / cuDNN NHWC: geometric mean {geo:.2f}x{mark} over {len(timed)} "
                f"layers (target <= {GEOMEAN_LIMIT:.1f}x; ResNet-50 layers alone {geo_resnet:.2f}x); "
                f"layers <= {RATIO_LIMIT}x: {len(timed) - len(missed)}/{len(ratios)}")
        if missed:
            line += f" (missed: {'; '.join(missed)})"
        if refused:
            line += f" (refused or failed, not in the mean: {'; '.join(refused)})"
        lines.append(line)
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="default: scripts/results/<gpu>/bench_conv.md")
    p.add_argument("--block-size", type=int, default=64,
                   help="quantization block along K (default 64; where it does not divide K, the largest divisor "
                        "of K below it)")
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                   help="batches to run the layer set at (default: 1 32)")
    p.add_argument("--splits", type=int, nargs="*", default=None,
                   help=f"also sweep split_k of the int4 NHWC igemm layers over these values ('--splits' alone: "
                        f"{' '.join(map(str, SPLITS))}; default: no sweep, it multiplies the run time)")
    p.add_argument("--prefer", nargs="+", default=[], choices=PREFERABLE,
                   help="strategies to time instead of auto on the layers they can run, first match wins")
    args = p.parse_args(argv)
    if args.block_size < 1:
        p.error(f"--block-size must be >= 1, got {args.block_size}")
    if any(b < 1 for b in args.batches):
        p.error(f"--batches must be >= 1, got {args.batches}")
    if args.splits is not None:
        if any(s < 1 for s in args.splits):
            p.error(f"--splits must be >= 1, got {args.splits}")
        args.splits = list(args.splits) or list(SPLITS)
    args.batches = list(dict.fromkeys(args.batches))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.backends.cudnn.benchmark = True
    torch.set_grad_enabled(False)

    dev = torch.cuda.get_device_name()
    with_sweep = bool(args.splits)
    header = HEADER + (["w4 best split (us @ s)"] if with_sweep else [])
    lines = [f"# conv2d_weight_only vs cuDNN fp16 ({dev}, block_size {args.block_size})", "",
             "GPU time per call in us (median, calls replayed from a CUDA graph). Ratios: ours / cuDNN NHWC",
             f"(issue 18: every layer <= {RATIO_LIMIT}x, '!' marks a miss; geometric mean per batch <= "
             f"{GEOMEAN_LIMIT:.1f}x).",
             "block: the quantization block along K = k*k*Ci/groups (block_size, or the largest divisor of K",
             "below it). auto: the strategy that ran (\"auto\" picks dequant_cudnn: the weight dequantized, then "
             f"cuDNN, for convs of >= {DEQUANT_CUDNN_MIN_MACS / 2 ** 20:.0f} Mi multiply-adds; else igemm: tensor "
             "cores; depthwise for groups = Ci; small_ci for a stem of <= 4 channels; else direct: one thread per output"
             + (f"; {', '.join(args.prefer)} where they apply (--prefer)" if args.prefer else "") + ").",
             "eager: median per eager call (do_bench; host launch cost included where it exceeds the kernel",
             "time). refused: the API raised; that layer is left out of the geometric mean."
             + (f" w4 best split: the split-K sweep over {args.splits} (int4 NHWC, igemm layers)." if with_sweep
                else ""), ""]
    summary = []
    first = None
    for batch in args.batches:
        results = []
        lines += [f"## batch {batch}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for shape in (*resnet_shapes(), STEM, *DEPTHWISE):
            layer = Layer(batch, *shape)
            block_size = block_size_for(layer.K, args.block_size)
            try:
                r = bench_layer(layer, block_size, args.splits, args.prefer)
            except Exception as exc:  # report the failure in the table, keep benchmarking the rest
                log.exception("layer %s failed", layer)
                reason = f"failed: {refusal(exc)[len('refused: '):]}"
                results.append((layer, {"cudnn_nhwc": reason, "w4_nhwc": reason, "w8_nhwc": reason}))
                lines.append(f"| {layer_kind(layer)} | {layer_label(layer)} | {block_size} | {reason} |")
                continue
            if first is None and r["strategy"] == "igemm":  # the host-time line's layer
                first = (layer, block_size)
            results.append((layer, r))
            lines.append(table_row(layer, r, with_sweep))
            log.info("%s", lines[-1])
            log.info("%s done: rel.err %s%s", layer,
                     {k[:-7]: f"{v:.1e}" for k, v in r.items() if k.endswith("_relerr")},
                     f", sweep {({s: round(t, 1) for s, t in r['sweep'].items()})}" if r.get("sweep") else "")
        lines.append("")
        summary += batch_summary(batch, results)
    lines += ["Targets (issue 18):", "", *summary, ""]
    if first is not None:
        layer, block_size = first
        lines.append(f"Host time per call ({layer_label(layer)}, int4 NHWC, async launches): "
                     f"{host_overhead_us(layer, block_size):.1f} us.")
    write_report(lines, args.out, "bench_conv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
