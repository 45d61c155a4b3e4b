#!/usr/bin/env python3
"""What a wheel ships, named by the runtime itself (scripts/build_wheel.py runs this in its copy of the tree).

    python scripts/wheel_manifest.py nvrtc --arch 90a [--family quant_a ...] -j 8 --out nvrtc.json
    python scripts/wheel_manifest.py cutlass --arch 90 --out cutlass.json
    python scripts/wheel_manifest.py host-ext --prebuilt DIR [--from-cache DIR]

``nvrtc``: compiles, for one NVRTC target, the NVRTC modules of :func:`nvrtc_modules`: every module the
default dispatch of the public ops can load there (``cutlass_ops.default_variants``: each default
strategy, variant and block-size-dependent build, at any M and shape) and those of
``scripts/sanitize_kernels.py --build-only``'s cases (which force strategies and configs for coverage),
less the self-test kernels; each named kernel is checked to be in its cubin. They go into
``$CUTLASS_OPS_CACHE_DIR`` unless ``$CUTLASS_OPS_PREBUILT_DIR`` already has them (a cache directory has
the same layout); then it writes the file names of their cubins. ``sanitize_kernels.py --build-only
--default-variants`` compiles the same set into the user cache (on the GPU machine, before
``build_wheel.py --from-cache``).
``cutlass``: writes the configured CUTLASS kernels of each arch (``cutlass_ops/tuning/default.json``
and every ``tuning/<gpu>.json``, which the runtime applies on that GPU) as {index key: kernel name},
and the GPU names of those tables. ``host-ext``: writes the C++ launch path built for this Python and
torch into a prebuilt tree (:func:`custom_kernels.host_ext.ship`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SELFTEST_FAMILIES = ("converters_test",)  # test-only kernels: not shipped


def nvrtc_modules(target: str, families: list[str] | None = None) -> dict[tuple[str, tuple], set[str]]:
    """{(source file, defines): kernel names} a wheel ships for NVRTC target ``target``: the default
    variants (``cutlass_ops.default_variants``) and the modules of the sanitizer cases that can run there
    (a case needing a newer GPU names none), of ``families`` (``sanitize_kernels.py --family`` names or
    aliases; default: all but the self-test kernels)."""
    from sanitize_kernels import (
        FAMILIES, build_cases, case_modules, default_variant_modules, merge_modules, runnable, select,
    )

    families = families or [f for f in FAMILIES if f not in SELFTEST_FAMILIES]
    cases = runnable(select(build_cases(), None, families), target)
    return merge_modules(default_variant_modules(target, families), case_modules(cases))


def nvrtc_cubins(target: str, families: list[str] | None, jobs: int) -> list[str] | None:
    """File names of the cubins of the shipped NVRTC modules for ``target`` (compiled where missing),
    or None when a module failed."""
    from sanitize_kernels import compile_modules

    from custom_kernels.nvrtc import compile_file

    modules = nvrtc_modules(target, families)
    if compile_modules(modules, target, jobs):
        return None
    # every one a cache hit now: this only names the entries
    return sorted({compile_file(file, target, defines=dict(defines)).path.name for file, defines in modules})


def cutlass_kernels(archs: list[str]) -> dict:
    """{"gpu_names": [None, <tuned GPU>, ...], "kernels": {index key: kernel name}} for ``archs``."""
    from cutlass_ops.cutlass.tuning import BUCKETS, TUNING_DIR, configured_specs

    # A tuning file's stem is its GPU name as tuning.gpu_file_name writes it, and maps back to the file.
    gpu_names = [None, *sorted(p.stem for p in TUNING_DIR.glob("*.json") if p.name != "default.json")]
    kernels: dict[str, str] = {}
    for arch in archs:
        for gpu_name in gpu_names:
            for spec in configured_specs(arch, None, BUCKETS, gpu_name):
                kernels.setdefault(spec.index_key(), spec.name)
    return {"gpu_names": gpu_names, "kernels": kernels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    nvrtc = sub.add_parser("nvrtc", help="compile (where missing) and name the shipped NVRTC cubins of one target")
    nvrtc.add_argument("--arch", required=True, help="NVRTC target (75, 80, 86, 89, 90a)")
    nvrtc.add_argument("--family", nargs="+", help="only these kernel families (sanitize_kernels.py --family)")
    nvrtc.add_argument("-j", "--jobs", type=int, default=1)
    nvrtc.add_argument("--out", type=Path, required=True)
    cutlass = sub.add_parser("cutlass", help="name the configured CUTLASS kernels of some archs")
    cutlass.add_argument("--arch", nargs="+", required=True)
    cutlass.add_argument("--out", type=Path, required=True)
    host = sub.add_parser("host-ext", help="ship the C++ launch path for this Python and torch")
    host.add_argument("--prebuilt", type=Path, required=True, help="the prebuilt tree to write into")
    host.add_argument("--from-cache", type=Path, help="take the build from this cache if it has it")
    args = parser.parse_args(argv)

    if args.what == "nvrtc":
        names = nvrtc_cubins(args.arch, args.family, args.jobs)
        if names is None:
            return 1
        args.out.write_text(json.dumps(names, indent=1))
    elif args.what == "cutlass":
        args.out.write_text(json.dumps(cutlass_kernels(args.arch), indent=1))
    else:
        from custom_kernels import host_ext

        print(f"C++ launch path for {host_ext.prebuilt_tag()}: {host_ext.ship(args.prebuilt, args.from_cache)}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
