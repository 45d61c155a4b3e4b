#!/usr/bin/env python3
"""Benchmark of the fused scheme-2 W8A8 kernel (cutlass_ops/w8a8/fused.py) vs torch._int_mm.

For each M (default 16, 256, 4096) with N = K = 8192 and block_size 128: the kernel time of every
tile variant (CUDA graph of repeated launches, median of triton.testing.do_bench), its TOPS
(2*M*N*K / t), the eager Python call (host overhead included), the full call with activation
quantization, and torch._int_mm on the same int8 operands (per-channel reference point: int32
out, no scaling; it needs M > 16, so M = 16 is timed at M = 32). Each variant's output is
checked against a float64 evaluation of the 4-term formula on a sample of rows.
With --block-scaled (sm_90a), also the block-scaled symmetric variants (cutlass_ops/w8a8/block_scaled.py,
tiles.BLOCK_SCALED_CONFIGS) on an int8 weight of the same shape, each at its default split-K count and at
the counts of --splits, with three more columns: fp16 cuBLAS (x @ W.T) on the same shape, the per-channel
W8A8 GEMM (cutlass_ops.int8_gemm(A_q, W_q, "dequant", scale_row, scale_col, out_dtype=float16) on the same
int8 operands) and the block-scaled kernel's time over it (issue 18's targets: <= 0.6x fp16 at M = 4096,
<= 1.15x the per-channel GEMM at every M). --block-scaled-only skips the offset-form variants, --bs-configs
limits the block-scaled ones; a short small-M run (about a minute with warm NVRTC / CUTLASS caches):

    bench_w8a8_fused.py --block-scaled-only --M 16 64 256 --bs-configs WSB WMB --splits 1 2 4 --out <file>

Markdown table to stdout and to scripts/results/<gpu>/bench_w8a8_fused.md (or --out).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from _timing import graph_of, write_report

from custom_kernels.device import capability as device_capability
from cutlass_ops.formats import QuantizedWeight
from cutlass_ops.w8a8.fused import linear_w8a8_fused, prepare_weight_w8a8
from cutlass_ops.w8a8.quant_a import quantize_activation_gpu
from cutlass_ops.w8a8.tiles import BLOCK_SCALED_CONFIGS, TILE_CONFIGS, WGMMA_CC, choose_config

log = logging.getLogger("bench_w8a8_fused")


def bench_ms(fn, reps_per_call: int = 1) -> float:
    """Median milliseconds of fn() / reps_per_call (triton's do_bench; CUDA events otherwise)."""
    try:
        from triton.testing import do_bench

        return do_bench(fn, warmup=50, rep=300, return_mode="median") / reps_per_call
    except ImportError:
        for _ in range(5):
            fn()
        times = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2] / reps_per_call


def sample_error(D: torch.Tensor, quantized_A, qw: QuantizedWeight, rows: torch.Tensor) -> float:
    """max |D - ref| / max |ref| over `rows`, ref = the 4-term formula in float64."""
    A_q, sA, oA, sumA = (t[rows].double() for t in quantized_A)
    bs, G = qw.block_size, qw.K // qw.block_size
    B_q = qw.qweight.double()
    sumB = qw.qweight.to(torch.int32).reshape(qw.N, G, bs).sum(-1).double()
    sB, oB = qw.scale.double(), qw.offset.double()
    ref = torch.zeros(len(rows), qw.N, dtype=torch.float64, device=D.device)
    for g in range(G):
        k = slice(g * bs, (g + 1) * bs)
        Cq = A_q[:, k] @ B_q[:, k].T
        ref += (sA[:, g, None] * sB[None, :, g] * Cq + (sA[:, g] * sumA[:, g])[:, None] * oB[None, :, g]
                + oA[:, g, None] * (sB[:, g] * sumB[:, g] + bs * oB[:, g])[None, :])
    return float((D[rows].double() - ref).abs().max() / ref.abs().max())


def per_channel_us(A_q: torch.Tensor, W_q: torch.Tensor, reps: int, gen) -> float:
    """CUDA-graph us of the per-channel W8A8 GEMM (CUTLASS, dequant epilogue, fp16 out) on these int8
    operands; NaN (logged) where it cannot run (a CUTLASS build problem must not stop the table)."""
    import cutlass_ops

    M, N = A_q.shape[0], W_q.shape[0]
    s_row = torch.rand(M, generator=gen, device="cuda") * 1e-2
    s_col = torch.rand(N, generator=gen, device="cuda") * 1e-2
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    call = lambda: cutlass_ops.int8_gemm(A_q, W_q, "dequant", scale_row=s_row, scale_col=s_col,  # noqa: E731
                                         out_dtype=torch.float16, out=out)
    try:
        return bench_ms(graph_of(call, reps).replay, reps) * 1e3
    except Exception:  # noqa: BLE001 - reported in the table as NaN, with the reason in the log
        log.exception("per-channel int8_gemm at M=%d failed", M)
        return float("nan")


