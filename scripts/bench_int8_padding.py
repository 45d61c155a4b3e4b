#!/usr/bin/env python3
"""Benchmark (not a test): int8 GEMMs at unaligned N / K against the aligned shape.

``cutlass_ops.int8_gemm`` and ``int8_gemm_requant`` take any N and K. An N that is not a multiple of
16 bytes of D runs on the any-N kernel (Sm80, D stored one element at a time: nothing padded along N;
cutlass_ops/cutlass/tuning.py ``any_n_spec``) or on the aligned kernel over N padded (Sm75; M = 1; Sm90 plans
at M <= 64 and where the any-N grid is long: cutlass_ops/cutlass/plan.py ``pads_N``; never while a graph is
captured), as K % 16 != 0 runs on zero-padded operands (cutlass_ops/cutlass/padding.py: A copied per call,
B and the per-column inputs padded once per tensor and kept, D copied out of D_pad by unpad_rows where N was
padded). Issue 18's target: such a
call within 1.3x of the aligned shape's time per output element. For each M (``--m``, default 1 64
1024) and case of ``CASES`` (N 1000 vs 1024, 257 vs 256, 4097 vs 4096 at K = 4096; K 4097 vs 4096;
both), each op:

- ``dequant f16``: ``int8_gemm(A, B, "dequant", scale_row, scale_col, bias, out_dtype=float16)``
- ``none s32``: ``int8_gemm(A, B)`` (int32 D, no epilogue)
- ``requant s8``: ``int8_gemm_requant(A, B, M_scale, fused_bias)`` (int8 D)

with the API's own kernel generation for the GPU. The weights (B and the per-column vectors) are
persistent tensors reused call after call as a module's buffers are, so the padded copies are made
once; A and B rotate over copies of at least 2x the L2 (at most 16 copies), as a network's layers
would stream them. Times per call, us:

- device: eager calls (the model's path: padded copies kept) queued behind a GPU sleep, so the
  GPU runs them back to back: CUDA events around 50 calls, median of 5 (no host time). The
  acceptance column: ratio = (padded us / its N) / (aligned us / its N), '!' past 1.3x.
- wall: back-to-back eager calls between two synchronizations, host cost included (median of 3
  loops of 50): what a host-bound small-M caller sees, the padded path's Python included.
- graph: a CUDA graph of 20 calls, median of 10 replays. Nothing is kept while a graph is captured, so
  graphs take the any-N kernels for an unaligned N (and copy A and B for an unaligned K every replay).

"kernel": the kernel the unaligned shape runs on eagerly, "Sm<cc> align <elements of D per store>" (e.g.
"Sm90 align 8": N = 1000 is aligned already for f16 D; "Sm80 align 1": the any-N kernel), with ", K padded to
<K_pad>" when A and B are padded along K, or ", padded to N_pad x K_pad" (padding.py). A markdown table
on stdout and in scripts/results/<gpu>/bench_int8_padding.md (or --out).

    python scripts/bench_int8_padding.py [--m 1 64 1024] [--ops dequant_f16 none_s32 requant_s8] [--out PATH]
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from _timing import Rotating, call_us, graph_us, sleep_cycles_per_us, write_report

import cutlass_ops as ops

log = logging.getLogger("bench_int8_padding")

# (label, padded (N, K), aligned reference (N, K))
CASES = [
    ("N 1000 vs 1024", (1000, 4096), (1024, 4096)),
    ("N 257 vs 256", (257, 4096), (256, 4096)),
    ("N 4097 vs 4096", (4097, 4096), (4096, 4096)),
    ("K 4097 vs 4096 (N 1024)", (1024, 4097), (1024, 4096)),
    ("N 1000, K 4097 vs N 1024, K 4096", (1000, 4097), (1024, 4096)),
]
M_VALUES = (1, 64, 1024)
# op name -> the kernels' name of its D type
OPS = {"dequant_f16": "f16", "none_s32": "s32", "requant_s8": "s8"}
RATIO_LIMIT = 1.3
QUEUED_CALLS = 50
QUEUED_REPS = 5
MAX_COPIES = 16
MAX_SLEEP_US = 100_000  # the longest GPU sleep queued_us puts ahead of its calls
DEFAULT_L2_BYTES = 50 * 2 ** 20


def per_element_ratio(t_padded: float, n_padded: int, t_aligned: float, n_aligned: int) -> float:
    """(t_padded / n_padded) / (t_aligned / n_aligned): time per output element (M is shared)."""
    return (t_padded / n_padded) / (t_aligned / n_aligned)


def fmt_ratio(ratio: float, limit: float = RATIO_LIMIT) -> str:
    """'1.02x', with '!' past ``limit``; '-' when a time is missing (nan)."""
    if not math.isfinite(ratio):
        return "-"
    return f"{ratio:.2f}x" + ("!" if ratio > limit else "")


def fmt_us(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "-"


def copies_for(nbytes: int, l2_bytes: int, max_copies: int = MAX_COPIES) -> int:
    """How many copies of ``nbytes`` of operands to rotate over: at least 2x the L2, at most ``max_copies``."""
    return max(1, min(max_copies, math.ceil(2 * l2_bytes / max(nbytes, 1))))


def kernel_ran(N: int, K: int, kernel_cc: int, element_D: str, tile: str = "") -> str:
    """Which kernel a plan of generation ``kernel_cc`` runs (N, K) on: 'Sm90 align 8', 'Sm80 align 1'
    (the any-N kernel; ``tile`` appended when given), either with ', K padded to K_pad', or 'Sm75 padded to
    N_pad x K_pad'. M = 1 outside capture pads N on Sm80+ too: :func:`plan_kernel` says which."""
    from cutlass_ops.cutlass.padding import padded_sizes
    from cutlass_ops.cutlass.tuning import ANY_N_ALIGNMENT_D, ANY_N_KERNEL_CC, alignment_D

    align = alignment_D(kernel_cc, element_D)
    N_pad, K_pad = padded_sizes(N, K, align)
    if N_pad != N and kernel_cc < ANY_N_KERNEL_CC:
        return f"Sm{kernel_cc} padded to {N_pad}x{K_pad}"
    if N_pad != N:
        kernel_cc, align = ANY_N_KERNEL_CC, ANY_N_ALIGNMENT_D
    return f"Sm{kernel_cc} align {align}" + (f" {tile}" if tile else "") + (f", K padded to {K_pad}" if K_pad != K else "")


