#!/usr/bin/env python3
"""Tile tuner for the CUTLASS int8 GEMMs: time candidate tile / stage / cluster configurations
on the GPU for each kernel generation and M bucket, and store the winners for this GPU as
``cutlass_ops/tuning/<gpu name>.json`` (read by ``cutlass_ops.cutlass.tuning`` before default.json).

    python3 scripts/tune_int8_gemm.py --build-only --target 90   # no GPU: compile the candidates
    python3 scripts/tune_int8_gemm.py                             # on the GPU: time them, write JSON
                                                                  # (+ scripts/results/<gpu>/tune_int8_gemm.md)
    python3 scripts/tune_int8_gemm.py --buckets medium            # only these buckets' entries

Candidates are timed with the ``dequant`` epilogue (f16 out, the common case) on the shapes of
each bucket (``small``: M = 16 and 64; ``medium``: M = 128 and 256; ``large``: M = 1024 and 4096;
N = K = 8192). A bucket's tile is the candidate with the smallest summed device time among those
whose int8-output (requant) variant also builds. A faster candidate that builds for float output
(f16 and f32) but not for int8 output becomes the bucket's ``float_out`` tile (used for f16 / bf16 /
f32 D) instead of being dropped. A kernel missing from the cache is built first (tens of seconds
each, about ten for an int8-output build that fails): ``--build-only`` ahead of time saves GPU time.
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cutlass_ops.cutlass.build import build, lookup
from cutlass_ops.cutlass.spec import GemmKernelSpec
from cutlass_ops.cutlass.tuning import BUCKETS, TUNING_DIR, alignment_D, gpu_file_name, target_arch_for

COOP, PING, TMA = "TmaWarpSpecializedCooperative", "TmaWarpSpecializedPingpong", "TmaWarpSpecialized"
CANDIDATES = {
    "90": {
        "large": [
            {"threadblock_shape": [128, 256, 128], "cluster_shape": [1, 2, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [256, 128, 128], "cluster_shape": [2, 1, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [128, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
        ],
        "medium": [
            {"threadblock_shape": [128, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [64, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [128, 256, 128], "cluster_shape": [1, 2, 1], "kernel_schedule": COOP, "epilogue_schedule": COOP},
            {"threadblock_shape": [64, 256, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
        ],
        "small": [
            {"threadblock_shape": [64, 128, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [64, 64, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [64, 128, 256], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            # M <= 64 streams B: more, narrower CTAs (256 at N = 8192, two per SM) keep more of it in flight
            {"threadblock_shape": [64, 32, 128], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
            {"threadblock_shape": [64, 64, 256], "cluster_shape": [1, 1, 1], "kernel_schedule": PING, "epilogue_schedule": TMA},
        ],
    },
    # Sm80: a (tile, stages) pair absent from the generator's tile list needs warp_count explicitly.
    "80": {
        "large": [
            {"threadblock_shape": [256, 128, 128], "stages": 3},
            {"threadblock_shape": [128, 256, 128], "stages": 3},
            {"threadblock_shape": [128, 128, 128], "stages": 4},
        ],
        "medium": [
            {"threadblock_shape": [64, 128, 64], "stages": 6},
            {"threadblock_shape": [128, 128, 64], "stages": 4, "warp_count": [2, 2, 1]},
            {"threadblock_shape": [64, 256, 64], "stages": 4},
            {"threadblock_shape": [128, 64, 64], "stages": 4, "warp_count": [2, 2, 1]},
            {"threadblock_shape": [64, 64, 128], "stages": 3, "warp_count": [2, 2, 1]},
        ],
        "small": [
            {"threadblock_shape": [64, 128, 64], "stages": 6},
            {"threadblock_shape": [64, 64, 128], "stages": 4, "warp_count": [2, 2, 1]},
            {"threadblock_shape": [32, 128, 128], "stages": 4, "warp_count": [1, 4, 1]},
        ],
    },
}
SHAPES = {"small": [16, 64], "medium": [128, 256], "large": [1024, 4096]}
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
    """The candidate with the int8-output requant epilogue: a bucket's tile must build for it too (a
    tile can compile for f16 output and not for int8's 16-element stores)."""
    return spec_for(kernel_cc, tile, target, "requant", "s8")


def f32_out_spec(kernel_cc: str, tile: dict, target: str) -> GemmKernelSpec:
    """The candidate with f32 output (4-element stores): a float_out tile must build for it too."""
    return spec_for(kernel_cc, tile, target, "dequant", "f32")


def _build(spec_dict: dict) -> str:
    try:
        return "cached" if build(GemmKernelSpec.from_dict(spec_dict))[1] else "built "
    except Exception as exc:  # a candidate that does not build is reported and later skipped
        return f"FAILED ({type(exc).__name__}: {str(exc).splitlines()[0][:100]})"


def builds(spec: GemmKernelSpec) -> tuple[bool, str]:
    """(whether ``spec`` builds, its status): a cache hit, else built now (a failure takes ~10 s)."""
    if lookup(spec) is not None:
        return True, "cached"
    status = _build(spec.to_dict())
    return not status.startswith("FAILED"), status


