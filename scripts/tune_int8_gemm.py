#!/usr/bin/env python3
"""Tile tuner for the CUTLASS int8 GEMMs: time candidate tile / stage / cluster configurations
on the GPU for each kernel generation and M bucket, and store the winners for this GPU as
``cutlass_ops/tuning/<gpu name>.json`` (read by ``cutlass_ops.gemm`` before default.json).

    python3 scripts/tune_int8_gemm.py --build-only --target 90   # no GPU: compile the candidates
    python3 scripts/tune_int8_gemm.py                             # on the GPU: time them, write JSON

Candidates are timed with the ``dequant`` epilogue (f16 out, the common case) on the shapes of
each bucket (``small``: M = 16 and 64; ``large``: M = 1024 and 4096; N = K = 8192); the winner is
the configuration with the smallest summed device time, among the candidates whose int8-output
(requant) variant also builds. A kernel missing from the cache is built first (tens of seconds each).
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cutlass_ops.gemm import TUNING_DIR, _gpu_file_name, alignment_D, target_arch_for  # noqa: E402
from cutlass_ops.gemm_build import GemmKernelSpec, build, lookup  # noqa: E402

COOP, PING, TMA = "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong", "TmaWarpSpecialized"
CANDIDATES = {
    "90": {
        "large": [
            {"threadblock_shape": [128, 256, 128], "cluster_shape": [1, 2, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [256, 128, 128], "cluster_shape": [2, 1, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [128, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
        ],
        "small": [
            {"threadblock_shape": [64, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [64, 64, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [64, 128, 256], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
        ],
    },
    "80": {
        "large": [
            {"threadblock_shape": [256, 128, 128], "stages": 3},
            {"threadblock_shape": [128, 256, 128], "stages": 3},
            {"threadblock_shape": [128, 128, 128], "stages": 4},
        ],
        "small": [
            {"threadblock_shape": [64, 128, 64], "stages": 6},
            # not in the generator's Sm80 tile list: warp_count given explicitly
            {"threadblock_shape": [64, 64, 128], "stages": 4, "warp_count": [2, 2, 1]},
            {"threadblock_shape": [32, 128, 128], "stages": 4, "warp_count": [1, 4, 1]},
        ],
    },
}
SHAPES = {"small": [16, 64], "large": [1024, 4096]}
N = K = 8192


def spec_for(kernel_cc: str, tile: dict, target: str, epilogue: str = "dequant", element_D: str = "f16") -> GemmKernelSpec:
    return GemmKernelSpec(
        kernel_cc=int(kernel_cc), target_arch=target_arch_for(int(kernel_cc), int(target.rstrip("a"))),
        epilogue=epilogue, element_D=element_D, threadblock_shape=tuple(tile["threadblock_shape"]),
        stages=tile.get("stages"), cluster_shape=tuple(tile.get("cluster_shape", (1, 1, 1))),
        warp_count=tuple(tile["warp_count"]) if tile.get("warp_count") else None,
        kernel_schedule=tile.get("kernel_schedule"), epilogue_schedule=tile.get("epilogue_schedule"),
        alignment_D=alignment_D(int(kernel_cc), element_D))


def int8_out_spec(kernel_cc: str, tile: dict, target: str) -> GemmKernelSpec:
    """The candidate with the int8-output requant epilogue: a winner must build for it too (a tile
    can compile for f16 output and not for int8's 16-element stores)."""
    return spec_for(kernel_cc, tile, target, "requant", "s8")


def _build(spec_dict: dict) -> str:
    try:
        return "cached" if build(GemmKernelSpec.from_dict(spec_dict))[1] else "built "
    except Exception as exc:  # a candidate that does not build is reported and later skipped
        return f"FAILED ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"


def time_candidate(spec: GemmKernelSpec, bucket: str) -> float:
    import torch

    from cutlass_ops.gemm import Int8Gemm
    from _timing import kernel_us

    plan = Int8Gemm(spec)
    total = 0.0
    for M in SHAPES[bucket]:
        A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
        B = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
        s_row, s_col = torch.rand(M, device="cuda"), torch.rand(N, device="cuda")
        out = torch.empty(M, N, dtype=torch.float16, device="cuda")
        total += kernel_us(lambda: plan(A, B, out=out, scale_row=s_row, scale_col=s_col))
    return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-only", action="store_true", help="compile the candidates (no GPU needed)")
    p.add_argument("--target", default=None, help="target compute capability for --build-only (e.g. 90)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="candidates built at once (--build-only)")
    p.add_argument("--archs", nargs="+", default=list(CANDIDATES), help="kernel generations to tune")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: tuning/<gpu name>.json)")
    args = p.parse_args()
    if args.build_only:
        target = args.target or "90"
        specs = [make(cc, tile, target) for cc in args.archs for tiles in CANDIDATES[cc].values()
                 for tile in tiles for make in (spec_for, int8_out_spec)]
        # one process per build: the CUTLASS interface keeps process-wide state while emitting
        with ProcessPoolExecutor(max(1, args.jobs)) as pool:
            for spec, status in zip(specs, pool.map(_build, [s.to_dict() for s in specs])):
                print(f"{status} {spec.name}", flush=True)
        return 0

    import torch

    major, minor = torch.cuda.get_device_capability()
    target = f"{major}{minor}"
    result: dict[str, dict] = {}
    lines = [f"GPU: {torch.cuda.get_device_name()}; dequant f16, N = K = {N}; summed device us over M in each bucket", "",
             "| gen | bucket | tile | us |", "|---|---|---|---|"]
    for cc in args.archs:
        if (cc == "90" and target != "90") or int(cc) > int(target):
            continue
        for bucket, tiles in CANDIDATES[cc].items():
            timed = []
            for tile in tiles:
                spec = spec_for(cc, tile, target)
                if lookup(int8_out_spec(cc, tile, target)) is None:
                    lines.append(f"| {cc} | {bucket} | {spec.name} | skipped: no int8-output build (--build-only) |")
                    continue
                try:
                    us = time_candidate(spec, bucket)
                except Exception as exc:  # a candidate that cannot run this shape is skipped, and said
                    lines.append(f"| {cc} | {bucket} | {spec.name} | failed: {type(exc).__name__} |")
                    continue
                timed.append((us, tile))
                lines.append(f"| {cc} | {bucket} | {spec.name} | {us:.1f} |")
            if timed:
                result.setdefault(cc, {})[bucket] = min(timed, key=lambda t: t[0])[1]
    out = args.out or TUNING_DIR / _gpu_file_name(torch.cuda.get_device_name())
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines += ["", f"winners written to {out}", "```", json.dumps(result, indent=2), "```"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