def plan_kernel(M: int, N: int, K: int, kernel_cc: int, op: str) -> str:
    """:func:`kernel_ran` as the plan on GPU 0 decides it at this M (eagerly: padded N or the any-N tile)."""
    from cutlass_ops.cutlass.padding import padded_sizes
    from cutlass_ops.cutlass.plan import get_plan
    from cutlass_ops.cutlass.tuning import alignment_D

    element_D = OPS[op]
    plan = get_plan(0, kernel_cc, op.rsplit("_", 1)[0], element_D, M)
    any_n = plan.any_n_for(M, N, 0)
    if any_n is None:
        N_pad, K_pad = padded_sizes(N, K, alignment_D(kernel_cc, element_D))
        if N_pad != N:
            return f"Sm{kernel_cc} align {plan.spec.alignment_D}, padded to {N_pad}x{K_pad}"
        return kernel_ran(N, K, kernel_cc, element_D)
    return kernel_ran(N, K, kernel_cc, element_D, "x".join(map(str, any_n.spec.threadblock_shape[:2])))


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------

def queued_us(fn, cycles_per_us: float, calls: int = QUEUED_CALLS, reps: int = QUEUED_REPS) -> float:
    """Device us per call of eager calls run back to back: the GPU sleeps while the host enqueues
    ``calls`` calls, CUDA events around them (median of ``reps``). A loop whose enqueueing outlasted
    most of the sleep (launch gaps timed) is dropped and the sleep lengthened (up to MAX_SLEEP_US);
    nan if no loop got ahead of the GPU (e.g. a call that synchronizes)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueue_us = (time.perf_counter() - t0) * 1e6
    torch.cuda.synchronize()
    sleep_us = min(2 * enqueue_us + 200, MAX_SLEEP_US)
    times: list[float] = []
    for _ in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(sleep_us * cycles_per_us))
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        enqueue_us = (time.perf_counter() - t0) * 1e6
        end.record()
        end.synchronize()
        if enqueue_us > 0.8 * sleep_us:  # the GPU may have caught up with the host: not pure device time
            sleep_us = min(2 * enqueue_us + 200, MAX_SLEEP_US)
            continue
        times.append(start.elapsed_time(end) * 1e3 / calls)
        if len(times) == reps:
            break
    if not times:
        log.warning("queued timing failed: the host never got %d calls ahead of the GPU", calls)
        return float("nan")
    return statistics.median(times)


# --------------------------------------------------------------------------------------------
# one shape
# --------------------------------------------------------------------------------------------

def make_call(op: str, M: int, N: int, K: int, copies: int):
    """A Rotating call of ``op`` at (M, N, K) over ``copies`` persistent (A, B) pairs and its operands."""
    gen = torch.Generator(device="cuda").manual_seed(M * 1_000_003 + N * 1009 + K)

    def i8(*shape):
        return torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda", generator=gen)

    As = [i8(M, K) for _ in range(copies)]
    Bs = [i8(N, K) for _ in range(copies)]
    if op == "dequant_f16":
        s_row = torch.rand(M, device="cuda", generator=gen) * 1e-2
        s_col = torch.rand(N, device="cuda", generator=gen) * 1e-2
        bias = torch.randn(N, device="cuda", generator=gen)
        fn = lambda i: ops.int8_gemm(As[i], Bs[i], "dequant", scale_row=s_row, scale_col=s_col,  # noqa: E731
                                     bias=bias, out_dtype=torch.float16)
    elif op == "none_s32":
        fn = lambda i: ops.int8_gemm(As[i], Bs[i])  # noqa: E731
    elif op == "requant_s8":
        m_scale = torch.rand(N, device="cuda", generator=gen) * 1e-4
        fused_bias = torch.randn(N, device="cuda", generator=gen) * 100
        fn = lambda i: ops.int8_gemm_requant(As[i], Bs[i], m_scale, fused_bias)  # noqa: E731
    else:
        raise ValueError(f"unknown op {op!r}; one of {sorted(OPS)}")
    return Rotating(fn, copies), As, Bs


def check_exact(call, As, Bs, op: str) -> str | None:
    """int32 D of copy 0 against a float64 matmul (exact for these sizes); None when it agrees."""
    if op != "none_s32":
        return None
    call.i = call.count - 1  # the next call uses copy 0
    D = call()
    ref = (As[0].double() @ Bs[0].double().t()).to(torch.int64)
    if D.shape != ref.shape or not torch.equal(D.to(torch.int64), ref):
        return f"D differs from the float64 reference (shape {tuple(D.shape)})"
    return None


def bench_shape(op: str, M: int, N: int, K: int, l2_bytes: int, cycles_per_us: float) -> dict:
    """{'device', 'wall', 'graph'}: us per call of ``op`` at (M, N, K), or {'error': reason}."""
    copies = copies_for(M * K + N * K, l2_bytes)
    try:
        call, As, Bs = make_call(op, M, N, K, copies)
        call()  # first call: loads the kernel, registers the shape, pads and keeps B (and per-column inputs)
        torch.cuda.synchronize()
        error = check_exact(call, As, Bs, op)
    except (ValueError, TypeError, RuntimeError) as exc:
        log.warning("%s M=%d N=%d K=%d refused: %s", op, M, N, K, exc)
        return {"error": f"refused: {str(exc).splitlines()[0][:100]}".replace("|", "/")}
    if error:
        log.warning("%s M=%d N=%d K=%d: %s", op, M, N, K, error)
    for _ in range(copies):  # every copy's padded B made before the timing
        call()
    torch.cuda.synchronize()
    result = {"copies": copies}
    timings = {"device": lambda: queued_us(call, cycles_per_us), "wall": lambda: call_us(call, iters=50, repeats=3),
               "graph": lambda: graph_us(call, reps=20, iters=10)}
    for column, timing in timings.items():
        try:
            result[column] = timing()
        except Exception as exc:  # report it in the table, keep benchmarking the rest
            log.exception("%s M=%d N=%d K=%d: %s timing failed", op, M, N, K, column)
            result[column] = float("nan")
            error = "; ".join(filter(None, [error, f"{column} timing failed: {type(exc).__name__}"]))
    if error:
        result["error"] = error
    log.info("%s M=%d N=%d K=%d (%d copies): device %.1f us, wall %.1f us, graph %.1f us", op, M, N, K, copies,
             result["device"], result["wall"], result["graph"])
    return result


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

HEADER = ["M", "case", "op", "kernel", "device us (aligned / padded)", "device per elem",
          "wall us (aligned / padded)", "wall per elem", "graph us (aligned / padded)", "graph per elem"]
COLUMNS = ("device", "wall", "graph")


def table_row(M: int, case: tuple, op: str, aligned: dict, padded: dict, kernel_cc: int) -> tuple[str, dict]:
    """The markdown row of one (M, case, op) and its per-element ratios (nan where a time is missing)."""
    label, (N, K), (N_ref, _) = case
    kernel = plan_kernel(M, N, K, kernel_cc, op) if torch.cuda.is_available() else kernel_ran(N, K, kernel_cc, OPS[op])
    cells = [str(M), label, op.replace("_", " "), kernel]
    ratios = {}
    for column in COLUMNS:
        t_al, t_pad = aligned.get(column, float("nan")), padded.get(column, float("nan"))
        ratios[column] = per_element_ratio(t_pad, N, t_al, N_ref)
        cells += [f"{fmt_us(t_al)} / {fmt_us(t_pad)}", fmt_ratio(ratios[column])]
    errors = [f"aligned: {aligned['error']}" if "error" in aligned else "",
              f"padded: {padded['error']}" if "error" in padded else ""]
    if any(errors):
        cells[-1] += " (" + "; ".join(e for e in errors if e) + ")"
    return "| " + " | ".join(cells) + " |", ratios


def summary(rows: list[tuple[str, dict]]) -> list[str]:
    """Per timing column: how many (M, case, op) are within RATIO_LIMIT per output element."""
    lines = []
    for column in COLUMNS:
        values = [(name, r[column]) for name, r in rows]
        ok = sum(1 for _, x in values if x <= RATIO_LIMIT)
        missed = [f"{name} ({fmt_ratio(x)})" for name, x in values if not x <= RATIO_LIMIT]
        line = f"- {column}: {ok}/{len(values)} within {RATIO_LIMIT}x per output element"
        lines.append(line + (f" (missed: {'; '.join(missed)})" if missed else ""))
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_int8_padding.md")
    p.add_argument("--m", type=int, nargs="+", default=list(M_VALUES), help="rows of A (default: 1 64 1024)")
    p.add_argument("--ops", nargs="+", choices=sorted(OPS), default=list(OPS),
                   help="ops to time (default: all)")
    args = p.parse_args(argv)
    if any(m < 1 for m in args.m):
        p.error(f"--m must be >= 1, got {args.m}")
    args.m = list(dict.fromkeys(args.m))
    args.ops = list(dict.fromkeys(args.ops))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_grad_enabled(False)
    from cutlass_ops.cutlass.tuning import resolve_arch

    major, minor = torch.cuda.get_device_capability()
    kernel_cc = resolve_arch(None, 10 * major + minor)
    l2_bytes = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0) \
        or DEFAULT_L2_BYTES
    cycles_per_us = sleep_cycles_per_us()
    log.info("kernel generation Sm%d, L2 %.0f MiB, GPU sleep %.0f cycles/us", kernel_cc, l2_bytes / 2 ** 20,
             cycles_per_us)

    times: dict[tuple, dict] = {}  # (op, M, N, K) -> bench_shape's result (aligned shapes are shared)

    def timed(op, M, N, K):
        key = (op, M, N, K)
        if key not in times:
            times[key] = bench_shape(op, M, N, K, l2_bytes, cycles_per_us)
        return times[key]

    lines, rows = [], []
    for M in args.m:
        for case in CASES:
            _, (N, K), (N_ref, K_ref) = case
            for op in args.ops:
                aligned = timed(op, M, N_ref, K_ref)
                padded = timed(op, M, N, K)
                line, ratios = table_row(M, case, op, aligned, padded, kernel_cc)
                lines.append(line)
                rows.append((f"M={M} {case[0]} {op.replace('_', ' ')}", ratios))
                log.info("%s", line)
        torch.cuda.empty_cache()  # bench_shape's operands (and their padded copies) died with it

    text = [f"# int8 GEMM at unaligned N / K vs the aligned shape ({torch.cuda.get_device_name()})",
            "",
            f"Kernel generation Sm{kernel_cc} (the API's choice on this GPU). Time per call in us; per elem: "
            f"(padded us / N) / (aligned us / N_aligned),",
            f"issue 18's target <= {RATIO_LIMIT}x ('!' marks a miss) on the device column. device: eager calls "
            f"queued back to back",
            "behind a GPU sleep (B's padded copy kept, as a module's weight: the acceptance column); wall: "
            "back-to-back eager",
            "calls with host cost; graph: CUDA graph replays (nothing is kept while capturing: an unaligned N runs "
            "on the any-N",
            f"kernel, an unaligned K copies A and B per replay). A and B rotate over copies of >= 2x the L2 "
            f"({l2_bytes / 2 ** 20:.0f} MiB; at most {MAX_COPIES}).",
            "kernel: what the eager call of the unaligned shape runs on, for that op's D type: Sm<cc> align <D "
            "elements per store>",
            "(Sm80 align 1 <tile M x N>: the any-N kernel, nothing padded along N), ', padded to N_pad x K_pad' "
            "(the aligned kernel over N padded,",
            "D copied out by unpad_rows: cutlass/plan.py pads_N), ', K padded to K_pad' where A and B are padded "
            "along K only.",
            "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER), *lines, "",
            "Within the target:", "", *summary(rows)]
    write_report(text, args.out, "bench_int8_padding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
