#!/usr/bin/env python3
"""Tune the weight-only dispatch on this GPU: time gemv_mma / gemm_small_m variants per (weight shape, bits, M)
and store the fastest as the "weight_only" section of cutlass_ops/tuning/<gpu>.json (issue 23).

The rule-based dispatch (``weight_only.dispatch``, ``variants.default_*_config``) was measured on a few shapes;
this times the candidates on every Llama weight shape of ``bench_llm_shapes.SHAPES`` (``--shapes`` picks some,
as there), W4 and W8 (``--bits``), asymmetric minmax, block 128, float16 activations, M = 1, 2, 4, 8, 16, 32, 64
(``--M``). Candidates per M: gemv_mma with the variants of ``GEMV_MMA_CONFIGS`` and, from M = 8, gemm_small_m
with those of ``GEMM_SMALL_M_CONFIGS``; the rule-based choice (its variant for this shape and GPU) is always
timed too, as the baseline. Each one's
output is first compared with gemv_mma's default variant (max |diff| <= 1% of max |y|): a candidate that
disagrees, or fails to build, is reported and skipped. The choice per (shape, bits, M) is the fastest, unless it
beats the rule-based choice by less than ``--min-gain`` (default 2%: within the noise, keep the rule's variant).

Device us per call from CUDA graphs (``bench_llm_shapes.rotated_us``: >= 60 calls per graph, median of 10
replays), rotating over enough weight and x copies to read >= 3x L2. Every variant is compiled first in parallel
processes (NVRTC, into the kernel cache), so the timed loop compiles nothing. All 18 shapes with the 28 candidates
(16 gemv_mma, 4 gemm_small_m, 8 gemm_wgmma) took 216 s on an H200 (twenty-sixth session; 83 s on an H100 with 10);
``--quick``: the 8B shapes at M = 1, 4, 16, 64.

JSON (``--write-json``, off by default; ``--write-json PATH`` writes elsewhere): each measured M stands for the
M values above the previous measured one (M = 16 for 9..16: the same kernel entry, gemv_mma_mt2), consecutive
M with the same choice merge into one ``"M": [lo, hi]`` range, and the entries of the tuned shapes replace
those of the same shapes in the file; other shapes' entries and the file's other sections (int8 GEMM tiles)
are kept. ``cutlass_ops.weight_only.tuned`` documents and checks the format (checked before writing).

``--dtype bf16`` times bf16 activations instead, each against what the file gives bf16 now (its entry for both types,
else the rules), and writes ``"dtype": "bf16"`` entries only where another variant wins (report
``tune_weight_only_bf16.md``); the dispatch takes them for bf16 before the type-less ones.

    python3 scripts/tune_weight_only.py [--quick] [--shapes 8B 70B/down 4096x14336] [--M 1 16] [--bits 4] [--dtype bf16]
        [--min-gain 0.02] [--jobs 16] [--write-json [PATH]] [--out PATH]
        # report: scripts/results/<gpu>/tune_weight_only.md (rewritten after each shape)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import io
import json
import logging
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from _timing import git_commit, gpu_slug, table, write_report
from bench_llm_shapes import GROUP, M_VALUES, SHAPES, name, rotated_us, selected, weight_copies

from cutlass_ops.weight_only import tuned
from cutlass_ops.weight_only.variants import (
    GemmSmallMConfig, GemmWgmmaConfig, GemvMmaConfig, default_gemm_small_m_config, default_gemm_wgmma_config,
    default_gemv_mma_config,
)

log = logging.getLogger("tune_weight_only")

BENCH = "tune_weight_only"
# --dtype: fp16 (default) writes entries without a "dtype" (they apply to bf16 too: the same kernels); bf16 times bf16
# activations against what the file gives bf16 now (its type-less entry, else the rules) and writes "dtype": "bf16"
# entries only where another variant wins by MIN_GAIN. The names are the tuning file's (tuned.DTYPE_NAMES).
# gemv_mma variants (scripts/sweep_gemv.py found these the fastest at small M): the class default; the M <= 4
# rule's (variants.default_gemv_mma_config); it with 8 warps splitting K; one 16-row tile with 4 trips and 2
# blocks per SM, with 4 or 8 warps (8: the fastest at M = 1 on 4096 x 4096 and 3072 x 3072 W4, H100); the
# class default without splitting K.
_GEMV_MMA_SHAPES = (GemvMmaConfig(), GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=4),
                    GemvMmaConfig(row_tiles=1, unroll=8, min_blocks=1, warps=8),
                    GemvMmaConfig(row_tiles=1, unroll=4, min_blocks=2, warps=4),
                    GemvMmaConfig(row_tiles=1, unroll=4, min_blocks=2, warps=8, splits=1),
                    GemvMmaConfig(row_tiles=2, unroll=4, min_blocks=2, warps=8, splits=1))
# Each of them with and without the unmasked full-batch loop, and two accumulator sets on the four that won
# somewhere on the Llama-3-8B weights (H200, M = 1 and 16, all 24 combinations of these loop options timed).
GEMV_MMA_CONFIGS = (*_GEMV_MMA_SHAPES, *(dataclasses.replace(c, full_batches=1) for c in _GEMV_MMA_SHAPES),
                    *(dataclasses.replace(c, chains=2, full_batches=f) for c, f in (
                        (_GEMV_MMA_SHAPES[1], 0), (_GEMV_MMA_SHAPES[1], 1), (_GEMV_MMA_SHAPES[4], 1),
                        (_GEMV_MMA_SHAPES[3], 1))))
# Three shapes for M = 9..64 (candidates from GEMV_MMA_WIDE_FROM_M), whose mt2 / mt4 entries spill at r2u4 with
# two blocks per SM (100-500 bytes): two trips in flight (r2u2, no spill at 128 registers), or one block per SM
# (r2u4, r4u2; 150-200 registers). On the H200 they took 5-12% off the best of the others at M = 16 on several 8B
# weights (8B/o W4 7.7 -> 6.8 us, gate W8 23.6 -> 21.4) and up to 21% at M = 32 for int8. Not below: tuned in fp16
# at M <= 8, r2u4 with one block won on some weights where the bf16 build (more registers) ran 1.3-1.6x slower.
GEMV_MMA_WIDE_FROM_M = 9
_GEMV_MMA_WIDE_M = (GemvMmaConfig(row_tiles=2, unroll=2, min_blocks=2, warps=8, splits=1, full_batches=1),
                    GemvMmaConfig(row_tiles=2, unroll=4, min_blocks=1, warps=8, splits=1, full_batches=1),
                    GemvMmaConfig(row_tiles=4, unroll=2, min_blocks=1, warps=8, splits=1, full_batches=1))
# Four 16-row tiles, one trip in flight, two blocks per SM (128 registers), for M = 9..16 only (mt4 ignores min_blocks:
# 217 registers, one block). Why: at M = 16 a lane issues 8 16-byte activation loads per trip, two per weight load
# at 2 row tiles and one at 4, and that count, not where the loads hit, sets the W4 time (design.md section 10). On
# the H200 (fp16 W4, M = 16) they took the wide weights well below the best of the others: 8B gate_up 38.2 -> 29.2 us,
# gate 20.7 -> 16.8, qkv-12288 19.0 -> 16.6, 70B gate_up 123.0 -> 110.0; narrow N keeps r2u4 (8B o, down).
GEMV_MMA_R4U1_TO_M = 16
_GEMV_MMA_R4U1 = (GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=8, splits=1, full_batches=1),
                  GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=8, full_batches=1),
                  GemvMmaConfig(row_tiles=4, unroll=1, min_blocks=2, warps=4, full_batches=1))
# gemm_small_m variants (of sweep_gemv.small_m_configs, the ones fastest somewhere in
# scripts/results/nvidia-h100/sweep_small_m.md): the default, the rule's 2 stages (r2w8s2), 4 row tiles x 4
# warps (wide N at M <= 32), 4 warps (long K at small M).
GEMM_SMALL_M_CONFIGS = (GemmSmallMConfig(), GemmSmallMConfig(stages=2), GemmSmallMConfig(row_tiles=4, warps=4),
                        GemmSmallMConfig(warps=4))
GEMM_SMALL_M_FROM_M = 8  # below it gemm_small_m's shared activation tile buys nothing (sweep_small_m.md)
# gemm_wgmma variants (sm_90 only, from M = 16): the default's two forms (3 stages and 2 blocks per SM; 4 stages and
# 1 block), 4 stages with 2 blocks, and 4 warpgroups per block (256 rows of N share one staged activation tile)
# with 3 and 4 stages; and the 2-warpgroup forms with their K splits summed in a cluster (GemmWgmmaConfig.cluster:
# 0.90-0.97x the workspace form's time where N gives 2 splits or a small grid; with its splits lowered to one wave
# of clusters, 1.00-1.24x where N gives 32-64 blocks of rows; design.md section 4).
GEMM_WGMMA_CONFIGS = (GemmWgmmaConfig(stages=3, min_blocks=2), GemmWgmmaConfig(), GemmWgmmaConfig(min_blocks=2),
                      GemmWgmmaConfig(warpgroups=4, stages=3), GemmWgmmaConfig(warpgroups=4),
                      GemmWgmmaConfig(stages=3, min_blocks=2, cluster=1), GemmWgmmaConfig(cluster=1),
                      GemmWgmmaConfig(min_blocks=2, cluster=1))
GEMM_WGMMA_FROM_M = 16
QUICK_M = (1, 4, 16, 64)
MAX_M = 64  # both strategies take M <= 64
MIN_GAIN = 0.02


class Candidate(NamedTuple):
    """One timed choice: a strategy and its kernel variant."""

    strategy: str
    config: object

    @property
    def label(self) -> str:
        c = self.config
        if self.strategy == "gemv_mma":
            return (f"gemv_mma r{c.row_tiles}u{c.unroll}b{c.min_blocks}w{c.warps}" + (f"k{c.splits}" if c.splits else "")
                    + (f"c{c.chains}" if c.chains != 1 else "") + ("f" if c.full_batches else ""))
        if self.strategy == "gemm_wgmma":
            return (f"gemm_wgmma g{c.warpgroups}s{c.stages}p{c.prefetch}b{c.min_blocks}" + ("o" if c.overlap else "")
                    + ("c" if c.cluster else "") + (f"k{c.splits}" if c.splits else ""))
        return f"gemm_small_m r{c.row_tiles}w{c.warps}s{c.stages}" + (f"k{c.splits}" if c.splits else "")


def candidates(M: int, cc: int = 80) -> list[Candidate]:
    """The candidates timed at M rows on sm_``cc``, the reference (gemv_mma's default variant) first."""
    gemv = (*GEMV_MMA_CONFIGS, *(_GEMV_MMA_WIDE_M if M >= GEMV_MMA_WIDE_FROM_M else ()),
            *(_GEMV_MMA_R4U1 if GEMV_MMA_WIDE_FROM_M <= M <= GEMV_MMA_R4U1_TO_M else ()))
    found = [Candidate("gemv_mma", c) for c in gemv]
    if M >= GEMM_SMALL_M_FROM_M:
        found += [Candidate("gemm_small_m", c) for c in GEMM_SMALL_M_CONFIGS if M <= c.max_m]
    if cc == 90 and M >= GEMM_WGMMA_FROM_M:
        found += [Candidate("gemm_wgmma", c) for c in GEMM_WGMMA_CONFIGS]
    return found


def rule_candidate(strategy: str, M: int, bits: int, N: int, K: int, sm_count: int) -> Candidate | None:
    """The rule-based dispatch's choice as a candidate (the variant its plan builds: gemv_mma's variant, warps and K
    splits depend on N, K and the SM count), None for another strategy."""
    if strategy == "gemv_mma":
        return Candidate(strategy, default_gemv_mma_config(M, bits, N, K, sm_count))
    if strategy == "gemm_small_m":
        return Candidate(strategy, default_gemm_small_m_config(M, bits))
    if strategy == "gemm_wgmma":
        return Candidate(strategy, default_gemm_wgmma_config(M, bits))
    return None


def pick(times: dict[Candidate, float], rule: Candidate | None, min_gain: float) -> Candidate | None:
    """The fastest candidate, or the rule's where that one was timed and the fastest beats it by < min_gain."""
    if not times:
        return None
    best = min(times, key=times.get)
    if rule in times and times[best] > times[rule] * (1 - min_gain):
        return rule
    return best


def covered_ranges(m_values) -> list[tuple[int, int]]:
    """[lo, hi] that each measured M stands for: the M values above the previous measured one (from 1)."""
    ms = sorted(set(m_values))
    return [(prev + 1, M) for prev, M in zip([0] + ms[:-1], ms)]


def merge_ranges(choices: list[tuple[int, int, Candidate]]) -> list[tuple[int, int, Candidate]]:
    """Adjacent (lo, hi, choice) with the same choice as one range."""
    merged: list[tuple[int, int, Candidate]] = []
    for lo, hi, choice in sorted(choices, key=lambda c: c[0]):
        if merged and merged[-1][2] == choice and merged[-1][1] + 1 == lo:
            merged[-1] = (merged[-1][0], hi, choice)
        else:
            merged.append((lo, hi, choice))
    return merged


def shape_entries(N: int, K: int, bits: int, block_size: int, picks: dict[int, Candidate], dtype: str | None = None,
                  baselines: dict[int, Candidate] | None = None) -> list[dict]:
    """The JSON entries of one weight from its choice per measured M; ``dtype`` ("bf16") marks them as that type's, and
    the ranges whose choice is the baseline's (what the file already gives that type) are left out."""
    ranges = covered_ranges(picks)
    chosen = [(lo, hi, picks[hi]) for lo, hi in ranges if not baselines or baselines.get(hi) != picks[hi]]
    return [{"N": N, "K": K, "bits": bits, "block_size": block_size, "M": [lo, hi], "strategy": c.strategy,
             "config": tuned.config_json(c.config), **({"dtype": dtype} if dtype else {})}
            for lo, hi, c in merge_ranges(chosen)]


def merged_section(old: dict | None, entries: list[dict], source: str, cc: int,
                   tuned_shapes: set | None = None) -> tuple[dict, int]:
    """(the new "weight_only" section, entries kept from ``old``): ``entries`` replace those of the same weight
    shapes in ``old`` for the same activation type ("dtype", absent: both); the others are kept. ``tuned_shapes``: the
    weight shapes (and type) that were tuned, with or without entries (a bf16 run that found nothing better than
    the type-less entries still removes the shape's old bf16 entries)."""
    key = lambda e: (e["N"], e["K"], e["bits"], e["block_size"], e.get("dtype"))  # noqa: E731
    tuned_shapes = {key(e) for e in entries} | set(tuned_shapes or ())
    kept = [e for e in (old or {}).get("entries", []) if isinstance(e, dict) and key(e) not in tuned_shapes]
    every = sorted(kept + entries, key=lambda e: (*key(e)[:4], e.get("dtype") or "", e["M"][0]))
    return {"_source": source, "compute_capability": cc, "entries": every}, len(kept)


def json_text(data: dict) -> str:
    """The tuning file's text: json indent 2 (as the int8 tuner writes it), one weight_only entry per line."""
    section = data.get(tuned.SECTION)
    if not isinstance(section, dict) or not section.get("entries"):
        return json.dumps(data, indent=2) + "\n"
    marks = {f"@entry {i}@": json.dumps(e) for i, e in enumerate(section["entries"])}
    text = json.dumps({**data, tuned.SECTION: {**section, "entries": list(marks)}}, indent=2)
    for mark, line in marks.items():
        text = text.replace(json.dumps(mark), line)
    return text + "\n"


def write_json(path: Path, entries: list[dict], source: str, cc: int, tuned_shapes: set | None = None) -> None:
    """Merge ``entries`` into the file's section (other sections kept), check it as the dispatch will, write."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    section, kept = merged_section(data.get(tuned.SECTION), entries, source, cc, tuned_shapes)
    if kept:
        section["_source"] += f"; {kept} entries of shapes not tuned in this run kept from earlier runs"
    tuned.parse_section(section, str(path))  # raises before anything is written
    path.write_text(json_text({**data, tuned.SECTION: section}))
    tuned.table.cache_clear()
    log.info("wrote %d weight_only entries (%d kept) to %s", len(section["entries"]), kept, path)
    shape = lambda e: (e["N"], e["K"], e["bits"], e["block_size"])  # noqa: E731
    retuned = {shape(e) for e in entries if not e.get("dtype")} | {s[:4] for s in tuned_shapes or () if s[4] is None}
    stale = sum(1 for e in section["entries"] if e.get("dtype") and shape(e) in retuned)
    if stale:  # typed entries won against the type-less ones just replaced
        log.warning("%d typed (bf16) entries of the shapes re-tuned here were measured against their old entries: "
                    "run again with --dtype bf16", stale)


# ---------------------------------------------------------------------------------------------
# GPU part
# ---------------------------------------------------------------------------------------------

def _compile(job) -> str:
    from custom_kernels.nvrtc import compile_file

    filename, defines, arch = job
    compile_file(filename, arch, defines=dict(defines))
    return f"{filename} {dict(defines)}"


def precompile(bits_list, m_values, cc: int, arch: str, jobs: int, dtype: torch.dtype = torch.float16) -> None:
    """Every module the candidates (and the rule's variants) load, compiled in ``jobs`` processes."""
    from cutlass_ops.weight_only import plan_class

    modules = set()
    for bits in bits_list:
        for M in m_values:
            uses = [plan_class(c.strategy, cc).kernels(M, dtype, bits, c.config) for c in candidates(M, cc)]
            uses += [plan_class(s, cc).kernels(M, dtype, bits) for s in ("gemv_mma", "gemm_small_m")]  # the rules'
            for source, _kernel, defines in (use for kernels in uses for use in kernels):
                modules.add((source, tuple(sorted(defines.items()))))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        for done in pool.map(_compile, [(f, d, arch) for f, d in sorted(modules)]):
            log.debug("compiled %s", done)
    log.info("compiled %d modules for sm_%s in %.1f s", len(modules), arch, time.perf_counter() - t0)


class Row(NamedTuple):
    shape: str
    N: int
    K: int
    bits: int
    M: int
    rule: Candidate | None
    times: dict
    chosen: Candidate | None
    notes: list


def tune_weight(shape, bits: int, args, l2: int, cc: int, device: int) -> list[Row]:
    """Time every candidate of one weight at each M; the rows of the report (choices included)."""
    from custom_kernels.device import sm_count
    from cutlass_ops.weight_only import choose_strategy, get_plan

    _, _, N, K = shape
    sms = sm_count(device)
    dtype = tuned.DTYPE_NAMES[args.dtype]
    # bf16: the baseline is what the file gives bf16 now (its type-less entry for the shape and M), else the rules
    current = tuned.table(torch.cuda.get_device_name(device)) if args.typed else None
    t0 = time.perf_counter()
    master = torch.randn(N, K, device="cuda", dtype=torch.float16).mul_(0.02)
    qws = weight_copies(master, bits, l2)
    del master
    rows = []
    for M in args.M:
        t1 = time.perf_counter()
        xs = [torch.randn(M, K, device="cuda", dtype=dtype) for _ in qws]
        outs = [torch.empty(M, N, device="cuda", dtype=dtype) for _ in qws]
        rule = rule_candidate(choose_strategy(M, dtype, qws[0], cc), M, bits, N, K, sms)
        entry = current.lookup(M, N, K, bits, GROUP) if current is not None else None
        if entry is not None:
            rule = Candidate(entry.strategy, entry.config)
        todo = candidates(M, cc) + ([rule] if rule is not None and rule not in candidates(M, cc) else [])
        ref, tol, times, notes = None, None, {}, []
        for cand in todo:
            try:
                plans = [get_plan(q, M, dtype, device, strategy=cand.strategy, config=cand.config) for q in qws]
                call = lambda i, plans=plans: plans[i](xs[i], 0, 0, outs[i])  # noqa: E731
                call(0)
                torch.cuda.synchronize()
            except (ValueError, RuntimeError, TypeError) as exc:  # a variant that cannot run here is skipped
                notes.append(f"{cand.label}: failed ({type(exc).__name__})")
                log.warning("%s W%d M=%d %s failed: %s", name(shape), bits, M, cand.label, exc)
                continue
            got = outs[0].float()
            if ref is None:  # gemv_mma's default variant (the first candidate)
                ref, tol = got.clone(), 1e-2 * got.abs().max().item() + 1e-6
            err = (got - ref).abs().max().item()
            if not err <= tol:
                notes.append(f"{cand.label}: MISMATCH {err:.3g} > {tol:.3g}")
                log.warning("%s W%d M=%d %s: max |diff| %.3g > %.3g, skipped", name(shape), bits, M, cand.label,
                            err, tol)
                continue
            times[cand] = rotated_us(call, len(qws))
        chosen = pick(times, rule, args.min_gain)
        rows.append(Row(name(shape), N, K, bits, M, rule, times, chosen, notes))
        log.info("  %s W%d M=%d: rule %s %s, chosen %s %.1f us (%d timed) [%.2f s]", name(shape), bits, M,
                 rule.label if rule else "-", f"{times[rule]:.1f} us" if rule in times else "-",
                 chosen.label if chosen else "-", times.get(chosen, math.nan), len(times), time.perf_counter() - t1)
    log.info("%s W%d %dx%d done in %.1f s (%d weight copies)", name(shape), bits, N, K, time.perf_counter() - t0,
             len(qws))
    return rows


def report(rows: list[Row], args, gpu: str, json_path: Path | None, failed: list[str]) -> list[str]:
    """The markdown lines: what was timed, one row per (shape, bits, M), a summary."""
    body, gains = [], []
    for r in rows:
        rule_us = r.times.get(r.rule)
        best = min(r.times, key=r.times.get) if r.times else None
        chosen_us = r.times.get(r.chosen)
        gain = rule_us / chosen_us if rule_us and chosen_us else None
        gains += [gain] if gain else []
        body.append([r.shape, f"{r.N} x {r.K}", f"W{r.bits}", r.M, r.rule.label if r.rule else "-",
                     f"{rule_us:.1f}" if rule_us else "-", best.label if best else "-",
                     f"{r.times[best]:.1f}" if best else "-", r.chosen.label if r.chosen else "-",
                     f"{gain:.2f}x" if gain else "-", "; ".join(r.notes) or ""])
    header = ["shape", "N x K", "bits", "M", "rule-based choice", "rule us", "fastest", "fastest us", "chosen",
              "rule / chosen", "notes"]
    changed = sum(1 for r in rows if r.chosen is not None and r.chosen != r.rule)
    geo = math.exp(sum(map(math.log, gains)) / len(gains)) if gains else math.nan
    lines = [f"# Weight-only dispatch tuning, {gpu}", "",
             f"{args.dtype} activations, asymmetric minmax, block {GROUP}. Device us per call: CUDA graphs of >= 60 "
             "calls rotating over >= 3x L2 of weight and x copies (median of 10 replays). Candidates: gemv_mma "
             "r<row tiles>u<unroll>b<min blocks>w<warps>[k<K splits>][c<accumulator sets>][f: full batches], and from "
             f"M = {GEMM_SMALL_M_FROM_M} gemm_small_m r<row tiles>w<warps>s<stages>, and on sm_90 from M = "
             f"{GEMM_WGMMA_FROM_M} gemm_wgmma g<warpgroups>s<stages>p<prefetch>b<min blocks>[o: overlap][c: K splits "
             "summed in a cluster]; each checked against gemv_mma's "
             "default variant (max |diff| <= 1% of max |y|) before it is timed. rule-based: what dispatch.py and "
             "variants.default_*_config pick (`CUTLASS_OPS_TUNED=0`)" + (
                 "; with --dtype bf16 the file's entry for both types where it has one (what bf16 ran before)"
                 if args.typed else "") + ". chosen: the fastest, unless it beats the rule "
             f"by less than {args.min_gain:.0%} (then the rule's). rule / chosen: the speed-up the tuned entry gives.",
             "", table(header, body), "",
             f"- {len(rows)} (shape, bits, M) timed; the tuned choice differs from the rule-based one in {changed}; "
             f"geometric mean rule / chosen {geo:.3f}x.",
             f"- JSON: {'written to ' + str(json_path) if json_path else 'not written (pass --write-json)'}."]
    lines += [f"- failed: {f}" for f in failed]
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"the 8B shapes at M = {' '.join(map(str, QUICK_M))} (the filters below still apply)")
    p.add_argument("--shapes", nargs="+", metavar="S",
                   help="names (8B/qkv), models (70B), layers (down) or NxK (4096x14336); default all")
    p.add_argument("--M", type=int, nargs="+", help=f"default {' '.join(map(str, M_VALUES))}")
    p.add_argument("--bits", type=int, nargs="+", choices=(4, 8), default=[4, 8], help="default 4 8")
    p.add_argument("--dtype", choices=sorted(tuned.DTYPE_NAMES), default="fp16",
                   help="activations timed (default fp16: entries for both types; bf16: bf16 entries where bf16 "
                        "prefers another variant than the file's; report tune_weight_only_bf16.md)")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN,
                   help=f"keep the rule-based choice unless the fastest beats it by this fraction (default {MIN_GAIN})")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile processes")
    p.add_argument("--write-json", nargs="?", const="", default=None, metavar="PATH",
                   help="write the choices into cutlass_ops/tuning/<gpu>.json (or PATH)")
    p.add_argument("--out", type=Path, help=f"report; default scripts/results/<gpu>/{BENCH}.md")
    args = p.parse_args(argv)
    args.M = sorted(set(args.M or (QUICK_M if args.quick else M_VALUES)))
    if not all(1 <= M <= MAX_M for M in args.M):
        p.error(f"--M values must be in 1..{MAX_M}, got {args.M}")
    if not 0 <= args.min_gain < 1:
        p.error(f"--min-gain must be in [0, 1), got {args.min_gain}")
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    args.bits = sorted(set(args.bits))
    args.typed = None if args.dtype == "fp16" else args.dtype  # the "dtype" of the entries written (fp16: none)
    return args


