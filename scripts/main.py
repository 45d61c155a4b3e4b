#!/usr/bin/env python3
"""The main job.

With a GPU: run the GPU suite and the benchmarks (scripts/gpu_suite.py) and write the results.
Without one: emit and compile every kernel (NVRTC sources for sm_75/80/90, the configured
CUTLASS GEMMs for each arch) into the cache, then run the float64 CPU references of every
operation, and print one table: each check, its figure, its floor and PASS / FAIL. Exits 1 if
any check fails.

The SQNR floors follow from the number formats (see ``symmetric_floor_db``): a quantizer with step
``s`` adds rounding noise of power s^2 / 12, so each bit of the format is worth 6.02 dB; a block's
step is set by its largest value, so the floor assumes a block whose largest value is CREST times
its RMS. The data are Gaussian, for which the figures sit a few dB above their floors.
"""
from __future__ import annotations

import argparse
import logging
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

log = logging.getLogger("main")

# Largest |value| / RMS of one quantization block of Gaussian data, as a bound: a block of 32 has a
# mean crest of ~2.1, a whole row of K = 512 ~3.2, and P(|z| > 4) = 6e-5 per value.
CREST = 4.0


def symmetric_floor_db(bits: int) -> float:
    """SQNR floor of symmetric b-bit quantization (scale = absmax / qmax, qmax = 2^(b-1) - 1):
    step = CREST * rms / qmax, noise = step^2 / 12 -> 10 log10(12 qmax^2 / CREST^2).
    int8 (qmax 127): 40.8 dB; int4 (qmax 7): 15.7 dB, 25.2 dB lower."""
    qmax = 2 ** (bits - 1) - 1
    return 10 * math.log10(12 * qmax**2 / CREST**2)


def asymmetric_floor_db(bits: int) -> float:
    """SQNR floor of asymmetric b-bit quantization (scale = (max - min) / (2^b - 1)): the range is at
    most 2 * CREST * rms -> 10 log10(12 (2^b - 1)^2 / (2 CREST)^2). int8: 40.9 dB."""
    return 10 * math.log10(12 * (2**bits - 1) ** 2 / (2 * CREST) ** 2)


def combined_db(*floors: float) -> float:
    """SQNR of independent noise sources added together (their noise powers add)."""
    return -10 * math.log10(sum(10 ** (-f / 10) for f in floors))


@dataclass
class Check:
    name: str
    figure: str
    floor: str
    passed: bool


def sqnr_check(name: str, db: float, floor_db: float) -> Check:
    return Check(name, f"{db:.1f} dB", f">= {floor_db:.1f} dB", db >= floor_db)


def compile_nvrtc(archs: list[str]) -> Check:
    """Every NVRTC kernel source, for every arch."""
    from tqdm import tqdm

    from custom_kernels import nvrtc

    jobs = [(name, arch) for name in nvrtc.kernel_sources() for arch in archs]
    failed, t0 = [], time.perf_counter()
    for name, arch in tqdm(jobs, desc="NVRTC kernels", unit="cubin", disable=not sys.stderr.isatty()):
        try:
            nvrtc.compile_file(name, arch)
        except Exception as exc:  # count it, report it, compile the rest
            log.error("NVRTC: %s for sm_%s failed: %s", name, arch, exc)
            failed.append(f"{name}/sm_{arch}")
    sources = len({name for name, _ in jobs})
    return Check(f"NVRTC: {sources} kernel sources x sm_{'/'.join(archs)} compile",
                 f"{len(jobs) - len(failed)}/{len(jobs)} cubins ({time.perf_counter() - t0:.0f} s)",
                 f"{len(jobs)}/{len(jobs)}", not failed)


def compile_cutlass(archs: list[str], jobs: int, everything: bool, verbose: bool) -> Check:
    """The configured CUTLASS GEMMs, emitted and compiled by scripts/build_kernels.py."""
    cmd = [sys.executable, str(ROOT / "scripts" / "build_kernels.py"), "--arch", *archs, "-j", str(jobs)]
    what = "every configured GEMM"
    if not everything:  # one kernel per generation and target: the plain int32 GEMM, small-M tile
        cmd += ["--epilogue", "none", "--bucket", "small"]
        what = "int32 GEMM, small-M tile, per kernel generation"
    if torch.version.cuda is None:
        # The C++ launch path is a torch extension compiled against torch's CUDA headers: a CPU build
        # of torch cannot build it (the GPU machine does, on its first call or through build_kernels.py).
        cmd.append("--no-host-ext")
    if verbose:
        cmd.append("-v")
    log.info("running %s", " ".join(cmd))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if verbose or proc.returncode:
        sys.stderr.write(proc.stdout)
    counts = next((line for line in proc.stdout.splitlines() if "cache hits" in line), "")
    figure = f"exit {proc.returncode}" + (f": {counts}" if counts else "") + f" ({time.perf_counter() - t0:.0f} s)"
    return Check(f"CUTLASS: {what}, sm_{'/'.join(archs)}", figure, "exit 0, none failed", proc.returncode == 0)


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (ref - approx).double().pow(2).sum()
    return float(10 * torch.log10(ref.double().pow(2).sum() / noise.clamp_min(1e-300)))


