#!/usr/bin/env python3
"""Launch every raw NVRTC kernel of the project once, at ragged shapes, for compute-sanitizer.

Each case builds small inputs, calls the project's own entry point (the ``cutlass_ops`` API or the
family entry points (``cutlass_ops.weight_only``, ``.conv``, ``.w8a8``), with the knobs the GPU
tests use to force a strategy or a kernel variant: ``strategy=``, ``config=``, ``split_k=``, ``weight_only.SMALL_M_GEMV``,
``cutlass_ops.w8a8`` tile choice) and synchronizes, so a sanitizer report comes out just above the
line of the case that caused it. It prints ``OK <case>`` (or ``FAIL`` / ``SKIP``) per case and a
summary, and exits 1 if a case raised. No CUTLASS kernel is built or launched (``int8_gemm``, and the
W8A8 "orchestrator" and "literal" paths, which run CUTLASS GEMMs, are left out); the fused scheme-2
kernel is NVRTC and is in. Every ``extern "C" __global__`` kernel of custom_kernels/kernels/*.cu
is reached (``--check-coverage``).

On the GPU machine, compile first (NVRTC; gemv_mma.cu / gemv_stream.cu take about a minute per module, so
about 2 minutes cold with 16 threads), then run under memcheck, instrumenting only the project's
kernels (torch's and cuBLAS's are not; the filters match substrings of the unmangled extern "C"
names, and several --kernel-name filters add up):

    python3 scripts/sanitize_kernels.py --build-only -j 16    # fills the cubin cache, launches nothing
    python3 scripts/sanitize_kernels.py --build-only --default-variants -j 16
                                              # + every default variant: what scripts/build_wheel.py ships
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no \
        --destroy-on-device-error kernel --error-exitcode 99 \
        --kernel-name kns=gemv_ --kernel-name kns=gemm_mma_mt --kernel-name kns=gemm_simt \
        --kernel-name kns=gemm_small_m --kernel-name kns=gemm_wgmma \
        --kernel-name kns=conv_ --kernel-name kns=splitk_reduce --kernel-name kns=gather_k --kernel-name kns=dequant_ \
        --kernel-name kns=quantize_q8_1 --kernel-name kns=test_int --kernel-name kns=test_uint \
        --kernel-name kns=quant_a_ --kernel-name kns=precompute_sum_bq --kernel-name kns=precompute_bvec --kernel-name kns=bias_act_ \
        --kernel-name kns=w8a8_kblock_gemm --kernel-name kns=w8a8_kblock_wgmma --kernel-name kns=w8a8_row_planes \
        --kernel-name kns=quantize_weight_ --kernel-name kns=quant_token_ --kernel-name kns=pad_rows_ --kernel-name kns=unpad_rows \
        python3 scripts/sanitize_kernels.py

The script prints that command for the cases it selected (``--sanitizer-cmd`` prints only it; with
a few kernels selected it uses exact ``kne=`` names). The verdict is the sanitizer's ERROR SUMMARY
and its exit status (99 on any error): with ``--destroy-on-device-error kernel`` a faulty kernel is
stopped, the application is not told, and every later case still runs (its line still reads OK);
without it the first error ends the CUDA context, that case FAILs and the script stops.
``--report-api-errors no``: cuda-bindings probes driver entry points with cuGetProcAddress, which
fails harmlessly (34 "errors" per run otherwise). ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` gives every
tensor its own cudaMalloc, so an access past a tensor's end is past an allocation's end: with torch's
caching allocator memcheck misses even a 4000-byte overrun (``--plant-oob`` shows both); the script
sets it itself when unset (``--caching-allocator`` keeps the cache). ``--lineinfo`` compiles with
-lineinfo so reports name the .cu line (a separate cache entry: compile again with it).

Other tools: ``--tool racecheck`` and ``--tool synccheck`` take the same filters (``--sanitizer-cmd
--tool racecheck`` prints the line). ``--tool initcheck`` must run WITHOUT kernel filters: memory
written by uninstrumented torch kernels (e.g. the packed scale/offset words) looks uninitialized to it,
and it is slow (up to ~30 s a case), so select a few cases with -k / --family.

Measured on an H100 (torch 2.11, compute-sanitizer 2025.3.1), cubins cached: the 261 default cases
run in about 5 s plainly, 4 s (9 s with start-up) under memcheck, 60 s under racecheck, 4 s under
synccheck, with no error reported.

Options: ``--list`` prints the cases and the kernels each reaches, ``-k SUBSTRING`` (repeatable)
keeps the cases whose name contains it, ``--family NAME`` (repeatable) keeps one kernel family (a .cu
file stem, or an alias: gemv, gemm, dequant, dp4a, converters, conv, quant, scheme2, w8a8),
``--check-coverage`` (no GPU) checks that the cases reach every ``extern "C" __global__`` kernel of
the sources and that the filters match them all, ``--build-only --arch 90a`` compiles without a GPU
the modules of the selected cases that can run on that arch and checks each claimed kernel is in its
cubin (``--default-variants`` adds every module the default dispatch of the public ops can load there,
``cutlass_ops.default_variants``: the cases force strategies and configs for coverage, they are not
that set; the union, less the converters self-test, is what ``scripts/build_wheel.py`` ships),
``--tunables`` adds the gemv kernel variants of weight_only.GemvMmaConfig / StreamConfig (where they
exist), ``--strict`` fails a case that did not launch every kernel it claims (launches are traced at
run time), ``-v`` prints them.
"""
from __future__ import annotations

