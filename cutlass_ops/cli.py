"""The ``cutlass-ops`` command: what this installation has, and ahead-of-time kernel builds.

    cutlass-ops info                      GPU, driver, versions, what is shipped and what is cached, and
                                          which C++ launch path int8_gemm would use
    cutlass-ops build --arch 90 -j 2      emit and compile the configured CUTLASS kernels into the cache

``build`` is ``scripts/build_kernels.py`` (which calls :func:`run_build`); it needs the ``cutlass``
extra (``pip install cutlass-ops[cutlass]``) and nvcc for kernels that are not shipped. ``info``
needs neither, nor a GPU.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import re
import sys
import time
from pathlib import Path

__all__ = ["main", "info", "add_build_arguments", "run_build", "count_entries"]


# ------------------------------------------------------------------------------------------------
# info
# ------------------------------------------------------------------------------------------------

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def count_entries(root: Path) -> str:
    """'<n> NVRTC cubins (sm_..), <m> CUTLASS kernels' for a cache or prebuilt tree at ``root``."""
    cubins = sorted((root / "nvrtc").glob("*.cubin")) if (root / "nvrtc").is_dir() else []
    kernels_dir = root / "cutlass" / "kernels"
    kernels = [d for d in kernels_dir.iterdir() if (d / "meta.json").is_file()] if kernels_dir.is_dir() else []
    archs = sorted({m.group(1) for c in cubins if (m := re.search(r"-sm(\w+?)-[0-9a-f]+\.cubin$", c.name))})
    where = f" (sm_{', sm_'.join(archs)})" if archs else ""
    return f"{len(cubins)} NVRTC cubins{where}, {len(kernels)} CUTLASS kernels"


def _gpu_lines() -> list[tuple[str, str]]:
    import torch

    if not torch.cuda.is_available():
        return [("driver", "no GPU"), ("GPUs", "no GPU")]
    try:
        from cuda.bindings import driver

        driver.cuInit(0)
        err, version = driver.cuDriverGetVersion()
        text = f"CUDA {version // 1000}.{version % 1000 // 10}" if err == driver.CUresult.CUDA_SUCCESS else str(err)
    except Exception as exc:  # noqa: BLE001 - info reports what it finds, never fails
        text = f"unknown ({type(exc).__name__}: {exc})"
    gpus = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        gpus.append(f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return [("driver", text), ("GPUs", "; ".join(gpus))]


def info() -> list[tuple[str, str]]:
    """(key, value) pairs describing this installation; works without a GPU, a toolkit or the extra."""
    import torch

    from custom_kernels import cache

    rows = [("cutlass-ops", _version("cutlass-ops")), ("python", sys.version.split()[0]),
            ("torch", torch.__version__), ("torch CUDA", str(torch.version.cuda))]
    rows += _gpu_lines()
    try:
        from custom_kernels.nvrtc import nvrtc_version

        rows.append(("nvrtc", ".".join(map(str, nvrtc_version()))))
    except Exception as exc:  # noqa: BLE001
        rows.append(("nvrtc", f"unavailable ({type(exc).__name__}: {exc})"))
    rows.append(("cuda-bindings", _version("cuda-bindings")))
    cutlass = _version("nvidia-cutlass")
    if cutlass == "not installed":
        cutlass += " (install cutlass-ops[cutlass] to build new CUTLASS kernels)"
    rows.append(("nvidia-cutlass", cutlass))
    try:
        from custom_kernels.cuda_paths import nvcc_path

        rows.append(("nvcc", nvcc_path()))
    except RuntimeError:
        rows.append(("nvcc", "not found (needed only to build new CUTLASS kernels)"))
    root = cache.cache_root()
    rows.append(("cache", f"{root} ({count_entries(root)})" if root.is_dir() else f"{root} (empty)"))
    shipped = cache.prebuilt_root()
    rows.append(("prebuilt", f"{shipped} ({count_entries(shipped)})"))
    try:
        from custom_kernels import host_ext

        rows.append(("C++ launch path", host_ext.describe()))
    except Exception as exc:  # noqa: BLE001
        rows.append(("C++ launch path", f"unknown ({type(exc).__name__}: {exc})"))
    return rows


# ------------------------------------------------------------------------------------------------
# build (scripts/build_kernels.py)
# ------------------------------------------------------------------------------------------------

def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    import epilogues
    from cutlass_ops.cutlass.tuning import BUCKETS

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


def _build_one(spec_dict: dict) -> tuple[str, bool | None, float, str]:
    """(name, cache hit or None on failure, seconds, error) for one spec; runs in a worker."""
    from cutlass_ops.cutlass.build import build
    from cutlass_ops.cutlass.spec import GemmKernelSpec

    spec = GemmKernelSpec.from_dict(spec_dict)
    t0 = time.perf_counter()
    try:
        _, hit = build(spec)
        return spec.name, hit, time.perf_counter() - t0, ""
    except Exception as exc:  # report every failure, keep building the rest
        return spec.name, None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"


def run_build(args: argparse.Namespace) -> int:
    """Build every configured kernel for ``args.arch`` into the cache; 1 if any failed."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm import tqdm

    from custom_kernels import host_ext
    from cutlass_ops.cutlass.spec import GemmKernelSpec
    from cutlass_ops.cutlass.tuning import configured_specs

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


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlass-ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="GPU, driver, versions, shipped and cached kernels")
    add_build_arguments(sub.add_parser("build", help="fill the kernel cache ahead of time (no GPU needed)"))
    args = parser.parse_args(argv)
    if args.command == "info":
        rows = info()
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key + ':':<{width + 1}} {value}")
        return 0
    return run_build(args)


if __name__ == "__main__":
    sys.exit(main())
