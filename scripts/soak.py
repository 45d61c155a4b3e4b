"""Soak: many public-API calls over random shapes, dtypes and ops in one process; memory and caches
must stay bounded.

Samples, every ``--every`` calls: GPU memory (allocated, reserved), host RSS (/proc/self/statm) and
the size of every bounded cache - ``plan_cache.stats()`` (LRU: MAX_WEIGHTS weights x
MAX_PLANS_PER_WEIGHT plans), the CUTLASS plans (``cutlass.plan._plans``/``_loaded``: one per device,
arch, epilogue, output and M bucket) and their per-shape Params (``GemmKernel._states``, at most
``kernel._SHAPES_KEPT`` each), the conv plans (``conv.plan_for``, LRU of ``PLANS_KEPT``), the
W8A8 launches and TMA maps (``w8a8.tma._KEPT``). Growth after the warm-up half is reported; the
run ends with a summary line and writes the table to ``scripts/results/<gpu>/soak.md``:

    python scripts/soak.py [--calls 100000] [--seed 0] [--out PATH]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import torch

from _timing import table, write_report

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2 ** 20


def cache_sizes() -> dict[str, int]:
    """Entries of every bounded cache the runtime keeps (0 where a module is not loaded)."""
    from cutlass_ops import plan_cache

    sizes = dict(plan_cache.stats())
    mods = sys.modules
    if "cutlass_ops.cutlass.plan" in mods:
        plan = mods["cutlass_ops.cutlass.plan"]
        sizes["cutlass_plans"] = len(plan._plans) + len(plan._loaded)
        kernels = [p._kernel for p in {*plan._plans.values(), *plan._loaded.values()}
                   if getattr(p, "_kernel", None) is not None]
        sizes["cutlass_shapes"] = sum(len(k._states) for k in kernels)
        sizes["cutlass_params"] = sum(len(s.rebuilt) for k in kernels for s in k._states.values())
    if "cutlass_ops.conv" in mods:
        sizes["conv_plans"] = mods["cutlass_ops.conv"].plan_for.cache_info().currsize
    if "cutlass_ops.w8a8.launches" in mods:
        sizes["w8a8_launches"] = mods["cutlass_ops.w8a8.launches"].grid_launches.cache_info().currsize
    if "cutlass_ops.w8a8.tma" in mods:
        sizes["tma_maps"] = len(mods["cutlass_ops.w8a8.tma"]._maps)
    return sizes


def make_ops(rng: random.Random):
    import cutlass_ops as co

    g = torch.Generator().manual_seed(0)
    weights = {}
    for K in (256, 512, 1024):
        for N in (128, 384):
            W = torch.randn(N, K, generator=g)
            weights[(N, K, 4)] = co.quantize_weight(W, bits=4, block_size=128).to("cuda")
            weights[(N, K, 8)] = co.quantize_weight(W, bits=8, block_size=128).to("cuda")
    conv_w = {Ci: co.quantize_conv_weight(torch.randn(64, Ci, 3, 3, generator=g), bits=8).to("cuda") for Ci in (32, 64)}
    Bs = {(N, K): torch.randint(-8, 8, (N, K), dtype=torch.int8, generator=g).cuda() for N in (128, 384)
          for K in (256, 512, 1024)}

    def linear():
        N, K, bits = rng.choice(list(weights))
        x = torch.randn(rng.randint(1, 300), K, device="cuda", dtype=rng.choice([torch.float16, torch.bfloat16]))
        return co.linear(x, weights[(N, K, bits)], activation=rng.choice([None, "relu"]))

    def w8a8():
        N, K = rng.choice([(n, k) for n, k, b in weights if b == 8])
        x = torch.randn(rng.randint(1, 300), K, device="cuda", dtype=torch.float16)
        return co.linear_w8a8(x, weights[(N, K, 8)], path=rng.choice(["fused", "fused", "orchestrator"]))

    def gemm():
        N, K = rng.choice(list(Bs))
        A = torch.randint(-8, 8, (rng.randint(1, 2000), K), dtype=torch.int8, device="cuda")
        return co.int8_gemm(A, Bs[(N, K)])

    def conv():
        Ci = rng.choice(list(conv_w))
        x = torch.randn(rng.randint(1, 4), Ci, rng.randint(3, 40), rng.randint(3, 40), device="cuda",
                        dtype=torch.float16)
        return co.conv2d(x, conv_w[Ci], padding=1)

    def quant_a():
        return co.quantize_activation(torch.randn(rng.randint(1, 500), 512, device="cuda", dtype=torch.float16), 128)

    return {"linear": linear, "linear_w8a8": w8a8, "int8_gemm": gemm, "conv2d": conv, "quantize_activation": quant_a}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=0, help="sample period (default calls // 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("soak.py needs a GPU")
    rng = random.Random(args.seed)
    ops = make_ops(rng)
    names = list(ops)
    every = args.every or max(1, args.calls // 20)
    samples, counts, t0 = [], dict.fromkeys(names, 0), time.perf_counter()
    for i in range(1, args.calls + 1):
        name = rng.choice(names)
        ops[name]()
        counts[name] += 1
        if i % every == 0 or i == args.calls:
            torch.cuda.synchronize()
            samples.append({"calls": i, "alloc_mib": torch.cuda.memory_allocated() / 2 ** 20,
                            "reserved_mib": torch.cuda.memory_reserved() / 2 ** 20, "rss_mib": rss_mib(),
                            **cache_sizes()})
    seconds = time.perf_counter() - t0
    keys = list(dict.fromkeys(k for s in samples for k in s))
    half = samples[len(samples) // 2]
    last = samples[-1]
    growth = {k: last.get(k, 0) - half.get(k, 0) for k in keys if k != "calls"}
    # bounded: the second half adds no GPU memory beyond noise and < 32 MiB of host memory; every cache
    # stays under its documented cap (the CUTLASS per-shape tables fill up to theirs, then evict)
    from cutlass_ops.cutlass import kernel

    caps = {"cutlass_shapes": last.get("cutlass_plans", 0) * kernel._SHAPES_KEPT,
            "cutlass_params": last.get("cutlass_plans", 0) * kernel._REBUILT_TOTAL}
    flat = (growth["alloc_mib"] <= 1 and growth["reserved_mib"] <= 64 and growth["rss_mib"] < 32
            and all(last.get(k, 0) <= cap for k, cap in caps.items())
            and all(v <= 0 or k in ("alloc_mib", "reserved_mib", "rss_mib", *caps) for k, v in growth.items()))
    summary = (f"soak: {args.calls} calls in {seconds:.0f} s ({', '.join(f'{n} {c}' for n, c in counts.items())}); "
               f"second-half growth: " + ", ".join(f"{k} {v:+.1f}" if isinstance(v, float) else f"{k} {v:+d}"
                                                   for k, v in growth.items()) + f" -> {'BOUNDED' if flat else 'GROWING'}")
    rows = [[s.get(k, 0) for k in keys] for s in samples]
    write_report([summary, "", table(keys, rows)], out=args.out, bench="soak")
    print(summary)
    sys.exit(0 if flat else 1)


if __name__ == "__main__":
    main()
