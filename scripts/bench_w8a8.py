#!/usr/bin/env python3
"""Benchmark (not a test): scheme 2 (W8A8 per K block, block 128) - the documents' literal path,
the orchestrator, the fused kernel - against a per-channel W8A8 int8 GEMM with fused dequant
(CUTLASS ``dequant`` epilogue on pre-quantized operands) as the reference point, N = K = 8192.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from _timing import call_us, host_us, kernel_us, table, write_report

import cutlass_ops as ops
from cutlass_ops.w8a8 import PATHS
from cutlass_ops.w8a8.fused import linear_w8a8_fused
from cutlass_ops.w8a8.quant_a import quantize_activation_gpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_w8a8.md")
    p.add_argument("--sizes", nargs="+", type=int, default=[16, 256, 4096])
    args = p.parse_args()
    N = K = 8192
    bs = 128
    qw = ops.quantize_weight(torch.randn(N, K) * 0.02, bits=8, block_size=bs, symmetric=False).to("cuda")
    B_pc = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
    s_col = torch.rand(N, device="cuda") * 1e-2
    rows = []
    for M in args.sizes:
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        A_pc = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
        s_row = torch.rand(M, device="cuda") * 1e-2
        ref_fn = lambda: ops.int8_gemm(A_pc, B_pc, "dequant", scale_row=s_row, scale_col=s_col,  # noqa: E731
                                       out_dtype=torch.float16)
        t_ref = call_us(ref_fn)
        rows.append([M, "per-channel W8A8 int8_gemm + fused dequant (reference point)", t_ref, 1.0])
        quantized = quantize_activation_gpu(x, bs)
        kernel_only = lambda: linear_w8a8_fused(None, qw, None, 0, quantized_A=quantized,  # noqa: E731
                                                out_dtype=torch.float16)
        quant_only = lambda: quantize_activation_gpu(x, bs)  # noqa: E731
        rows.append([M, "QuantA alone (device us / host us)", kernel_us(quant_only), host_us(quant_only)])
        rows.append([M, "fused kernel alone (device us / host us)", kernel_us(kernel_only), host_us(kernel_only)])
        cases = [("fused kernel (A pre-quantized)", kernel_only)]
        cases += [(f"linear_w8a8 path={p}", (lambda p=p: ops.linear_w8a8(x, qw, path=p)))
                  for p in PATHS]
        for name, fn in cases:
            try:
                t = call_us(fn, iters=10 if "literal" in name and M >= 4096 else 30)
                rows.append([M, name, t, t / t_ref])
            except Exception as exc:  # keep the table going; the failure is reported in it
                rows.append([M, name, f"failed: {type(exc).__name__}: {exc}"[:120], ""])
    text = (f"GPU: {torch.cuda.get_device_name()}; N = K = {N}, block {bs}, fp16 activations; "
            f"times are wall us per call (host included)\n\n"
            + table(["M", "path", "us", "x per-channel"], rows))
    write_report([text], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