def run_references() -> list[Check]:
    """Every operation's float64 reference on small shapes, against the unquantized float64 result.

    Output SQNR >= weight SQNR here: the rounding errors of the K products are independent (their
    powers add like the signal's), and the bias adds signal but no noise, so each output check uses
    the floor of its weight format."""
    import cutlass_ops as ops
    from cutlass_ops import formats, reference

    g = torch.Generator().manual_seed(0)
    checks = []
    M, N, K = 17, 257, 512
    x = torch.randn(M, K, generator=g, dtype=torch.float64)
    w = torch.randn(N, K, generator=g, dtype=torch.float64) / K**0.5
    bias = torch.randn(N, generator=g, dtype=torch.float64)
    exact = x @ w.T + bias
    for bits in (8, 4):
        for block in (32, 128, None):
            qw = ops.quantize_weight(w.float(), bits=bits, block_size=block)
            out = reference.linear_reference(x, qw, bias)
            checks.append(sqnr_check(f"linear W{bits}A16, block {block or 'per channel'}", sqnr_db(exact, out),
                                     symmetric_floor_db(bits)))
    qw8 = ops.quantize_weight(w.float(), bits=8, block_size=128, symmetric=False)
    out = reference.w8a8_kblock_reference(x.float(), qw8, 128, bias, None)  # QuantA takes fp16/bf16/fp32
    # Scheme 2 quantizes both operands, asymmetric int8 per K block of 128: two independent noises.
    checks.append(sqnr_check("linear_w8a8 (scheme 2, block 128, asymmetric)", sqnr_db(exact, out),
                             combined_db(asymmetric_floor_db(8), asymmetric_floor_db(8))))

    xc = torch.randn(2, 64, 14, 14, generator=g, dtype=torch.float64)
    wc = torch.randn(96, 64, 3, 3, generator=g, dtype=torch.float64) / 24
    bc = torch.randn(96, generator=g, dtype=torch.float64)
    exact_c = torch.nn.functional.conv2d(xc, wc, bc, stride=2, padding=1, dilation=1)
    for bits in (8, 4):
        qc = ops.quantize_conv_weight(wc.float(), bits=bits, block_size=32)
        out = reference.conv2d_reference(xc, qc, bc, stride=2, padding=1, dilation=1)
        checks.append(sqnr_check(f"conv2d 3x3 s2 W{bits}, block 32", sqnr_db(exact_c, out), symmetric_floor_db(bits)))

    # Requantizing int8 GEMM: int8 input/weights, int8 output through M and FusedBias.
    A_q = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
    W_q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    S_I, Z_I, S_O, Z_O = 0.02, 3, 0.5, -2
    S_W = torch.rand(N, generator=g, dtype=torch.float64) * 1e-3 + 1e-4
    B_fp = torch.randn(N, generator=g, dtype=torch.float64)
    M_scale, fused = formats.requant_params(S_I, Z_I, S_W, W_q, B_fp, S_O, Z_O)
    o_q = reference.requant_gemm_reference(A_q, W_q, M_scale, fused)
    o_fp = ((S_I * (A_q.double() - Z_I)) @ (S_W[:, None] * W_q.double()).T + B_fp) / S_O + Z_O
    ref = o_fp.clamp(-128, 127)
    # An int8 output rounded to nearest is within half a unit of the clamped float result: noise
    # power <= 0.5^2 per element, whatever the data.
    floor = 10 * math.log10(ref.pow(2).mean().item() / 0.25)
    checks.append(sqnr_check("int8_gemm_requant vs float (int8 output)", sqnr_db(ref, o_q.double()), floor))
    return checks


def print_table(checks: list[Check]) -> None:
    rows = [("check", "figure", "floor", "verdict")] + [(c.name, c.figure, c.floor, "PASS" if c.passed else "FAIL")
                                                       for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    line = lambda r: "| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(rows[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows[1:]:
        print(line(r))
    failed = sum(not c.passed for c in checks)
    print(f"\n{len(checks) - failed} passed, {failed} failed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", nargs="+", default=["75", "80", "90"], help="target archs to build for (no GPU)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="CUTLASS kernels built at once (2 nvcc each)")
    p.add_argument("--all-cutlass", action="store_true", help="build every configured CUTLASS kernel, "
                   "not only one GEMM per epilogue and arch")
    p.add_argument("--cpu", action="store_true", help="take the CPU path even where a GPU exists")
    p.add_argument("-v", "--verbose", action="store_true", help="INFO logs (compile times, cache hits)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")

    if torch.cuda.is_available() and not args.cpu:
        return subprocess.call([sys.executable, str(ROOT / "scripts" / "gpu_suite.py")])

    print("No GPU: compiling every kernel, then running the float64 references.", flush=True)
    checks = [compile_nvrtc(args.arch)]
    checks.append(compile_cutlass(args.arch, args.jobs, args.all_cutlass, args.verbose))
    checks += run_references()
    print()
    print_table(checks)
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
