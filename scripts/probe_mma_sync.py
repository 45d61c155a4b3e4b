"""Throughput of mma.sync.m16n8k16 (fp16 x fp16 -> fp32) per SM: the ceiling of the weight-only tensor-core
kernels (gemv_mma, gemm_small_m, gemm_mma), against the dense fp16 peak that wgmma reaches.

Runs ``scripts/kernels/mma_sync_peak.cu`` (warps issuing only independent mmas from registers) with one
block per SM and 4 to 16 warps per block, CHAINS independent accumulators per warp, and reports multiply-adds
per SM clock (clock64 around the loop, slowest block) and the TFLOP/s the whole GPU would reach at the
measured clock. The dense fp16 peak of Hopper's wgmma is 2048 multiply-adds per clock and SM (989 TFLOP/s
on an H100 SXM at 1.83 GHz); Ampere's mma.sync peak is 1024 (A100).

A benchmark, not a test: the table goes to scripts/results/<gpu>/mma_sync_probe.md (or ``--out``).
``--compile-only`` builds every variant (sm_80 and sm_90a, no GPU needed) and exits.

    python scripts/probe_mma_sync.py [--iters 4096] [--out PATH]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "kernels" / "mma_sync_peak.cu"
CHAINS = (1, 2, 4, 8, 16)
WARPS = (4, 8, 16)  # one block per SM: 32 warps of CHAINS = 16 would not fit the register file
MMA_FMAS = 16 * 8 * 16  # multiply-adds of one m16n8k16


def build(chains: int, arch: str):
    from custom_kernels.nvrtc import compile_source

    return compile_source(SOURCE.read_text(), arch, name=f"mma_sync_peak_c{chains}.cu", defines={"CHAINS": chains})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4096, help="rounds of CHAINS mmas per warp (default 4096)")
    ap.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/mma_sync_probe.md")
    ap.add_argument("--compile-only", action="store_true", help="build every variant for sm_80 and sm_90a and exit")
    args = ap.parse_args()
    if args.compile_only:
        for arch in ("80", "90a"):
            for chains in CHAINS:
                print(f"sm_{arch} CHAINS={chains}: {len(build(chains, arch).data)} bytes")
        return 0

    import torch
    from _timing import write_report

    from custom_kernels.device import target_arch
    from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Module, Ptr

    class ProbeArgs(KernelArgs):  # mma_sync_peak(out, iters, clk)
        _fields_ = [("out", Ptr), ("iters", I32), ("clk", Ptr)]

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        print("needs an sm_80+ GPU (mma.sync m16n8k16)", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    out = torch.empty(sms * 32 * max(WARPS), device="cuda")
    clk = torch.zeros(sms, dtype=torch.int64, device="cuda")
    rows = []
    for chains in CHAINS:
        kernel = Module(build(chains, target_arch()).data, name=f"mma_sync_peak_c{chains}").kernel("mma_sync_peak")
        for warps in WARPS:
            run = Launch(kernel, LaunchConfig.of(sms, 32 * warps),
                         ProbeArgs(out=out.data_ptr(), iters=args.iters, clk=clk.data_ptr()), 0)
            run()
            torch.cuda.synchronize()
            best = None
            for _ in range(5):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                run()
                e1.record()
                torch.cuda.synchronize()
                us, clocks = e0.elapsed_time(e1) * 1e3, int(clk.max())
                if best is None or clocks < best[1]:
                    best = (us, clocks)
            us, clocks = best
            fmas = warps * chains * args.iters * MMA_FMAS
            per_clk = fmas / clocks
            ghz = clocks / us / 1e3
            tflops = 2 * per_clk * sms * ghz / 1e3
            rows.append((chains, warps, per_clk, ghz, tflops, clocks / (chains * args.iters) * 1.0))
            print(f"chains {chains:2d} warps {warps:2d}: {per_clk:7.1f} FMA/clk/SM  {ghz:.2f} GHz  "
                  f"{tflops:6.1f} TFLOP/s", flush=True)
    lines = [f"# mma.sync m16n8k16 throughput ({torch.cuda.get_device_name()}, {sms} SMs)", "",
             f"One block per SM, {args.iters} rounds of CHAINS independent fp16 mmas (fp32 accumulators) per warp, "
             "operands in registers; multiply-adds per SM clock (clock64 around the loop, slowest block; best of 5), "
             "the clock the run implies (clocks / elapsed), the GPU's TFLOP/s at it, and SM clocks per mma round of "
             "one warp. wgmma's dense fp16 peak on Hopper: 2048 multiply-adds per clock and SM.", "",
             "| chains per warp | warps per SM | FMA / clk / SM | GHz | TFLOP/s | clk per round and warp |",
             "|---|---|---|---|---|---|"]
    for chains, warps, per_clk, ghz, tflops, cpr in rows:
        lines.append(f"| {chains} | {warps} | {per_clk:.0f} | {ghz:.2f} | {tflops:.0f} | {cpr:.1f} |")
    write_report(lines, args.out, "mma_sync_probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
