#!/usr/bin/env python3
"""The main job.

With a GPU: run the GPU suite and the benchmarks (scripts/gpu_suite.py) and write the results.
Without one: emit and compile every kernel (NVRTC sources for sm_75/80/90, the configured
CUTLASS GEMMs for each arch) into the cache, then run the float64 CPU references of every
operation and report how far the quantized computations sit from the unquantized ones.
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

log = logging.getLogger("main")


def compile_nvrtc(archs: list[str]) -> list[tuple[str, str, float, int]]:
    from tqdm import tqdm

    from custom_kernels import nvrtc

    rows = []
    jobs = [(name, arch) for name in nvrtc.kernel_sources() for arch in archs]
    for name, arch in tqdm(jobs, desc="NVRTC kernels", unit="cubin"):
        t0 = time.perf_counter()
        cubin = nvrtc.compile_file(name, arch)
        rows.append((name, arch, time.perf_counter() - t0, len(cubin.data)))
    return rows


def compile_cutlass(archs: list[str], jobs: int, everything: bool) -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "build_kernels.py"), "--arch", *archs, "-j", str(jobs)]
    if not everything:  # one kernel per generation and target: the plain int32 GEMM, small-M tile
        cmd += ["--epilogue", "none", "--bucket", "small"]
    log.info("running %s", " ".join(cmd))
    subprocess.run(cmd, check=True)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (ref - approx).double().pow(2).sum()
    return float(10 * torch.log10(ref.double().pow(2).sum() / noise.clamp_min(1e-300)))


def run_references() -> list[tuple[str, float]]:
    """Every operation's float64 reference on small shapes; SQNR vs the unquantized float64 result."""
    import cutlass_ops as ops
    from cutlass_ops import formats, reference

    g = torch.Generator().manual_seed(0)
    rows = []
    M, N, K = 17, 257, 512
    x = torch.randn(M, K, generator=g, dtype=torch.float64)
    w = torch.randn(N, K, generator=g, dtype=torch.float64) / K**0.5
    bias = torch.randn(N, generator=g, dtype=torch.float64)
    exact = x @ w.T + bias
    for bits in (8, 4):
        for block in (32, 128, None):
            qw = ops.quantize_weight(w.float(), bits=bits, block_size=block)
            out = reference.linear_reference(x, qw, bias)
            rows.append((f"linear W{bits}A16 block={block or 'channel'}", sqnr_db(exact, out)))
    qw8 = ops.quantize_weight(w.float(), bits=8, block_size=128, symmetric=False)
    out = reference.w8a8_kblock_reference(x.float(), qw8, 128, bias, None)  # QuantA takes fp16/bf16/fp32
    rows.append(("linear_w8a8 (scheme 2, block 128, asymmetric)", sqnr_db(exact, out)))

    xc = torch.randn(2, 64, 14, 14, generator=g, dtype=torch.float64)
    wc = torch.randn(96, 64, 3, 3, generator=g, dtype=torch.float64) / 24
    bc = torch.randn(96, generator=g, dtype=torch.float64)
    exact_c = torch.nn.functional.conv2d(xc, wc, bc, stride=2, padding=1, dilation=1)
    for bits in (8, 4):
        qc = ops.quantize_conv_weight(wc.float(), bits=bits, block_size=32)
        out = reference.conv2d_reference(xc, qc, bc, stride=2, padding=1, dilation=1)
        rows.append((f"conv2d 3x3 s2 W{bits} block 32", sqnr_db(exact_c, out)))

    # Requantizing int8 GEMM: int8 input/weights, int8 output through M and FusedBias.
    A_q = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
    W_q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    S_I, Z_I, S_O, Z_O = 0.02, 3, 0.5, -2
    S_W = torch.rand(N, generator=g, dtype=torch.float64) * 1e-3 + 1e-4
    B_fp = torch.randn(N, generator=g, dtype=torch.float64)
    M_scale, fused = formats.requant_params(S_I, Z_I, S_W, W_q, B_fp, S_O, Z_O)
    o_q = reference.requant_gemm_reference(A_q, W_q, M_scale, fused)
    o_fp = ((S_I * (A_q.double() - Z_I)) @ (S_W[:, None] * W_q.double()).T + B_fp) / S_O + Z_O
    rows.append(("int8_gemm_requant vs float (int8 output)", sqnr_db(o_fp.clamp(-128, 127), o_q.double())))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", nargs="+", default=["75", "80", "90"], help="target archs to build for (no GPU)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="CUTLASS kernels built at once (2 nvcc each)")
    p.add_argument("--all-cutlass", action="store_true", help="build every configured CUTLASS kernel, "
                   "not only one GEMM per epilogue and arch")
    p.add_argument("--cpu", action="store_true", help="take the CPU path even where a GPU exists")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if torch.cuda.is_available() and not args.cpu:
        return subprocess.call([sys.executable, str(ROOT / "scripts" / "gpu_suite.py")])

    print("No GPU: emitting and compiling kernels, then running the float64 references.")
    rows = compile_nvrtc(args.arch)
    print(f"\nNVRTC: {len(rows)} cubins ({len({r[0] for r in rows})} sources x {len(args.arch)} archs), "
          f"{sum(r[2] for r in rows):.1f} s")
    compile_cutlass(args.arch, args.jobs, args.all_cutlass)
    print("\n| reference | SQNR vs unquantized (dB) |\n|---|---|")
    for name, db in run_references():
        print(f"| {name} | {db:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
