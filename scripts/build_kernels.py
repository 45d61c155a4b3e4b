#!/usr/bin/env python3
"""Emit and compile every configured CUTLASS int8 GEMM kernel into the cache (no GPU needed).

    python3 scripts/build_kernels.py --arch 75 80 90 -j 2
    CUTLASS_OPS_CACHE_DIR=/tmp/kernel-cache python3 scripts/build_kernels.py --arch 90 --epilogue none dequant

``--arch`` lists the GPUs' compute capabilities to build for (each gets every kernel generation
it can run: 90 -> Sm90 + Sm80 + Sm75 kernels). A second run is all cache hits; the GPU runtime
then loads kernels from the cache without compiling.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

import epilogues
from custom_kernels import host_ext
from cutlass_ops.cutlass.build import build
from cutlass_ops.cutlass.spec import GemmKernelSpec
from cutlass_ops.cutlass.tuning import BUCKETS, configured_specs


def _build_one(spec_dict: dict) -> tuple[str, bool | None, float, str]:
    """(name, cache hit or None on failure, seconds, error) for one spec; runs in a worker."""
    spec = GemmKernelSpec.from_dict(spec_dict)
    t0 = time.perf_counter()
    try:
        _, hit = build(spec)
        return spec.name, hit, time.perf_counter() - t0, ""
    except Exception as exc:  # report every failure, keep building the rest
        return spec.name, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="+", default=["90"], help="target compute capabilities (75 80 86 89 90)")
    parser.add_argument("--epilogue", nargs="+", choices=epilogues.names(), help="only these epilogues")
    parser.add_argument("--bucket", nargs="+", choices=BUCKETS, default=BUCKETS,
                        help="M buckets (default: all); a bucket's float_out tile is built for its float outputs")
    parser.add_argument("--gpu-name", help="apply tuning/<gpu name>.json (e.g. 'NVIDIA H100 80GB HBM3')")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="kernels built at once (2 nvcc each)")
    parser.add_argument("--list", action="store_true", help="print the kernels and exit")
    parser.add_argument("--no-host-ext", action="store_true",
                        help="skip the C++ per-call launch path (custom_kernels/host_ext.py)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")

    specs: dict[str, GemmKernelSpec] = {}
    for arch in args.arch:
        for spec in configured_specs(arch, args.epilogue, tuple(args.bucket), args.gpu_name):
            specs.setdefault(spec.name, spec)
    if args.list:
        print("\n".join(specs))
        return 0

    cache = os.environ.get("CUTLASS_OPS_CACHE_DIR", "(user cache)")
    print(f"{len(specs)} kernels for sm {' '.join(args.arch)} -> {cache}", file=sys.stderr)
    hits, built, failures = 0, 0, []
    bar = tqdm(total=len(specs), unit="kernel")
    results = []
    if args.jobs <= 1:
        for spec in specs.values():
            bar.set_postfix_str(spec.name[:48])
            results.append(_build_one(spec.to_dict()))
            bar.update()
    else:
        with ProcessPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(_build_one, spec.to_dict()) for spec in specs.values()]
            for future in as_completed(futures):
                results.append(future.result())
                bar.update()
    bar.close()
    for name, hit, seconds, error in sorted(results):
        if hit is None:
            failures.append((name, error))
        elif hit:
            hits += 1
        else:
            built += 1
            print(f"built {name} in {seconds:.1f} s", file=sys.stderr)
    print(f"{built} built, {hits} cache hits, {len(failures)} failed", file=sys.stderr)
    for name, error in failures:
        print(f"FAILED {name}:\n{error}\n", file=sys.stderr)
    if not args.no_host_ext:
        t0 = time.perf_counter()
        try:
            where = host_ext.build()
            print(f"C++ launch path ready in {where} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        except Exception as exc:  # not a failure: the Python launch path works without it; say why
            print(f"WARNING: the C++ launch path did not build (int8_gemm keeps its Python path): {exc}",
                  file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
