#!/usr/bin/env python3
"""First-call latency of each op family in a fresh process with a warm kernel cache (a benchmark).

    python3 scripts/cold_start.py [--rounds 3] [--out PATH]   # -> scripts/results/<gpu>/cold_start.md

Per family, a new Python process imports torch, initializes CUDA (``torch.zeros(1, device="cuda")``),
builds its inputs, then times ``import cutlass_ops`` and the op's first call (``torch.cuda.synchronize()``
on both sides) and a second call. Before the timed rounds every family runs once, so the kernel cache
(``CUTLASS_OPS_CACHE_DIR`` or the user cache) holds what each needs: the rounds measure loading, not
compiling. fp16 ``F.linear`` is the yardstick: torch's own first call (cuBLAS initialization).
Reported: the median over ``--rounds`` fresh processes. The children keep their Python bytecode in a
temporary ``PYTHONPYCACHEPREFIX`` written by the cache-filling runs (``PYTHONDONTWRITEBYTECODE`` dropped),
as an installed package has it: on an image that sets ``PYTHONDONTWRITEBYTECODE=1`` every fresh process
recompiled the package's sources, 37-58 ms of a first call (cProfile, H200).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("fp16_linear", "linear_w4_m1", "linear_w4_m64", "linear_w8_m1", "int8_gemm", "int8_gemm_requant",
            "linear_w8a8_fused", "quantize_activation", "conv2d_w4", "conv2d_w8")
LIMIT_MS = 50.0

CHILD = r'''
import json, sys, time
import torch
fam = sys.argv[1]
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
import cutlass_ops as co
t_import = time.perf_counter() - t0
g = torch.Generator().manual_seed(0)
dev = "cuda"
if fam == "fp16_linear":
    w = torch.randn(4096, 4096, generator=g).half().to(dev); x = torch.randn(1, 4096, generator=g).half().to(dev)
    f = lambda: torch.nn.functional.linear(x, w)
elif fam.startswith("linear_w") and not fam.startswith("linear_w8a8"):
    bits, M = int(fam[8]), int(fam.split("_m")[1])
    qw = co.quantize_weight(torch.randn(4096, 4096, generator=g), bits=bits, block_size=128).to(dev)
    x = torch.randn(M, 4096, generator=g).half().to(dev)
    f = lambda: co.linear(x, qw)
elif fam.startswith("int8_gemm"):
    A = torch.randint(-128, 128, (32, 4096), dtype=torch.int8, generator=g).to(dev)
    B = torch.randint(-128, 128, (4096, 4096), dtype=torch.int8, generator=g).to(dev)
    sr, sc, b = torch.rand(32, generator=g).to(dev), torch.rand(4096, generator=g).to(dev), torch.rand(4096, generator=g).to(dev)
    if fam == "int8_gemm_requant":
        multiplier = sc * 1e-4  # outside the timed call: torch's own first elementwise kernel loads in ~9 ms
        f = lambda: co.int8_gemm_requant(A, B, multiplier, b)
    else:
        f = lambda: co.int8_gemm(A, B, "dequant", scale_row=sr, scale_col=sc, bias=b, out_dtype=torch.float16)
elif fam == "linear_w8a8_fused":
    qw = co.quantize_weight(torch.randn(4096, 4096, generator=g), bits=8, block_size=128).to(dev)
    x = torch.randn(32, 4096, generator=g).half().to(dev)
    f = lambda: co.linear_w8a8(x, qw, path="fused")
elif fam == "quantize_activation":
    x = torch.randn(32, 4096, generator=g).half().to(dev)
    f = lambda: co.quantize_activation(x, 128)
else:
    bits = int(fam[-1])
    qw = co.quantize_conv_weight(torch.randn(64, 64, 3, 3, generator=g), bits=bits, block_size=64).to(dev)
    x = torch.randn(1, 64, 56, 56, generator=g).half().to(dev)
    f = lambda: co.conv2d(x, qw, padding=1)
torch.cuda.synchronize()
profile = sys.argv[2] if len(sys.argv) > 2 else ""
if profile:  # cProfile of the first call only (its times then include the profiler's own cost)
    import cProfile, io, pstats
    prof = cProfile.Profile(); prof.enable()
t1 = time.perf_counter(); f(); torch.cuda.synchronize(); first = time.perf_counter() - t1
if profile:
    prof.disable(); text = io.StringIO()
    stats = pstats.Stats(prof, stream=text); stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)
    with open(profile, "w") as fh: fh.write(f"{fam}: first call {1e3 * first:.1f} ms (profiled)\n" + text.getvalue())
t2 = time.perf_counter(); f(); torch.cuda.synchronize(); second = time.perf_counter() - t2
print(json.dumps({"import_ms": 1e3 * t_import, "first_ms": 1e3 * first, "second_ms": 1e3 * second}))
'''


def run_child(family: str, pycache: str, profile: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONPYCACHEPREFIX": pycache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the bytecode an installed package has, outside the source tree
    argv = [sys.executable, "-c", CHILD, family] + ([str(profile)] if profile else [])
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{family}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="after the timed rounds, one more fresh process per family with cProfile around its "
                             "first call, written to DIR/<family>.txt (for finding where the first call goes)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "scripts"))
    from _timing import table, write_report

    with tempfile.TemporaryDirectory(prefix="cold_start_pyc_") as pycache:
        for family in args.families:  # fill the kernel and bytecode caches: the rounds measure loading only
            run_child(family, pycache)
        results = {family: [] for family in args.families}
        for _ in range(args.rounds):  # interleaved: a slow moment of the host hits every family alike
            for family in args.families:
                results[family].append(run_child(family, pycache))
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            for family in args.families:
                run_child(family, pycache, args.profile / f"{family}.txt")
    rows = []
    for family, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("import_ms", "first_ms", "second_ms")}
        mark = "" if family == "fp16_linear" or med["first_ms"] <= LIMIT_MS else " !"
        rows.append([family, med["import_ms"], f"{med['first_ms']:.1f}{mark}", f"{med['second_ms']:.2f}"])
    lines = ["# First call per op family in a fresh process, warm kernel cache", "",
             f"Median of {args.rounds} fresh processes per family (interleaved). After `torch.zeros(1, device='cuda')`: "
             "`import cutlass_ops`, then the op's first call and a second call, each between "
             f"`torch.cuda.synchronize()`s. N = K = 4096 weights (conv: 64 -> 64, 3x3, 1 x 64 x 56 x 56). "
             f"'!' marks a first call over {LIMIT_MS:.0f} ms. `fp16_linear` is torch's own first `F.linear` (cuBLAS "
             "initialization), for scale. Python bytecode cached (as installed), kernels cached.", "",
             table(["family", "import ms", "first call ms", "second call ms"], rows)]
    write_report(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