import argparse
import os
import sys

# Before torch initializes CUDA: one cudaMalloc per tensor, so memcheck sees each tensor's bounds.
if "--caching-allocator" not in sys.argv:
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import torch  # noqa: E402

# The cases and the machinery live in the package scripts/sanitize/; scripts/wheel_manifest.py and the tests
# import these names from here.
from sanitize.build import (  # noqa: E402
    build_modules, case_modules, compile_modules, default_variant_modules, merge_modules, runnable,
)
from sanitize.cases import build_cases  # noqa: E402
from sanitize.coverage import check_coverage  # noqa: E402
from sanitize.registry import ALIASES, FAMILIES  # noqa: E402
from sanitize.running import run_cases, sanitizer_command, select  # noqa: E402

__all__ = ["ALIASES", "FAMILIES", "build_cases", "case_modules", "check_coverage", "compile_modules",
           "default_variant_modules", "main", "merge_modules", "runnable", "select"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the selected cases and their kernels, then exit")
    parser.add_argument("-k", dest="keywords", action="append", metavar="SUBSTRING",
                        help="keep cases whose name contains SUBSTRING (repeatable: any)")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES + tuple(ALIASES)), metavar="NAME",
                        help=f"keep one kernel family (repeatable): {', '.join(FAMILIES)} "
                             f"(aliases: {', '.join(ALIASES)})")
    parser.add_argument("--check-coverage", action="store_true",
                        help="no GPU: check the cases reach every extern \"C\" __global__ kernel of the sources")
    parser.add_argument("--build-only", action="store_true",
                        help="compile the selected cases' NVRTC modules (and check each claimed kernel is in its "
                             "cubin), no launch; without a GPU give --arch")
    parser.add_argument("--default-variants", action="store_true",
                        help="with --build-only: also every module the default dispatch of the public ops can load "
                             "(cutlass_ops.default_variants; of the --family families when given): with the cases' "
                             "modules, what scripts/build_wheel.py ships")
    parser.add_argument("--arch", help="NVRTC target for --build-only (default: the GPU's, e.g. 90a)")
    parser.add_argument("-j", "--jobs", type=int, default=max(1, min(16, os.cpu_count() or 1)),
                        help="compile threads for --build-only")
    parser.add_argument("--sanitizer-cmd", action="store_true", help="print the compute-sanitizer command and exit")
    parser.add_argument("--tool", default="memcheck", choices=("memcheck", "racecheck", "synccheck", "initcheck"),
                        help="the sanitizer tool of the suggested command (initcheck: no kernel filters)")
    parser.add_argument("--lineinfo", action="store_true", help="compile with -lineinfo (source lines in reports)")
    parser.add_argument("--tunables", action="store_true",
                        help="also the kernel variants of weight_only.GemvMmaConfig / StreamConfig, where they exist "
                             "(each one more NVRTC module of gemv_mma.cu / gemv_stream.cu)")
    parser.add_argument("--plant-oob", action="store_true",
                        help="add a case that writes past its output on purpose (test_int8s_to_half2x2): under "
                             "memcheck it must be reported, which shows the filters instrument our kernels")
    parser.add_argument("--strict", action="store_true", help="fail a case that did not launch every claimed kernel")
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failing case")
    parser.add_argument("--caching-allocator", action="store_true",
                        help="keep torch's caching allocator (default: PYTORCH_NO_CUDA_MEMORY_CACHING=1)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the kernels each case launched")
    args = parser.parse_args(argv)
    if args.default_variants and not args.build_only:
        parser.error("--default-variants needs --build-only")

    all_cases = build_cases()
    if args.check_coverage:  # the default selection (no --tunables, no --plant-oob) must reach everything
        return check_coverage(select(all_cases, None, None))
    cases = select(all_cases, args.keywords, args.family, args.tunables, args.plant_oob)
    if not cases:
        print("no case selected", file=sys.stderr)
        return 2
    if args.sanitizer_cmd:
        print(sanitizer_command(cases, args.tool))
        return 0
    if args.list:
        for c in cases:
            extra = f"  (sm_{c.min_cc}+)" if c.min_cc else ""
            print(f"{c.family:18s} {c.name}{extra}\n{'':18s}   -> {', '.join(c.kernels)}"
                  + (f"\n{'':18s}      ({c.note})" if c.note else ""))
        names = {n for c in cases for n in c.kernels}
        print(f"\n{len(cases)} cases, {len(names)} distinct kernel names")
        print(f"suggested: {sanitizer_command(cases, args.tool)}")
        return 0
    if args.build_only:
        arch = args.arch
        if arch is None:
            if not torch.cuda.is_available():
                print("--build-only without a GPU needs --arch (e.g. 90a, 80)", file=sys.stderr)
                return 2
            from custom_kernels.device import target_arch

            arch = target_arch()
        if args.lineinfo:
            from custom_kernels import nvrtc

            nvrtc.BASE_OPTIONS = tuple(nvrtc.BASE_OPTIONS) + ("-lineinfo",)
        extra = default_variant_modules(arch, args.family) if args.default_variants else None
        return build_modules(runnable(cases, arch), arch, args.jobs, extra)
    print(f"suggested: {sanitizer_command(cases, args.tool)}", flush=True)
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to launch (--list, --check-coverage and --build-only --arch work without one)",
              file=sys.stderr)
        return 2
    return run_cases(cases, args)


if __name__ == "__main__":
    sys.exit(main())