def choose(timed: list[tuple[float, dict, bool]]) -> dict | None:
    """A bucket's entry from (summed us, tile, builds for int8 output) per timed candidate.

    The fastest candidate that builds for every output, with the fastest float-only candidate (one
    whose int8-output variant does not build) as its ``float_out`` where that one is faster still.
    None where no candidate builds for every output (the bucket keeps its default)."""
    every = [(us, tile) for us, tile, int8_ok in timed if int8_ok]
    if not every:
        return None
    best_us, best = min(every, key=lambda t: t[0])
    entry = {key: value for key, value in best.items() if key != "float_out"}
    float_only = [(us, tile) for us, tile, int8_ok in timed if not int8_ok]
    if float_only:
        float_us, float_tile = min(float_only, key=lambda t: t[0])
        if float_us < best_us:
            entry["float_out"] = {key: value for key, value in float_tile.items() if key != "float_out"}
    return entry


def time_candidate(spec: GemmKernelSpec, bucket: str) -> float:
    import torch

    from cutlass_ops.cutlass import Int8Gemm
    from _timing import graph_us

    plan = Int8Gemm(spec)
    total = 0.0
    for M in SHAPES[bucket]:
        A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
        B = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
        s_row, s_col = torch.rand(M, device="cuda"), torch.rand(N, device="cuda")
        out = torch.empty(M, N, dtype=torch.float16, device="cuda")
        # a CUDA graph of calls: at small M the host cost per call exceeds the kernel's time
        total += graph_us(lambda: plan(A, B, out=out, scale_row=s_row, scale_col=s_col))
    return total


def _build_all(specs: list[GemmKernelSpec], jobs: int) -> list[str]:
    # one process per build: the CUTLASS interface keeps process-wide state while emitting
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        statuses = list(pool.map(_build, [s.to_dict() for s in specs]))
    for spec, status in zip(specs, statuses):
        print(f"{status} {spec.name}", flush=True)
    return statuses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-only", action="store_true", help="compile the candidates (no GPU needed)")
    p.add_argument("--target", default=None, help="target compute capability for --build-only (e.g. 90)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="candidates built at once (--build-only)")
    p.add_argument("--archs", nargs="+", default=list(CANDIDATES), help="kernel generations to tune")
    p.add_argument("--buckets", nargs="+", choices=BUCKETS, default=list(BUCKETS), help="M buckets to tune")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: tuning/<gpu name>.json)")
    p.add_argument("--report", type=Path, default=None,
                   help="the timings table (default: scripts/results/<gpu>/tune_int8_gemm.md)")
    args = p.parse_args()
    candidates = [(cc, bucket, tile) for cc in args.archs for bucket, tiles in CANDIDATES[cc].items()
                  if bucket in args.buckets for tile in tiles]
    if args.build_only:
        target = args.target or "90"
        pairs = [(spec_for(cc, tile, target), int8_out_spec(cc, tile, target)) for cc, _, tile in candidates]
        unique = list(dict.fromkeys(spec for pair in pairs for spec in pair))  # a tile may be in two buckets
        status = dict(zip(unique, _build_all(unique, args.jobs)))
        # float_out candidates (no int8-output build): their f32-output variant too
        float_only = list(dict.fromkeys(f32_out_spec(cc, tile, target) for (cc, _, tile), (_, int8) in
                                        zip(candidates, pairs) if status[int8].startswith("FAILED")))
        if float_only:
            print(f"{len(float_only)} candidates do not build for int8 output; building their f32 output "
                  f"(float_out candidates)", flush=True)
            _build_all(float_only, args.jobs)
        return 0

    import torch
    from _timing import write_report

    major, minor = torch.cuda.get_device_capability()
    target = f"{major}{minor}"
    result: dict[str, dict] = {}
    lines = [f"GPU: {torch.cuda.get_device_name()}; dequant f16, N = K = {N}; summed device us over M in each bucket", "",
             "| gen | bucket | tile | us |", "|---|---|---|---|"]
    timed: dict[tuple[str, str], list[tuple[float, dict, bool]]] = {}
    for cc, bucket, tile in candidates:
        if (cc == "90" and target != "90") or int(cc) > int(target):
            continue
        spec = spec_for(cc, tile, target)
        int8_ok, _ = builds(int8_out_spec(cc, tile, target))
        note = ""
        if not int8_ok:
            f32_ok, status = builds(f32_out_spec(cc, tile, target))
            if not f32_ok:
                lines.append(f"| {cc} | {bucket} | {spec.name} | skipped: builds for neither int8 nor f32 output "
                             f"({status}) |")
                continue
            note = " (float_out candidate: no int8-output build)"
        try:
            us = time_candidate(spec, bucket)
        except Exception as exc:  # a candidate that cannot run this shape is skipped, and said
            lines.append(f"| {cc} | {bucket} | {spec.name} | failed: {type(exc).__name__} |")
            continue
        timed.setdefault((cc, bucket), []).append((us, tile, int8_ok))
        lines.append(f"| {cc} | {bucket} | {spec.name} | {us:.1f}{note} |")
    for (cc, bucket), entries in timed.items():
        entry = choose(entries)
        if entry is None:
            lines.append(f"| {cc} | {bucket} | no candidate builds for int8 output: bucket left to default.json | |")
            continue
        result.setdefault(cc, {})[bucket] = entry
    out = args.out or TUNING_DIR / gpu_file_name(torch.cuda.get_device_name())
    # Entries not tuned in this run (other generations, buckets; "_source") stay as they were.
    table = json.loads(out.read_text()) if out.is_file() else {}
    for cc, buckets in result.items():
        table.setdefault(cc, {}).update(buckets)
    out.write_text(json.dumps(table, indent=2) + "\n")
    lines += ["", f"winners written to {out} (other entries kept; update its _source by hand)", "```",
              json.dumps(result, indent=2), "```"]
    write_report(lines, args.report, "tune_int8_gemm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
