"""How much FP32 work per accumulator element runs beside Hopper's int8 tensor cores.

Runs ``scripts/kernels/wgmma_overlap.cu`` (the W8A8 WP kernel's skeleton: two consumer warpgroups of
64 x 192 int32 accumulators, m64n192k32 int8 wgmma, one CTA per SM) with the per-block promotion
reduced to chosen instruction mixes, and reports SM clocks per 128-wide K block. With both
warpgroups' wgmmas (8 x m64n192k32 per block) the tensor cores need 768 clocks per block at the
int8 peak (4096 multiply-adds per clock and SM), so ``tensor %`` = 768 / clocks per block.

A benchmark, not a test: the table goes to scripts/results/<gpu>/wgmma_overlap_probe.md (or ``--out``). ``--compile-only`` builds every
variant for sm_90a (no GPU needed) and exits.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "kernels" / "wgmma_overlap.cu"
SMEM_BYTES = 4 * (128 * 128 + 192 * 128 + 4096) + 1024 + 64
TENSOR_CLOCKS = 8 * 64 * 192 * 32 // 4096  # both warpgroups' block at the int8 peak: 768

# name: (defines, what runs per element and block)
VARIANTS: dict[str, tuple[dict[str, int], str]] = {
    "pp-fadd": ({"MODE": 0, "PROMO": 1}, "ping-pong, 1 FADD"),
    "pp-2fadd": ({"MODE": 0, "PROMO": 6}, "ping-pong, 2 FADD"),
    "pp-i2fp-fadd": ({"MODE": 0, "PROMO": 7}, "ping-pong, I2FP + FADD"),
    "pp-fmul-ffma": ({"MODE": 0, "PROMO": 2}, "ping-pong, FMUL + FFMA"),
    "pp-three": ({"MODE": 0, "PROMO": 3}, "ping-pong, I2FP + FMUL + FFMA (WP without offsets)"),
    "pp-five": ({"MODE": 0, "PROMO": 5}, "ping-pong, WP's five (I2FP, FMUL, 3 FFMA)"),
    "free-three": ({"MODE": 1, "PROMO": 3}, "free-running, I2FP + FMUL + FFMA"),
    "pp-three-smem": ({"MODE": 0, "PROMO": 3, "PARAMS": 1}, "ping-pong, three, scales from smem"),
    "pp-five-smem": ({"MODE": 0, "PROMO": 5, "PARAMS": 1}, "ping-pong, five, scales from smem"),
    "loads-fadd": ({"MODE": 0, "PROMO": 1, "LOADS": 1}, "+ bulk-copy producer, 1 FADD"),
    "loads-fmul-ffma-smem": ({"MODE": 0, "PROMO": 2, "PARAMS": 1, "LOADS": 1}, "+ producer, FMUL + FFMA, scales from smem"),
    "loads-three-smem": ({"MODE": 0, "PROMO": 3, "PARAMS": 1, "LOADS": 1}, "+ producer, three, scales from smem"),
    "loads-five-smem": ({"MODE": 0, "PROMO": 5, "PARAMS": 1, "LOADS": 1}, "+ producer, five (= WP's work)"),
    "split-wgmma": ({"MODE": 2, "PROMO": 0}, "split: wg0 wgmma only (sums chained), wg1 idle"),
    "split-ffma1": ({"MODE": 2, "PROMO": 1}, "split: wg0 wgmma, wg1 1 FFMA/elem"),
    "split-ffma2": ({"MODE": 2, "PROMO": 2}, "split: wg0 wgmma, wg1 2 FFMA/elem"),
    "split-ffma4": ({"MODE": 2, "PROMO": 4}, "split: wg0 wgmma, wg1 4 FFMA/elem"),
    "alone-ffma1": ({"MODE": 3, "PROMO": 1}, "alone: wg1 1 FFMA/elem, no wgmma"),
    "alone-ffma2": ({"MODE": 3, "PROMO": 2}, "alone: wg1 2 FFMA/elem, no wgmma"),
    "alone-ffma4": ({"MODE": 3, "PROMO": 4}, "alone: wg1 4 FFMA/elem, no wgmma"),
}


def build(name: str):
    from custom_kernels.nvrtc import compile_source

    return compile_source(SOURCE.read_text(), "90a", name=f"wgmma_overlap_{name}.cu", defines=VARIANTS[name][0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--blocks", type=int, default=1024, help="K blocks per CTA (default 1024)")
    ap.add_argument("--wrap-mb", type=int, default=8, help="bytes the producer streams from (8: L2-resident)")
    ap.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/wgmma_overlap_probe.md")
    ap.add_argument("--compile-only", action="store_true", help="build every variant for sm_90a and exit")
    args = ap.parse_args()
    if args.compile_only:
        for name in args.variants:
            print(f"{name}: {len(build(name).data)} bytes")
        return 0

    import torch
    from _timing import write_report

    from custom_kernels.launch import I32, I64, KernelArgs, Launch, LaunchConfig, Module, Ptr

    class ProbeArgs(KernelArgs):  # wgmma_overlap(src, wrap, scale, out, clk, G)
        _fields_ = [("src", Ptr), ("wrap", I64), ("scale", Ptr), ("out", Ptr), ("clk", Ptr), ("G", I32)]

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs a compute capability 9.0 GPU (wgmma)", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    G = args.blocks
    wrap = args.wrap_mb << 20
    src = torch.randint(0, 256, (wrap,), dtype=torch.uint8, device=dev)
    scale = torch.rand(256, device=dev) + 0.5
    out = torch.empty(sms * 256, device=dev)
    clk = torch.zeros(sms * 3, dtype=torch.int64, device=dev)
    rows = []
    for name in args.variants:
        defines, what = VARIANTS[name]
        kernel = Module(build(name).data, name=name).kernel("wgmma_overlap")
        kernel.set_max_dynamic_smem(SMEM_BYTES)
        run = Launch(kernel, LaunchConfig.of(sms, 384, SMEM_BYTES),
                     ProbeArgs(src=src.data_ptr(), wrap=wrap, scale=scale.data_ptr(), out=out.data_ptr(),
                               clk=clk.data_ptr(), G=G), dev.index or 0)

        run()
        torch.cuda.synchronize()
        best = None
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            run()
            e1.record()
            torch.cuda.synchronize()
            us = e0.elapsed_time(e1) * 1e3
            per_wg = clk.view(sms, 3)[:, :2].max(dim=0).values.double() / G  # clocks per block, slowest CTA
            if best is None or us < best[0]:
                best = (us, per_wg.tolist())
        us, (wg0, wg1) = best
        mode = defines["MODE"]
        cpb = wg1 if mode == 3 else (wg0 if mode == 2 else max(wg0, wg1))
        tensor = (TENSOR_CLOCKS / 2 if mode == 2 else TENSOR_CLOCKS) / cpb * 100 if mode != 3 else float("nan")
        rows.append((name, what, us, wg0, wg1, tensor))
        print(f"{name:18s} {us:8.1f} us  wg0 {wg0:7.1f}  wg1 {wg1:7.1f} clk/block  tensor {tensor:5.1f}%", flush=True)

    lines = [f"# wgmma overlap probe ({torch.cuda.get_device_name()}, {sms} SMs, {G} K blocks per CTA, "
             f"producer source {args.wrap_mb} MB)", "",
             "SM clocks per 128-wide K block (slowest CTA) of each warpgroup; tensor % = the int8 peak's "
             f"{TENSOR_CLOCKS} clocks per block (split: warpgroup 0's {TENSOR_CLOCKS // 2}) / clocks per block.",
             "", "| variant | per element and block | us | wg0 clk/block | wg1 clk/block | tensor % |",
             "|---|---|---|---|---|---|"]
    for name, what, us, wg0, wg1, tensor in rows:
        t = "" if tensor != tensor else f"{tensor:.1f}"
        lines.append(f"| {name} | {what} | {us:.1f} | {wg0:.1f} | {wg1:.1f} | {t} |")
    write_report(lines, args.out, "wgmma_overlap_probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
