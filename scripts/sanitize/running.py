"""The driver: case selection, the compute-sanitizer command line, and the run of the cases."""
from __future__ import annotations

import os
import sys
import time
import traceback

import torch

from sanitize.coverage import source_kernels
from sanitize.launch_trace import LaunchTrace
from sanitize.registry import SANITIZER_PREFIXES, Case, family_names


def sanitizer_command(cases: list[Case], tool: str = "memcheck") -> str:
    """The compute-sanitizer command line for ``cases`` (filters on the kernels they reach)."""
    names = sorted({n for c in cases for n in c.kernels})
    if tool == "initcheck":  # torch's writes must be instrumented too, or its outputs read as uninitialized
        filters = []
    elif 0 < len(names) <= 8:
        filters = [f"kne={n}" for n in names]  # exact names: nothing else is instrumented
    else:
        used = {next(p for p in SANITIZER_PREFIXES if p in n) for n in names if any(p in n for p in SANITIZER_PREFIXES)}
        filters = [f"kns={p}" for p in SANITIZER_PREFIXES if p in used]
    parts = ["PYTORCH_NO_CUDA_MEMORY_CACHING=1", "compute-sanitizer", f"--tool {tool}", "--report-api-errors no"]
    if tool == "memcheck":
        parts.append("--destroy-on-device-error kernel")
    parts.append("--error-exitcode 99")
    parts += [f"--kernel-name {f}" for f in filters]
    parts += ["python3", "scripts/sanitize_kernels.py"] + _passthrough_args()
    return " ".join(parts)


def _passthrough_args() -> list[str]:
    """The selection arguments of this invocation (to repeat them in the suggested command)."""
    out, argv, i = [], sys.argv[1:], 0
    while i < len(argv):
        a = argv[i]
        if a in ("-k", "--family") and i + 1 < len(argv):
            out += [a, repr(argv[i + 1]) if " " in argv[i + 1] else argv[i + 1]]
            i += 2
            continue
        if a.startswith("--family=") or a in ("--strict", "-v", "--verbose", "--lineinfo", "-x", "--exitfirst",
                                               "--tunables", "--plant-oob"):
            out.append(a)
        i += 1
    return out


def select(cases: list[Case], keywords: list[str] | None, families: list[str] | None,
           tunables: bool = False, plant_oob: bool = False) -> list[Case]:
    if not tunables:
        cases = [c for c in cases if not c.optional]
    if not plant_oob:
        cases = [c for c in cases if not c.selftest]
    wanted = family_names(families)
    if wanted is not None:
        cases = [c for c in cases if c.family in wanted]
    if keywords:
        cases = [c for c in cases if any(k in c.name for k in keywords)]
    return cases


def _under_sanitizer() -> bool:
    return any("sanitizer" in os.environ.get(v, "").lower()
               for v in ("CUDA_INJECTION64_PATH", "LD_PRELOAD", "NV_SANITIZER_INJECTION_PORT_RANGE_BEGIN")) \
        or "NV_SANITIZER_INJECTION_PORT_RANGE_BEGIN" in os.environ


def run_cases(cases: list[Case], args) -> int:
    from custom_kernels.device import capability as device_capability

    if args.lineinfo:
        from custom_kernels import nvrtc

        if "-lineinfo" not in nvrtc.BASE_OPTIONS:
            nvrtc.BASE_OPTIONS = tuple(nvrtc.BASE_OPTIONS) + ("-lineinfo",)
    torch.backends.cuda.matmul.allow_tf32 = False
    cc = device_capability()
    print(f"device: {torch.cuda.get_device_name()} (sm_{cc}), torch {torch.__version__}, "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '')!r}, "
          f"under compute-sanitizer: {'yes' if _under_sanitizer() else 'no (or not detected)'}", flush=True)
    trace = LaunchTrace()
    trace.install()
    ok = failed = skipped = incomplete = 0
    failures: list[str] = []
    t_start = time.perf_counter()
    for case in cases:
        if cc < case.min_cc:
            print(f"SKIP {case.name}  (needs sm_{case.min_cc}+)")
            skipped += 1
            continue
        trace.take()
        t0 = time.perf_counter()
        try:
            case.fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - every case reports
            failed += 1
            failures.append(case.name)
            print(f"FAIL {case.name}  ({type(exc).__name__}: {exc})", flush=True)
            if args.verbose:
                traceback.print_exc()
            try:  # a sticky CUDA error (e.g. an illegal address) poisons every later case
                torch.cuda.synchronize()
            except Exception as exc2:  # noqa: BLE001
                print(f"the CUDA context is unusable after {case.name} ({exc2}); stopping. "
                      f"Isolate it with -k '{case.name}'.")
                break
            if args.exitfirst:
                break
            continue
        seconds = time.perf_counter() - t0
        launched = trace.take()
        claimed = {(r.file, r.name) for r in case.refs}
        missing = sorted(claimed - set(launched)) if trace.active else []
        note = f"  [claimed but not launched: {', '.join(n for _, n in missing)}]" if missing else ""
        if missing:
            incomplete += 1
        if missing and args.strict:
            failed += 1
            failures.append(case.name)
            print(f"FAIL {case.name}  ({seconds:.2f} s){note}", flush=True)
        else:
            ok += 1
            print(f"OK {case.name}  ({seconds:.2f} s){note}", flush=True)
        if args.verbose and launched:
            print("     launched: " + ", ".join(f"{n} ({f})" for f, n in dict.fromkeys(launched)))
    elapsed = time.perf_counter() - t_start
    not_run = len(cases) - ok - failed - skipped
    print()
    print(f"summary: {ok} ok, {failed} failed, {skipped} skipped" + (f", {not_run} not run" if not_run else "")
          + f" of {len(cases)} cases in {elapsed:.1f} s"
          + (f"; {incomplete} launched fewer kernels than claimed" if incomplete else ""))
    if trace.active:
        sources = source_kernels()
        wanted = {(r.file, r.name) for c in cases if cc >= c.min_cc for r in c.refs}
        never = sorted(wanted - trace.all)
        launched_names = {n for _, n in trace.all}
        total = sum(len(v) for v in sources.values())
        print(f"kernels launched: {len(launched_names)} distinct names "
              f"({len(launched_names & {n for v in sources.values() for n in v})} of the {total} in the sources)")
        if never:
            print("claimed by the selected cases but never launched: " + ", ".join(f"{n}" for _, n in never))
    for name in failures:
        print(f"FAILED {name}")
    return 1 if failed else 0