def block_scaled_rows(M: int, N: int, K: int, x: torch.Tensor, int_mm: tuple, reps: int, gen,
                      configs=tuple(sorted(BLOCK_SCALED_CONFIGS)), splits=()) -> list[dict]:
    """Rows of the block-scaled ``configs`` at one M, each at its default split-K count and at each of
    ``splits`` that its K allows (same keys as run()'s, plus fp16_us, pc_us and pc_ratio)."""
    from cutlass_ops.w8a8.block_scaled import linear_block_scaled_reference, linear_w8a8_block_scaled, \
        quantize_weight_block_scaled
    from cutlass_ops.w8a8.block_scaled_plan import plan_for, quantize_activation_block_scaled_gpu
    from cutlass_ops.w8a8.tiles import choose_block_scaled_config, k_units

    w = torch.randn(N, K, generator=gen, device="cuda").half()
    weight = quantize_weight_block_scaled(w, 128)
    g16 = graph_of(lambda: x @ w.T, reps)
    t_fp16 = bench_ms(g16.replay, reps) * 1e3
    A_q, planes = quantize_activation_block_scaled_gpu(x, 128)
    t_pc = per_channel_us(A_q, weight.qweight, reps, gen)
    sample = torch.arange(0, M, max(1, M // 64), device="cuda")
    quantized = (A_q[sample], planes[:, sample].T.contiguous())
    ref = linear_block_scaled_reference(x[sample], weight, quantized_A=quantized)
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    t_mm, M_mm = int_mm
    default = choose_block_scaled_config(M, N)
    rows = []
    for name in configs:
        plan = plan_for(weight, name, torch.cuda.current_device())
        auto = plan.splits_for(M)
        for s in dict.fromkeys([auto, *(s for s in splits if s <= k_units(K, 128))]):
            kernel = lambda s=s: plan(A_q, planes, None, out, 0, s)  # noqa: E731
            t_kernel = bench_ms(graph_of(kernel, reps).replay, reps) * 1e3
            call = lambda s=s: linear_w8a8_block_scaled(x, weight, config=name, splits=s)  # noqa: E731
            t_full = bench_ms(call) * 1e3
            out.fill_(float("nan"))
            kernel()
            err = float((out[sample].double() - ref).abs().max() / ref.abs().max())
            label = f"{name}/s{s} (block-scaled)" + (" *" if name == default and s == auto else "")
            rows.append(dict(M=M, N=N, K=K, bs=128, config=label,
                             kernel_us=t_kernel, tops=2.0 * M * N * K / (t_kernel * 1e-6) / 1e12,
                             eager_us=float("nan"), full_us=t_full, int_mm_us=t_mm, int_mm_M=M_mm,
                             ratio=t_kernel / t_mm, err=err, fp16_us=t_fp16, pc_us=t_pc, pc_ratio=t_kernel / t_pc))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def run(Ms, N, K, block_size, configs, reps, block_scaled: bool = False,
        bs_configs=tuple(sorted(BLOCK_SCALED_CONFIGS)), bs_splits=()) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    cc = device_capability()
    configs = [c for c in configs if not TILE_CONFIGS[c].wgmma or cc == WGMMA_CC]  # wgmma: sm_90a only
    G = K // block_size
    qw = QuantizedWeight(torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8, device="cuda"),
                         torch.rand(N, G, generator=gen, device="cuda") * 0.02 + 1e-3,
                         torch.randn(N, G, generator=gen, device="cuda") * 0.05, 8, block_size, N, K, None, False)
    prep = prepare_weight_w8a8(qw)
    quantize = quantize_activation_gpu
    rows_out = []
    for M in Ms:
        x = torch.randn(M, K, generator=gen, device="cuda").half()
        quantized_A = quantize(x, block_size)
        out = torch.empty(M, N, dtype=torch.float16, device="cuda")
        flops = 2.0 * M * N * K
        # torch._int_mm: int8 [M, K] @ int8 [K, N] (B_q^T: a column-major view, no copy)
        M_mm = max(M, 32)
        A_mm = quantized_A[0] if M_mm == M else torch.randint(-128, 128, (M_mm, K), generator=gen,
                                                             dtype=torch.int8, device="cuda")
        B_t = prep["B_q"].t()
        try:
            torch._int_mm(A_mm, B_t)
        except RuntimeError:  # a torch build that wants a row-major mat2
            B_t = B_t.contiguous()
        g_mm = graph_of(lambda: torch._int_mm(A_mm, B_t), reps)
        t_mm = bench_ms(g_mm.replay, reps) * 1e3
        default = choose_config(M, N, cc)
        sample = torch.arange(0, M, max(1, M // 64), device="cuda")
        for name in configs:
            call = lambda: linear_w8a8_fused(x, qw, None, 0, quantized_A=quantized_A, out=out, config=name)  # noqa: E731
            g = graph_of(call, reps)
            t_kernel = bench_ms(g.replay, reps) * 1e3
            t_eager = bench_ms(call) * 1e3
            out.fill_(float("nan"))
            call()
            err = sample_error(out, quantized_A, qw, sample)
            t_full = bench_ms(lambda: linear_w8a8_fused(x, qw, None, 0, config=name)) * 1e3
            rows_out.append(dict(M=M, N=N, K=K, bs=block_size, config=name + (" *" if name == default else ""),
                                 kernel_us=t_kernel, tops=flops / (t_kernel * 1e-6) / 1e12, eager_us=t_eager,
                                 full_us=t_full, int_mm_us=t_mm, int_mm_M=M_mm, ratio=t_kernel / t_mm, err=err))
            print(rows_out[-1], file=sys.stderr, flush=True)
        if block_scaled and cc == WGMMA_CC:
            rows_out += block_scaled_rows(M, N, K, x, (t_mm, M_mm), reps, gen, bs_configs, bs_splits)
    return rows_out


def table(rows: list[dict], device_name: str) -> str:
    lines = [f"## Fused scheme-2 W8A8 (per K block) on {device_name}", "",
             "kernel = CUDA-graph median per launch; eager = one Python call with pre-quantized A (host "
             "overhead included); full = quantize x (fp16) + kernel; int_mm = torch._int_mm on the same int8 "
             "operands (int32 out, no scaling); ratio = kernel / int_mm (target <= 1.3); * = default variant.", "",
             "| M | N | K | block | variant | kernel us | TOPS | eager us | full us | int_mm us | ratio | max rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    extra = [("fp16_us", "fp16 us", ".1f"), ("pc_us", "int8 GEMM us", ".1f"), ("pc_ratio", "/ int8 GEMM", ".2f")]
    fp16 = any("fp16_us" in r for r in rows)  # --block-scaled: fp16 cuBLAS and the per-channel GEMM
    if fp16:
        lines[2] += (" fp16 us = cuBLAS x @ W.T; int8 GEMM us = the per-channel W8A8 GEMM (int8_gemm, dequant "
                     "epilogue, fp16 out) on the same int8 operands; / int8 GEMM = kernel / that (target <= "
                     "1.15). Block-scaled variants as name/s<split-K count>; their eager column is not measured.")
        lines[-2] += "".join(f" {title} |" for _, title, _ in extra)
        lines[-1] += "---|" * len(extra)
    for r in rows:
        mm = f"{r['int_mm_us']:.1f}" + ("" if r["int_mm_M"] == r["M"] else f" (M={r['int_mm_M']})")
        cells = "".join(f" {format(r[key], fmt)} |" if key in r else " |" for key, _, fmt in extra) if fp16 else ""
        lines.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['bs']} | {r['config']} | {r['kernel_us']:.1f} | "
                     f"{r['tops']:.0f} | {r['eager_us']:.1f} | {r['full_us']:.1f} | {mm} | {r['ratio']:.2f} | "
                     f"{r['err']:.1e} |" + cells)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="default: scripts/results/<gpu>/bench_w8a8_fused.md")
    p.add_argument("--M", type=int, nargs="+", default=[16, 256, 4096])
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--configs", nargs="+", default=sorted(TILE_CONFIGS), choices=sorted(TILE_CONFIGS))
    p.add_argument("--reps", type=int, default=10, help="launches per CUDA graph")
    p.add_argument("--block-scaled", action="store_true",
                   help="also the block-scaled symmetric variants (sm_90a), fp16 cuBLAS and the per-channel GEMM")
    p.add_argument("--block-scaled-only", action="store_true",
                   help="--block-scaled without the offset-form variants (--configs ignored)")
    p.add_argument("--bs-configs", nargs="+", default=sorted(BLOCK_SCALED_CONFIGS),
                   choices=sorted(BLOCK_SCALED_CONFIGS), help="block-scaled variants to time (default: all)")
    p.add_argument("--splits", type=int, nargs="*", default=[],
                   help="block-scaled: also time each variant at these split-K counts (besides its default)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        print("bench_w8a8_fused.py needs a CUDA GPU", file=sys.stderr)
        return 1
    if any(s < 1 for s in args.splits):
        p.error(f"--splits must be >= 1, got {args.splits}")
    configs = [] if args.block_scaled_only else args.configs
    rows = run(args.M, args.N, args.K, args.block_size, configs, args.reps, args.block_scaled or args.block_scaled_only,
               args.bs_configs, args.splits)
    write_report([table(rows, torch.cuda.get_device_name())], args.out, "bench_w8a8_fused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
