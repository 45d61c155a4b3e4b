"""Ahead-of-time compilation (no GPU needed with --arch): the NVRTC modules of the cases and of the default
variants, compiled and checked to hold their kernels."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from sanitize.registry import Case, family_names


Modules = dict[tuple[str, tuple], set[str]]  # {(source file, sorted defines): kernel names it must hold}


def case_modules(cases: list[Case]) -> Modules:
    """The (file, defines) modules the cases use, with the kernels they claim from each."""
    modules: Modules = {}
    for c in cases:
        for r in c.refs:
            modules.setdefault((r.file, r.defines), set()).add(r.name)
    return modules


def runnable(cases: list[Case], arch: str) -> list[Case]:
    """The cases a GPU of NVRTC target ``arch`` can run (the others' modules would never be loaded there)."""
    from cutlass_ops.default_variants import target_cc

    return [c for c in cases if c.min_cc <= target_cc(arch)]


def default_variant_modules(arch: str, families: list[str] | None = None) -> Modules:
    """The modules the default dispatch of the public ops can load on NVRTC target ``arch``
    (``cutlass_ops.default_variants``), only those of ``families`` (names or aliases) when given: what
    the sanitizer cases (which force strategies and configs) do not necessarily name."""
    from cutlass_ops.default_variants import default_modules

    return default_modules(arch, family_names(families))


def merge_modules(*parts: Modules) -> Modules:
    merged: Modules = {}
    for part in parts:
        for key, names in part.items():
            merged.setdefault(key, set()).update(names)
    return merged


def build_modules(cases: list[Case], arch: str, jobs: int, extra: Modules | None = None) -> int:
    """Compile every (file, defines) module the cases use (and the ``extra`` ones) and check each claimed
    kernel is in its cubin."""
    return compile_modules(merge_modules(case_modules(cases), extra or {}), arch, jobs)


def compile_modules(modules: Modules, arch: str, jobs: int) -> int:
    """Compile (or find in the cache) every module and check each named kernel is in its cubin; 1 on any failure."""
    from custom_kernels.nvrtc import compile_file

    print(f"compiling {len(modules)} NVRTC modules for sm_{arch} with {jobs} threads "
          f"(cache: {os.environ.get('CUTLASS_OPS_CACHE_DIR', 'user cache')})", flush=True)

    def one(key):
        file, defines = key
        t0 = time.perf_counter()
        cubin = compile_file(file, arch, defines=dict(defines))
        return key, cubin, time.perf_counter() - t0

    failures = cached = 0
    t_start = time.perf_counter()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        slow_first = ("gemv_mma.cu", "gemv_stream.cu")  # the longest NVRTC compiles
        futures = [pool.submit(one, key) for key in sorted(modules, key=lambda k: (k[0] not in slow_first, k))]
        for fut in futures:
            try:
                (file, defines), cubin, seconds = fut.result()
            except Exception as exc:  # noqa: BLE001 - report every module
                failures += 1
                print(f"FAIL compile: {type(exc).__name__}: {str(exc)[:2000]}")
                continue
            absent = sorted(n for n in modules[(file, defines)] if b"\0" + n.encode() + b"\0" not in cubin.data)
            label = f"{file} {dict(defines)}"
            if absent:
                failures += 1
                print(f"FAIL {label}: kernels not in the cubin: {absent}")
            else:
                cached += cubin.from_cache
                print(f"built {label} ({'cache' if cubin.from_cache else f'{seconds:.1f} s'}, "
                      f"{len(modules[(file, defines)])} kernels present)", flush=True)
    print(f"{len(modules) - failures} of {len(modules)} modules ok ({cached} from the cache, "
          f"{len(modules) - failures - cached} compiled in {time.perf_counter() - t_start:.1f} s)")
    return 1 if failures else 0