def selected_shapes(args) -> list[tuple]:
    shapes = [s for s in SHAPES if s[0] == "8B"] if args.quick else list(SHAPES)
    return [s for s in shapes if selected(s, args.shapes)] if args.shapes else shapes


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(relativeCreated)8.0f ms %(message)s")
    shapes = selected_shapes(args)
    if not shapes:
        log.error("--shapes selects none of %s", ", ".join(name(s) for s in SHAPES))
        return 2
    if not torch.cuda.is_available():
        log.error("needs a CUDA GPU")
        return 1
    from custom_kernels.device import target_arch

    os.environ[tuned.ENV_SWITCH] = "0"  # the baseline is the rule-based dispatch, whatever the file holds now
    start = time.perf_counter()
    device = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(device)
    cc, gpu = 10 * major + minor, torch.cuda.get_device_name(device)
    if cc < 80:
        log.error("gemv_mma and gemm_small_m need sm_80+, this GPU is sm_%d", cc)
        return 1
    json_path = None if args.write_json is None else Path(args.write_json or tuned.tuning_file(gpu))
    precompile(args.bits, args.M, cc, target_arch(device), args.jobs, tuned.DTYPE_NAMES[args.dtype])
    bench = f"{BENCH}_{args.typed}" if args.typed else BENCH
    torch.manual_seed(0)
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    log.info("%s (sm_%d), L2 %.0f MiB: %d shapes x W%s x M %s", gpu, cc, l2 / 2**20, len(shapes), args.bits, args.M)
    rows, failed, picks = [], [], {}
    with torch.inference_mode():
        for k, shape in enumerate(shapes):
            for bits in args.bits:
                try:
                    rows += tune_weight(shape, bits, args, l2, cc, device)
                except Exception as exc:  # report what was measured and go on with the next weight
                    log.exception("%s W%d failed", name(shape), bits)
                    failed.append(f"{name(shape)} W{bits}: {type(exc).__name__}: "
                                  f"{(str(exc).splitlines() or [''])[0][:120]}")
                gc.collect()
                torch.cuda.empty_cache()
            # a run cut short keeps its table and the JSON of the shapes it finished
            picks, baselines = _picks(rows), _picks(rows, "rule")
            entries = [e for shape_key, chosen in picks.items()
                       for e in shape_entries(*shape_key, GROUP, chosen, args.typed,
                                              baselines[shape_key] if args.typed else None)]
            if json_path is not None and picks:
                source = (f"scripts/tune_weight_only.py {' '.join(sys.argv[1:])} on {gpu} (sm_{cc}), "
                          f"{dt.date.today().isoformat()}, commit {git_commit()}; table in "
                          f"scripts/results/{gpu_slug(gpu)}/{bench}.md")
                write_json(json_path, entries, source, cc, {(*key, GROUP, args.typed) for key in picks})
            if k < len(shapes) - 1:  # only the last write of the report says where
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    write_report(report(rows, args, gpu, None, failed), args.out, bench)
    measured = bool(picks)  # the last shape's _picks covers every row
    if json_path is not None and not measured:
        log.error("nothing measured: %s not written", json_path)
    with contextlib.redirect_stdout(io.StringIO()):  # write_report names the file on stderr
        write_report(report(rows, args, gpu, json_path if measured else None, failed), args.out, bench)
    log.info("done: %d shapes in %.0f s%s", len(shapes), time.perf_counter() - start,
             f", {len(failed)} failed" if failed else "")
    return 1 if failed else 0


def _picks(rows: list[Row], field: str = "chosen") -> dict[tuple[int, int, int], dict[int, Candidate]]:
    """(N, K, bits) -> {M: the row's ``field``} (its chosen candidate, or "rule": its baseline) over the rows that
    have a choice."""
    picks: dict[tuple[int, int, int], dict[int, Candidate]] = {}
    for r in rows:
        if r.chosen is not None:
            picks.setdefault((r.N, r.K, r.bits), {})[r.M] = getattr(r, field)
    return picks


if __name__ == "__main__":
    raise SystemExit(main())
