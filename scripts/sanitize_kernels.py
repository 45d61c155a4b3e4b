#!/usr/bin/env python3
"""Launch every raw NVRTC kernel of the project once, at ragged shapes, for compute-sanitizer.

Each case builds small inputs, calls the project's own entry point (the ``cutlass_ops`` API or the
family entry points (``cutlass_ops.weight_only``, ``.conv``, ``.w8a8``), with the knobs the GPU
tests use to force a strategy or a kernel variant: ``strategy=``, ``config=``, ``split_k=``, ``weight_only.SMALL_M_GEMV``,
``cutlass_ops.w8a8`` tile choice) and synchronizes, so a sanitizer report comes out just above the
line of the case that caused it. It prints ``OK <case>`` (or ``FAIL`` / ``SKIP``) per case and a
summary, and exits 1 if a case raised. No CUTLASS kernel is built or launched (``int8_gemm``, and the
W8A8 "orchestrator" and "literal" paths, which run CUTLASS GEMMs, are left out); the fused scheme-2
kernel is NVRTC and is in. All 102 ``extern "C" __global__`` kernels of custom_kernels/kernels/*.cu
are reached (``--check-coverage``).

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
        --kernel-name kns=gemm_small_m \
        --kernel-name kns=conv_ --kernel-name kns=splitk_reduce --kernel-name kns=gather_k --kernel-name kns=dequant_ \
        --kernel-name kns=quantize_q8_1 --kernel-name kns=test_int --kernel-name kns=test_uint \
        --kernel-name kns=quant_a_ --kernel-name kns=precompute_sum_bq --kernel-name kns=precompute_bvec --kernel-name kns=bias_act_ \
        --kernel-name kns=w8a8_kblock_gemm --kernel-name kns=w8a8_kblock_wgmma --kernel-name kns=w8a8_row_planes \
        --kernel-name kns=quantize_weight_ --kernel-name kns=quant_token_ \
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
import functools
import math
import os
import re
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DIR = ROOT / "custom_kernels" / "kernels"

# Before torch initializes CUDA: one cudaMalloc per tensor, so memcheck sees each tensor's bounds.
if "--caching-allocator" not in sys.argv:
    os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import torch  # noqa: E402

# ---------------------------------------------------------------------------------------------
# case table
# ---------------------------------------------------------------------------------------------

FAMILIES = ("gemv_mma", "gemv_stream", "gemv_simt", "gemm_mma", "gemm_simt", "gemm_small_m", "dequant_weight",
            "gemv_dp4a",
            "converters_test",
            "conv", "quant_a", "scheme2_epilogue", "w8a8_kblock_fused", "w8a8_kblock_wgmma", "quantize_weight",
            "quant_token")
ALIASES = {"gemv": ("gemv_mma", "gemv_stream", "gemv_simt"), "gemm": ("gemm_mma", "gemm_simt", "gemm_small_m"),
           "dequant": "dequant_weight",
           "dp4a": "gemv_dp4a", "converters": "converters_test",
           "quant": "quant_a", "scheme2": "scheme2_epilogue", "w8a8": "w8a8_kblock_fused",
           "wgmma": "w8a8_kblock_wgmma"}

# Substrings (compute-sanitizer kns= filters) that together match every project kernel and, as far
# as we know, no torch / cuBLAS kernel; --check-coverage checks the first half of that claim.
SANITIZER_PREFIXES = ("gemv_", "gemm_mma_mt", "gemm_simt", "gemm_small_m", "conv_", "splitk_reduce", "gather_k", "dequant_", "quantize_q8_1",
                      "test_int", "test_uint", "quant_a_", "precompute_sum_bq", "precompute_bvec", "bias_act_", "w8a8_kblock_gemm",
                      "w8a8_kblock_wgmma", "w8a8_row_planes", "quantize_weight_",
                      "quant_token_")

# Kernels no case can reach, with the reason (checked by --check-coverage). Empty: all are reached.
UNREACHABLE: dict[str, str] = {}


@dataclass(frozen=True)
class KernelRef:
    """One kernel a case launches: source file, extern "C" name and the NVRTC defines of its module."""

    file: str
    name: str
    defines: tuple[tuple[str, int], ...] = ()


@dataclass
class Case:
    name: str
    family: str
    refs: tuple[KernelRef, ...]
    fn: Callable[[], object]
    min_cc: int = 0  # compute capability the path needs (e.g. 80 for mma.sync)
    note: str = ""
    optional: bool = False  # only with --tunables (kernel variants of tuning knobs: extra NVRTC modules)
    selftest: bool = False  # only with --plant-oob (a deliberate out-of-bounds write)

    @property
    def kernels(self) -> list[str]:
        return sorted({r.name for r in self.refs})


CASES: list[Case] = []


def _add(name: str, family: str, refs, fn, min_cc: int = 0, note: str = "", optional: bool = False,
         selftest: bool = False) -> None:
    assert family in FAMILIES, family
    assert all(c.name != name for c in CASES), f"duplicate case {name}"
    CASES.append(Case(name, family, tuple(refs), fn, min_cc, note, optional, selftest))


def _ref(file: str, name: str, defines: dict | None = None) -> KernelRef:
    return KernelRef(file, name, tuple(sorted((defines or {}).items())))


_DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
_DT_NAME = {v: k for k, v in _DT.items()}


def _cuda() -> str:
    return "cuda"


# -- inputs (built lazily, inside the case, on the GPU) ----------------------------------------

@functools.lru_cache(maxsize=None)
def _linear_weight(N: int, K: int, bits: int, block_size: int | None, symmetric: bool = False):
    from cutlass_ops.formats import quantize_weight

    g = torch.Generator().manual_seed(N * 31 + K * 7 + bits * 3 + (block_size or 0))
    w = torch.randn(N, K, generator=g) * (1.0 / math.sqrt(K))
    return quantize_weight(w, bits=bits, block_size=block_size, symmetric=symmetric).to(_cuda())


def _activations(M: int, K: int, dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + M * 13 + K)
    return (torch.randn(M, K, generator=g) * scale).to(dtype).to(_cuda())


def _vector(N: int, dtype, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + N)
    return (torch.randn(N, generator=g) * 0.5).to(dtype).to(_cuda())


# -- weight-only linear (gemv_{mma,stream,simt}.cu + splitk_reduce.cu, gemm_{mma,simt}.cu, dequant_weight.cu,
#    gemv_dp4a.cu)

def _wo_defines(dtype, bits: int, config=None) -> dict:
    from cutlass_ops.weight_only.shared import wo_defines

    return wo_defines(dtype, bits, config)


def _wo_module_defines(family: str, strategy: str | None, dtype, bits: int, M: int, config, perm: bool) -> dict:
    """{source file: defines} of the modules the case's plan loads, from the plan class's own ``kernels``
    (so the default variant of a strategy, e.g. gemv_mma's small-M int4 config, is the one claimed)."""
    from cutlass_ops import weight_only as wo

    plan = wo.plan_class(strategy or {"dequant_weight": "dequant_cublas"}.get(family, family), 90, perm, True)
    found: dict[str, dict] = {}
    for file, _, defines in plan.kernels(M, dtype, bits, config):
        found.setdefault(file, defines)
    return found


def _wo_case(family: str, strategy: str | None, dtype, bits: int, M: int, N: int, K: int, block_size: int | None,
             names: list[tuple[str, str]], *, tag: str = "", config=None, bias: bool = True, act: int = 2,
             symmetric: bool = False, x_scale: float = 1.0, public: bool = False, small_m_gemv: str | None = None,
             min_cc: int = 0, note: str = "", optional: bool = False, perm: bool = False) -> None:
    """A weight-only linear case; ``names`` = (file, kernel) pairs it reaches. perm: act-order (a random K
    permutation: gather_k + the GEMV built with WO_PDL_WAIT on sm_90)."""
    bs = "pc" if block_size is None else str(block_size)
    label = strategy or "default"
    name = (f"{label}/{_DT_NAME[dtype]}-int{bits}-M{M}-N{N}-K{K}-g{bs}"
            + (f"-{tag}" if tag else ""))
    module_defines = _wo_module_defines(family, strategy, dtype, bits, M, config, perm)
    refs = [_ref(file, kname, module_defines[file]) for file, kname in names]

    def run():
        from cutlass_ops import weight_only as wo

        qw = _linear_weight(N, K, bits, block_size, symmetric)
        if small_m_gemv is not None:  # the default-dispatch table, flipped like the GPU test does
            from cutlass_ops.formats import QuantizedWeight

            qw = QuantizedWeight(qw.qweight.clone(), qw.scale.clone(), qw.offset.clone(), bits, qw.block_size,
                                 N, K, symmetric=symmetric)  # fresh weight: no cached default plan
        x = _activations(M, K, dtype, seed=bits, scale=x_scale)
        b = _vector(N, dtype) if bias else None
        if public:
            import cutlass_ops

            return cutlass_ops.linear(x, qw, b, (None, "relu", "relu6")[act])
        saved = dict(wo.SMALL_M_GEMV)
        try:
            if small_m_gemv is not None:
                wo.SMALL_M_GEMV[M] = small_m_gemv
            p = torch.randperm(K, generator=torch.Generator().manual_seed(K)).int().cuda() if perm else None
            return wo.linear_weight_only(x, qw, b, act, strategy=strategy, config=config, perm=p)
        finally:
            wo.SMALL_M_GEMV.clear()
            wo.SMALL_M_GEMV.update(saved)

    _add(name, family, refs, run, min_cc, note, optional)


def _gemv_mma_tile(M: int) -> int:
    return next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)


def _small_m_cases(wo) -> None:
    """gemm_small_m (fp16/bf16, sm_80+): every M tile count, split-K and not, block 32/64/128/per-channel,
    K tails inside a trip and a stage, N tails inside a warp's rows and past whole warps; the variants of
    GemmSmallMConfig (row tiles, warps, stages) with --tunables."""
    Config = getattr(wo, "GemmSmallMConfig", None)
    if Config is None:
        return
    SM, R = "gemm_small_m.cu", "splitk_reduce.cu"
    mt = lambda M: next(t for t in (1, 2, 4, 8) if M <= 8 * t)  # noqa: E731
    one = Config(splits=1)
    for dtype in (torch.float16, torch.bfloat16):
        for bits in (4, 8):
            # (M, N, K, block, config, tag): K = 992 / 4160 / 4224 end inside a trip / a stage; N = 4097 ends
            # inside a warp's rows, N = 259 leaves most warps of its block without rows; default splits (None)
            # split K wherever N / 256 leaves SMs idle (every shape here on a GPU with >= 17 SMs).
            for M, N, K, bs, cfg, tag in ((1, 4097, 992, 32, one, "nosplit"), (13, 259, 4160, 64, None, "splitk"),
                                          (33, 4097, 4224, 128, one, "nosplit"), (64, 515, 4160, None, None, "splitk"),
                                          (7, 48, 1056, 32, None, "splitk"), (17, 16, 96, 32, one, "tiny-k")):
                names = [(SM, f"gemm_small_m_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg is None else [])
                _wo_case("gemm_small_m", "gemm_small_m", dtype, bits, M, N, K, bs, names, tag=tag, config=cfg,
                         min_cc=80, act=M % 3, bias=M != 13)
    for i, kwargs in enumerate(({"row_tiles": 1, "warps": 4, "stages": 2}, {"row_tiles": 4, "warps": 4},
                                {"stages": 4, "splits": 3}, {"row_tiles": 1, "stages": 4, "splits": 1})):
        cfg = Config(**kwargs)
        dtype, bits = ((torch.float16, 4), (torch.bfloat16, 8))[i % 2]
        M = 32 if cfg.row_tiles == 4 else (9, 64)[i % 2]
        tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
        names = [(SM, f"gemm_small_m_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg.splits != 1 else [])
        _wo_case("gemm_small_m", "gemm_small_m", dtype, bits, M, 1031, 4160, 64, names, tag=tag, config=cfg,
                 min_cc=80, optional=True)


def _build_weight_only_cases() -> None:
    from cutlass_ops import weight_only as wo

    GM, GS, GT, R = "gemv_mma.cu", "gemv_stream.cu", "gemv_simt.cu", "splitk_reduce.cu"
    D, Q, PM, PT = "dequant_weight.cu", "gemv_dp4a.cu", "gemm_mma.cu", "gemm_simt.cu"
    half_types = (torch.float16, torch.bfloat16)
    all_types = (torch.float16, torch.bfloat16, torch.float32)

    # gemv_mma (fp16/bf16, sm_80+): every M tile count, split-K and not, block 32/64/128/per-channel.
    # Split-K (fp32 workspace + splitk_reduce) happens when N / 32 blocks leave SMs idle and K has
    # >= 64 chunks: N = 259 splits on any GPU with more than 9 SMs; K = 992 (< 64 chunks) never splits.
    for dtype in half_types:
        for bits in (4, 8):
            mt = _gemv_mma_tile
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 1, 4097, 992, 32, [(GM, f"gemv_mma_mt{mt(1)}")],
                     tag="nosplit", min_cc=80)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 3, 259, 4160, 64,
                     [(GM, f"gemv_mma_mt{mt(3)}"), (R, "splitk_reduce")], tag="splitk", min_cc=80, act=1)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 13, 4097, 4160, 64, [(GM, f"gemv_mma_mt{mt(13)}")],
                     min_cc=80, bias=False)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 17, 4097, 4160, None, [(GM, f"gemv_mma_mt{mt(17)}")],
                     min_cc=80)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 47, 515, 4224, 128,
                     [(GM, f"gemv_mma_mt{mt(47)}"), (R, "splitk_reduce")], tag="splitk", min_cc=80, act=0)
    for dtype, bits in ((torch.float16, 4), (torch.bfloat16, 8)):  # each M-tile count at its boundaries
        for M in (8, 9, 16, 33, 64):
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, M, 4097, 4160, 64,
                     [(GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")], tag="m-boundary", min_cc=80, act=M % 3)
    # The gemv_mma variants of GemvMmaConfig (row tiles, unroll, warps, forced splits), where the
    # module has them: each is its own NVRTC module (a minute or more to compile), so --tunables only.
    GemvMmaConfig = getattr(wo, "GemvMmaConfig", None)
    if GemvMmaConfig is not None:
        variants = []
        for kwargs in ({"row_tiles": 1, "splits": 3}, {"row_tiles": 4, "unroll": 2, "warps": 4},
                       {"unroll": 8, "min_blocks": 1, "splits": 2}):
            try:
                variants.append((kwargs, GemvMmaConfig(**kwargs)))
            except (TypeError, ValueError):
                pass
        for i, (kwargs, cfg) in enumerate(variants):
            dtype, bits, M = ((torch.float16, 4, 5), (torch.bfloat16, 8, 9), (torch.float16, 8, 2))[i % 3]
            tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
            names = [(GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")] + ([(R, "splitk_reduce")]
                                                               if kwargs.get("splits", 1) > 1 else [])
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, M, 1031, 4160, 64, names, tag=tag, config=cfg,
                     min_cc=80, optional=True)

    # gemv_stream (fp16/bf16, any arch): every M = 1..8 on the main ragged shape (N = 4097: a partial
    # row group; K = 4160, block 64 asymmetric), then the block / split / overflow-guard paths.
    for dtype in half_types:
        for bits in (4, 8):
            for M in range(1, 9):
                _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 4097, 4160, 64,
                         [(GS, f"gemv_stream_m{M}")], act=M % 3, bias=M != 4)
    for dtype, bits, M, N, K, bs, tag in ((torch.float16, 4, 3, 4097, 4160, None, "perchannel"),
                                          (torch.bfloat16, 8, 5, 4097, 4224, 96, "div-block"),
                                          (torch.float16, 8, 3, 3, 1056, 32, "tiny-n"),
                                          (torch.bfloat16, 4, 2, 77, 1056, 32, "n77")):
        _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, N, K, bs, [(GS, f"gemv_stream_m{M}")], tag=tag)
    for dtype, bits, M in ((torch.float16, 4, 7), (torch.bfloat16, 8, 1)):
        # N = 259: row groups fill few warp slots, K is split (>= 64 chunks per split)
        _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 259, 8192, 128,
                 [(GS, f"gemv_stream_m{M}"), (R, "splitk_reduce")], tag="splitk", act=0)
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 4, 8, 1031, 16384, 128,
             [(GS, "gemv_stream_m8"), (R, "splitk_reduce")], tag="smem-split")
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 4, 3, 515, 2048, 64, [(GS, "gemv_stream_m3")],
             tag="f16-overflow-guard", x_scale=4000.0, act=0, bias=False)
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 8, 3, 515, 2048, 64, [(GS, "gemv_stream_m3")],
             tag="f16-overflow-guard", x_scale=125.0, act=0)
    _wo_case("gemv_stream", None, torch.float16, 4, 1, 1031, 4160, 64, [(GS, "gemv_stream_m1")],
             tag="SMALL_M_GEMV-stream", small_m_gemv="gemv_stream", min_cc=80,
             note="default dispatch with weight_only.SMALL_M_GEMV[1] = 'gemv_stream'")
    StreamConfig = getattr(wo, "StreamConfig", None)
    if StreamConfig is not None:
        for i, kwargs in enumerate(({"rows": 2, "warps": 4}, {"rows": 8, "warps": 16, "min_blocks": 1})):
            try:
                cfg = StreamConfig(**kwargs)
            except (TypeError, ValueError):
                continue
            dtype, bits, M = ((torch.float16, 8, 4), (torch.bfloat16, 4, 6))[i % 2]
            tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
            _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 4097, 4160, 64, [(GS, f"gemv_stream_m{M}")],
                     tag=tag, config=cfg, optional=True)

    # gemv_simt (every dtype): every M = 1..8, N = 515 (a partial 4-row block), K = 1056 (block 32).
    for dtype in all_types:
        for bits in (4, 8):
            for M in range(1, 9):
                _wo_case("gemv_simt", "gemv_simt", dtype, bits, M, 515, 1056, 32, [(GT, f"gemv_simt_m{M}")],
                         act=M % 3, bias=M % 2 == 1)
    _wo_case("gemv_simt", "gemv_simt", torch.float32, 4, 3, 4097, 4224, 96, [(GT, "gemv_simt_m3")],
             tag="div-block")
    _wo_case("gemv_simt", "gemv_simt", torch.bfloat16, 8, 6, 4097, 4160, None, [(GT, "gemv_simt_m6")],
             tag="perchannel")
    _wo_case("gemv_mma", None, torch.bfloat16, 8, 6, 4097, 4160, 64,
             [(GM, f"gemv_mma_mt{_gemv_mma_tile(6)}")], public=True, min_cc=80,
             note="public cutlass_ops.linear, default dispatch (gemv_mma on sm_80+)")
    # act-order on Hopper: gather_k, then gemv_mma (WO_PDL_WAIT) as its programmatic dependent; split-K too
    for M, N in ((1, 4097), (11, 259)):
        _wo_case("gemv_mma", "gemv_mma", torch.float16, 4, M, N, 4160, 64,
                 [("gather_k.cu", "gather_k"), (GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")]
                 + ([(R, "splitk_reduce")] if N < 1000 else []), tag="act-order", min_cc=90, perm=True)

    _small_m_cases(wo)

    # gemm_mma (fp16/bf16, sm_80+): both CTA tiles (GemmConfig 64 / 128), ragged N and K, the
    # division path (block 48), per-channel.
    for i, (dtype, bits) in enumerate((d, b) for d in half_types for b in (4, 8)):
        for cfg in wo.GEMM_CONFIGS:
            M, N, K, bs = ((17, 4097, 4160, 64), (70, 77, 1056, 32), (129, 515, 4224, 128),
                           (33, 4097, 4160, None))[(i + cfg.m_tile // 64) % 4]
            _wo_case("gemm_mma", "gemm_mma", dtype, bits, M, N, K, bs, [(PM, cfg.kernel_name())],
                     tag=f"mtile{cfg.m_tile}", config=cfg, min_cc=80, act=i % 3)
    for cfg in wo.GEMM_CONFIGS:
        _wo_case("gemm_mma", "gemm_mma", torch.float16, 8, 70, 300, 960, 48, [(PM, cfg.kernel_name())],
                 tag=f"mtile{cfg.m_tile}-div-block", config=cfg, min_cc=80, act=0)
        _wo_case("gemm_mma", "gemm_mma", torch.float16, 4, 300, 4097, 4224, 128, [(PM, cfg.kernel_name())],
                 tag=f"mtile{cfg.m_tile}-several-m-tiles", config=cfg, min_cc=80, act=1)
    # gemm_simt (every dtype, the fallback)
    for dtype in all_types:
        for bits in (4, 8):
            M, N, K, bs = (17, 515, 1056, 32) if bits == 4 else (70, 77, 1056, 32)
            _wo_case("gemm_simt", "gemm_simt", dtype, bits, M, N, K, bs, [(PT, "gemm_simt")], act=bits % 3)
    _wo_case("gemm_simt", "gemm_simt", torch.float16, 8, 70, 300, 960, 48, [(PT, "gemm_simt")], tag="div-block")
    _wo_case("gemm_simt", "gemm_simt", torch.float32, 4, 9, 4097, 4160, None, [(PT, "gemm_simt")],
             tag="perchannel")

    # dequant_weight alone (dequantize_weight), over the tile / tail / group-per-word / division paths
    dequant_shapes = ((4097, 4160, 64), (77, 1056, 32), (300, None, None), (129, 960, 48), (64, 512, "min"))
    for dtype in all_types:
        for bits in (4, 8):
            for N, K, bs in dequant_shapes:
                if K is None:  # per-channel, K % 32 != 0 (int4) / K % 16 != 0 (int8): chunks straddle rows
                    K = 1064 if bits == 4 else 1060
                if bs == "min":
                    bs = 8 if bits == 4 else 4  # the smallest block: one group per word
                _add_dequant_case(dtype, bits, N, K, bs)
    # ... and the dequant_cublas strategy (dequant_weight, then cuBLAS), forced and by default dispatch
    for dtype, bits, M in ((torch.float16, 4, 17), (torch.bfloat16, 8, 3), (torch.float32, 4, 5),
                           (torch.float32, 8, 33)):
        _wo_case("dequant_weight", "dequant_cublas", dtype, bits, M, 515, 1056, 32, [(D, "dequant_weight")],
                 act=M % 3)
    _wo_case("dequant_weight", None, torch.bfloat16, 4, wo.DEQUANT_CUBLAS_MIN_M, 515, 1056, None,
             [(D, "dequant_weight")], tag="default-dispatch",
             note="default dispatch at M = DEQUANT_CUBLAS_MIN_M picks dequant_cublas")

    # gemv_dp4a (int8 weights, every activation type): quantize_q8_1 then gemv_dp4a_m{M}
    for dtype in all_types:
        for M in range(1, 9):
            N, K, bs = (4097, 4160, 64) if M in (1, 8) else (515, 1056, 32)
            _wo_case("gemv_dp4a", "gemv_dp4a", dtype, 8, M, N, K, bs, [(Q, "quantize_q8_1"), (Q, f"gemv_dp4a_m{M}")],
                     act=M % 3, bias=M != 2)
    _wo_case("gemv_dp4a", "gemv_dp4a", torch.float16, 8, 3, 515, 1056, None,
             [(Q, "quantize_q8_1"), (Q, "gemv_dp4a_m3")], tag="perchannel")


def _add_dequant_case(dtype, bits: int, N: int, K: int, block_size: int | None) -> None:
    bs = "pc" if block_size is None else str(block_size)
    name = f"dequantize_weight/{_DT_NAME[dtype]}-int{bits}-N{N}-K{K}-g{bs}"

    def run():
        from cutlass_ops import weight_only as wo

        return wo.dequantize_weight(_linear_weight(N, K, bits, block_size, False), dtype)

    _add(name, "dequant_weight", [_ref("dequant_weight.cu", "dequant_weight", _wo_defines(dtype, bits))], run)


# -- converters_test.cu ------------------------------------------------------------------------

def _launch_converter(kname: str, blocks: int, words: torch.Tensor, out: torch.Tensor, n: int) -> None:
    """One launch of a converters_test.cu kernel (words, out, n) with 256-thread blocks."""
    from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

    class ConverterArgs(KernelArgs):
        _fields_ = [("words", Ptr), ("out", Ptr), ("n", I32)]

    device = words.device.index
    Launch(load_kernel("converters_test.cu", kname, device=device), LaunchConfig.of(blocks, 256),
           ConverterArgs(words=words.data_ptr(), out=out.data_ptr(), n=n), device)()


def _build_converter_cases() -> None:
    entries = [(f"test_{s}{w}s_to_{t}", 4 if w == "int4" else 2)
               for w in ("int4", "int8") for s in ("", "u")
               for t in (("half2x4", "bf162x4") if w == "int4" else ("half2x2", "bf162x2"))]
    for kname, pairs in entries:
        def run(kname=kname, pairs=pairs):
            n = 4099  # not a multiple of the 256-thread block; 7 blocks: the grid-stride loop runs
            g = torch.Generator().manual_seed(n)
            w = torch.randint(0, 2 ** 32, (n,), generator=g, dtype=torch.int64)
            words = torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32).to(_cuda())
            out = torch.empty((n, pairs), dtype=torch.int32, device=_cuda())
            _launch_converter(kname, 7, words, out, n)
            return out
        _add(f"converters/{kname}-n4099", "converters_test", [_ref("converters_test.cu", kname)], run)

    for short_rows in (2, 500):  # 16 bytes (a tail-sized overrun) and 4000 bytes past the output
        def run_planted(short_rows=short_rows):
            n = 1000
            words = torch.zeros(n, dtype=torch.int32, device=_cuda())
            out = torch.empty((n - short_rows, 2), dtype=torch.int32, device=_cuda())  # rows of 8 bytes
            _launch_converter("test_int8s_to_half2x2", 4, words, out, n)
            return out
        _add(f"selftest/planted-oob-write-{8 * short_rows}B-test_int8s_to_half2x2", "converters_test",
             [_ref("converters_test.cu", "test_int8s_to_half2x2")], run_planted, selftest=True,
             note="writes past its output on purpose: memcheck must report it (--plant-oob)")


# -- conv_direct.cu, conv_igemm.cu ------------------------------------------------------------

@dataclass(frozen=True)
class ConvShape:
    batch: int
    Ci: int
    H: int
    W: int
    Co: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    block_size: int
    groups: int = 1  # the weight is [Co, Ci / groups, kh, kw]

    def tag(self) -> str:
        s = lambda p: f"{p[0]}" if p[0] == p[1] else f"{p[0]}x{p[1]}"  # noqa: E731
        return (f"b{self.batch}-ci{self.Ci}-{self.H}x{self.W}-co{self.Co}-k{self.kh}x{self.kw}-s{s(self.stride)}"
                f"-p{s(self.padding)}-d{s(self.dilation)}-g{self.block_size}"
                + (f"-groups{self.groups}" if self.groups != 1 else ""))


@functools.lru_cache(maxsize=None)
def _conv_weight(Co: int, Ci: int, kh: int, kw: int, bits: int, block_size: int):
    """A quantized [Co, Ci, kh, kw] weight (Ci: per group) on the GPU."""
    from cutlass_ops.formats import quantize_conv_weight

    g = torch.Generator().manual_seed(Co * 7 + Ci + kh * 3 + kw + bits)
    w = torch.randn(Co, Ci, kh, kw, generator=g) * 0.2
    return quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False).to(_cuda())


def _conv_source(kernel: str) -> str:
    """The .cu file of a conv kernel: its strategy's (conv_igemm.cu also holds the split-K reduce and the
    NCHW transpose)."""
    for strategy in ("direct", "depthwise", "small_ci"):
        if kernel.startswith(f"conv_{strategy}_"):
            return f"conv_{strategy}.cu"
    if kernel.startswith(("conv_dequant", "conv_bias_act_")):
        return "conv_dequant.cu"
    return "conv_igemm.cu"


def _conv_case(strategy: str, dtype, bits: int, channels_last: bool, shape: ConvShape, names: list[str], *,
               split_k: int | None = None, act: int = 1, bias: bool = True, public: bool = False,
               min_cc: int = 0) -> None:
    from cutlass_ops.conv.geometry import conv_defines

    layout = "nhwc" if channels_last else "nchw"
    name = (f"conv_{strategy}/{_DT_NAME[dtype]}-w{bits}-{layout}-{shape.tag()}"
            + (f"-splitk{split_k}" if split_k else "") + ("-public" if public else ""))
    defines = conv_defines(dtype, bits)
    refs = [_ref(_conv_source(n), n, defines) for n in names]

    def run():
        from cutlass_ops.conv import conv2d_weight_only

        qw = _conv_weight(shape.Co, shape.Ci // shape.groups, shape.kh, shape.kw, bits, shape.block_size)
        g = torch.Generator().manual_seed(shape.H * 31 + shape.W)
        x = torch.randn(shape.batch, shape.Ci, shape.H, shape.W, generator=g).to(dtype).to(_cuda())
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        b = _vector(shape.Co, dtype) if bias else None
        if public:
            import cutlass_ops

            return cutlass_ops.conv2d(x, qw, b, shape.stride, shape.padding, shape.dilation,
                                      (None, "relu", "relu6")[act], shape.groups)
        return conv2d_weight_only(x, qw, b, shape.stride, shape.padding, shape.dilation, act, shape.groups,
                                  strategy=strategy, split_k=split_k)

    _add(name, "conv", refs, run, min_cc)


def _build_conv_cases() -> None:
    direct_shapes = (
        ConvShape(1, 32, 9, 9, 24, 3, 3, (1, 1), (1, 1), (1, 1), 32),       # Co not a tile multiple
        ConvShape(2, 16, 13, 11, 10, 3, 3, (2, 2), (2, 2), (2, 2), 16),     # stride 2 + dilation 2, odd H/W
        ConvShape(1, 48, 8, 10, 20, 3, 5, (2, 1), (1, 2), (1, 2), 16),      # Kh != Kw, mixed stride/pad/dil
        ConvShape(3, 24, 7, 5, 33, 1, 1, (1, 1), (0, 0), (1, 1), 8),        # 1x1, odd Co, block 8
    )
    i = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tag = _DT_NAME[dtype]
        for bits in (4, 8):
            for channels_last in (False, True):
                shape = direct_shapes[i % len(direct_shapes)]
                i += 1
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("direct", dtype, bits, channels_last, shape, [f"conv_direct_{tag}_w{bits}_{layout}"],
                           act=i % 3, bias=i % 4 != 0)
    igemm_shapes = (
        ConvShape(2, 64, 6, 6, 72, 3, 3, (1, 1), (1, 1), (1, 1), 32),       # Co = 72: a ragged N tile
        ConvShape(8, 128, 5, 5, 130, 3, 3, (1, 1), (1, 1), (1, 1), 64),     # two N tiles + a ragged one
        ConvShape(8, 64, 10, 10, 64, 3, 3, (2, 2), (1, 1), (1, 1), 64),     # stride 2
        ConvShape(1, 32, 12, 12, 40, 3, 3, (1, 1), (2, 2), (2, 2), 32),     # dilation 2
    )
    # (dtype, bits, channels_last, shape, split_k): every igemm name, the NCHW transpose, and all four
    # split-K reduce kernels (forced split_k > 1; split_k=1 forces no split).
    plan = ((torch.float16, 4, True, 0, 3), (torch.float16, 4, False, 1, 1), (torch.float16, 8, True, 3, 1),
            (torch.float16, 8, False, 0, 3), (torch.bfloat16, 4, True, 2, 1), (torch.bfloat16, 4, False, 3, 2),
            (torch.bfloat16, 8, True, 1, 5), (torch.bfloat16, 8, False, 2, 1))
    for j, (dtype, bits, channels_last, s, split_k) in enumerate(plan):
        tag, layout = _DT_NAME[dtype], ("nhwc" if channels_last else "nchw")
        names = [f"conv_igemm_{tag}_w{bits}_{layout}"]
        if not channels_last:
            names.append("conv_nchw_to_nhwc_b16")
        if split_k > 1:
            names.append(f"conv_splitk_reduce_{tag}_{layout}")
        _conv_case("igemm", dtype, bits, channels_last, igemm_shapes[s], names, split_k=split_k, act=j % 3,
                   bias=j != 5, min_cc=80)
    # groups: depthwise and grouped direct, the int4 stem (K = 147, rows padded to 152 nibbles), and a
    # grouped igemm (Ci/groups = 64, Co/groups = 64) with and without a K split
    grouped = (
        ("direct", torch.float16, 4, True, ConvShape(2, 24, 9, 9, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24), None),
        ("direct", torch.bfloat16, 8, False, ConvShape(1, 24, 8, 7, 48, 5, 5, (1, 1), (2, 2), (1, 1), 25, 24), None),
        ("direct", torch.float32, 4, False, ConvShape(2, 48, 7, 6, 20, 3, 3, (1, 1), (1, 1), (2, 2), 24, 2), None),
        ("direct", torch.float16, 4, False, ConvShape(1, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 3), None),
        ("direct", torch.bfloat16, 4, True, ConvShape(2, 3, 17, 18, 8, 7, 7, (2, 2), (3, 3), (1, 1), 21), None),
        ("igemm", torch.float16, 4, True, ConvShape(2, 128, 6, 6, 128, 3, 3, (1, 1), (1, 1), (1, 1), 64, 2), 1),
        ("igemm", torch.bfloat16, 8, False, ConvShape(1, 256, 5, 5, 256, 3, 3, (1, 1), (1, 1), (1, 1), 192, 4), 3),
    )
    for j, (strategy, dtype, bits, channels_last, shape, split_k) in enumerate(grouped):
        tag, layout = _DT_NAME[dtype], ("nhwc" if channels_last else "nchw")
        names = [f"conv_{strategy}_{tag}_w{bits}_{layout}"]
        if strategy == "igemm" and not channels_last:
            names.append("conv_nchw_to_nhwc_b16")
        if split_k and split_k > 1:
            names.append(f"conv_splitk_reduce_{tag}_{layout}")
        _conv_case(strategy, dtype, bits, channels_last, shape, names, split_k=split_k, act=j % 3,
                   min_cc=80 if strategy == "igemm" else 0)
    # depthwise: each (dtype, bits) module's seven kernels, each by the geometry its plan picks it for
    # (NCHW; NHWC one channel per thread (Ci odd, or a channel multiplier), two (Ci % 4 == 2), four
    # (stride 2 along W: no register window), the register windows for Kw = 3, 5, 7)
    depthwise = (
        ("nchw", ConvShape(2, 24, 9, 9, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24)),
        ("nhwc_v1", ConvShape(1, 13, 8, 7, 26, 3, 3, (1, 1), (1, 1), (1, 1), 3, 13)),
        ("nhwc_v2", ConvShape(2, 18, 7, 9, 18, 5, 5, (2, 2), (2, 2), (1, 1), 25, 18)),
        ("nhwc_v4", ConvShape(1, 24, 11, 10, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24)),
        ("nhwc_v4_k3", ConvShape(2, 40, 9, 13, 40, 3, 3, (1, 1), (1, 1), (1, 1), 1, 40)),
        ("nhwc_v4_k5", ConvShape(1, 36, 10, 11, 36, 5, 5, (2, 1), (2, 2), (2, 1), 5, 36)),
        ("nhwc_v4_k7", ConvShape(1, 32, 12, 14, 32, 7, 7, (1, 1), (3, 3), (1, 1), 49, 32)),
    )
    j = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for bits in (4, 8):
            for layout, shape in depthwise:
                _conv_case("depthwise", dtype, bits, layout != "nchw", shape,
                           [f"conv_depthwise_{_DT_NAME[dtype]}_w{bits}_{layout}"], act=j % 3, bias=j % 5 != 0)
                j += 1
    # small_ci: each module's two layouts, on the stem's geometry (Ci = 3, 7x7, stride 2) and on a grouped
    # conv whose 35 output channels per group leave a ragged 64-channel tile, with dilation 2
    small_ci = (ConvShape(2, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 21),
                ConvShape(1, 8, 13, 15, 70, 3, 3, (1, 1), (1, 1), (2, 2), 9, 2))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for bits in (4, 8):
            for channels_last in (False, True):
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("small_ci", dtype, bits, channels_last, small_ci[j % 2],
                           [f"conv_small_ci_{_DT_NAME[dtype]}_w{bits}_{layout}"], act=j % 3, bias=j % 4 != 0)
                j += 1
    # dequant_cudnn: each module's per-element and 8-wide dequantization in both layouts (the stem's K = 147
    # and a block of 12 take the per-element kernel; K = 576 / 288 with blocks of 64 / 32 the 8-wide one), and
    # the NHWC bias / activation epilogue (Co % 8 == 0)
    per_element = (ConvShape(2, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 21),
                   ConvShape(1, 24, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1), 12))
    wide = (ConvShape(2, 64, 9, 9, 72, 3, 3, (1, 1), (1, 1), (1, 1), 64),
            ConvShape(1, 64, 8, 10, 48, 3, 3, (2, 1), (1, 2), (1, 2), 32, 2))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tag = _DT_NAME[dtype]
        for bits in (4, 8):
            for channels_last in (False, True):
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("dequant_cudnn", dtype, bits, channels_last, per_element[j % 2],
                           [f"conv_dequant_{tag}_w{bits}_{layout}"], act=j % 3, bias=j % 4 != 0)
                epilogue = [f"conv_bias_act_{tag}_nhwc"] if channels_last else []
                _conv_case("dequant_cudnn", dtype, bits, channels_last, wide[j % 2],
                           [f"conv_dequant8_{tag}_w{bits}_{layout}", *epilogue], act=1 + j % 2)
                j += 1
    # public API, auto strategy: deep K and few pixels (igemm, split along K by the heuristic)
    _conv_case("auto", torch.float16, 4, True, ConvShape(1, 512, 7, 7, 64, 3, 3, (1, 1), (1, 1), (1, 1), 128),
               ["conv_igemm_f16_w4_nhwc"], public=True, min_cc=80)


# -- quant_a.cu, scheme2_epilogue.cu -----------------------------------------------------------

def _build_scheme2_helper_cases() -> None:
    QA, S2 = "quant_a.cu", "scheme2_epilogue.cu"

    for dtype, M, bs, G in ((torch.float32, 17, 32, 7), (torch.float16, 3, 128, 5), (torch.bfloat16, 1, 256, 2),
                            (torch.float16, 127, 64, 3)):
        def run(dtype=dtype, M=M, bs=bs, G=G):
            from cutlass_ops.w8a8.quant_a import quantize_activation_gpu

            return quantize_activation_gpu(_activations(M, bs * G, dtype, seed=5, scale=3.0), bs)
        # blocks up to 1024 long: one warp per (row, block)
        _add(f"quant_a/{_DT_NAME[dtype]}-M{M}-K{bs * G}-g{bs}", "quant_a",
             [_ref(QA, f"quant_a_warp_{_DT_NAME[dtype]}")], run)

    for K, kernel in ((1000, "quant_a_warp_bf16"), (3000, "quant_a_bf16")):  # longer rows: a block per row
        def run_public(K=K):
            import cutlass_ops

            return cutlass_ops.quantize_activation(_activations(3, K, torch.bfloat16, seed=6), None)
        _add(f"quant_a/bf16-M3-K{K}-one-block-per-row-public", "quant_a", [_ref(QA, kernel)], run_public)

    for dtype, params_2d in ((torch.float32, True), (torch.float16, False), (torch.bfloat16, True)):
        def run_block(dtype=dtype, params_2d=params_2d):
            from cutlass_ops.w8a8.quant_a import quantize_activation_block_gpu

            M, bs, G = 17, 64, 3
            K = bs * G
            wide = _activations(M, K + 24, dtype, seed=7)
            x = wide[:, 8:8 + K]  # row stride K + 24
            A_q = torch.empty((M, bs + 5), dtype=torch.int8, device=_cuda())[:, :bs]
            shape = (M, G) if params_2d else (M,)
            scale = torch.empty(shape, device=_cuda())
            offset = torch.empty(shape, device=_cuda())
            sum_q = torch.empty(shape, dtype=torch.int32, device=_cuda())
            for g in range(G):
                quantize_activation_block_gpu(x, g * bs, bs, A_q, scale, offset, sum_q)
            return A_q
        _add(f"quant_a_block/{_DT_NAME[dtype]}-M17-K192-g64-strided-params{'MxG' if params_2d else 'M'}",
             "quant_a", [_ref(QA, f"quant_a_{_DT_NAME[dtype]}")], run_block)

    for N, bs, G, odd in ((1, 32, 3, False), (17, 64, 5, False), (130, 128, 2, True), (5, 4096, 1, False)):
        def run_sum(N=N, bs=bs, G=G, odd=odd):
            from cutlass_ops.w8a8.quant_a import sum_bq_gpu

            K = bs * G
            g = torch.Generator().manual_seed(N + K)
            q = torch.randint(-128, 128, (N, K + 3), generator=g, dtype=torch.int8).to(_cuda())
            return sum_bq_gpu(q[:, 1:1 + K] if odd else q[:, :K].contiguous(), bs)
        _add(f"precompute_sum_bq/N{N}-K{bs * G}-g{bs}" + ("-odd-address-rows" if odd else ""), "quant_a",
             [_ref(QA, "precompute_sum_bq")], run_sum)

        def run_bvec(N=N, bs=bs, G=G, odd=odd):
            from cutlass_ops.w8a8.quant_a import precompute_bvec_gpu

            K = bs * G
            g = torch.Generator().manual_seed(N + K + 1)
            q = torch.randint(-128, 128, (N, K + 3), generator=g, dtype=torch.int8).to(_cuda())
            scale, offset = (torch.rand(N, G, generator=g).to(_cuda()) for _ in range(2))
            return precompute_bvec_gpu(q[:, 1:1 + K] if odd else q[:, :K].contiguous(), scale, offset, bs)[1]
        _add(f"precompute_bvec/N{N}-K{bs * G}-g{bs}" + ("-odd-address-rows" if odd else ""), "quant_a",
             [_ref(QA, "precompute_bvec")], run_bvec)

    for out_dtype, params_2d in ((torch.float32, True), (torch.float16, False), (torch.bfloat16, True)):
        def run_acc(out_dtype=out_dtype, params_2d=params_2d):
            from cutlass_ops.w8a8.epilogue import dequant_and_acc_gpu

            M, N, bs, G = 17, 41, 64, 4
            g = torch.Generator().manual_seed(M * N)
            dev = _cuda()
            Cq = torch.randint(-2 ** 16, 2 ** 16, (M, N + 8), generator=g, dtype=torch.int32).to(dev)  # ldc > N
            shape = (M, G) if params_2d else (M,)
            sA, oA = torch.rand(shape, generator=g).to(dev) * 0.01, torch.randn(shape, generator=g).to(dev)
            sumA = torch.randint(-4000, 4000, shape, generator=g, dtype=torch.int32).to(dev)
            sB, oB = torch.rand(N, G, generator=g).to(dev) * 0.01, torch.randn(N, G, generator=g).to(dev) * 0.01
            sumB = torch.randint(-4000, 4000, (N, G), generator=g, dtype=torch.int32).to(dev)
            acc = torch.zeros(M, N, dtype=out_dtype, device=dev)
            for i in range(G):
                dequant_and_acc_gpu(Cq, acc, sA, oA, sumA, sB, oB, sumB, i, bs)
            return acc
        _add(f"dequant_and_acc/{_DT_NAME[out_dtype]}-M17-N41-G4-params{'MxG' if params_2d else 'M'}",
             "scheme2_epilogue", [_ref(S2, f"dequant_and_acc_{_DT_NAME[out_dtype]}")], run_acc)

    for src, dst, bias, strided in (("f32", "f32", True, False), ("f16", "f16", True, True),
                                    ("bf16", "bf16", False, False), ("f32", "f16", False, True),
                                    ("f32", "bf16", True, False)):
        def run_bias(src=src, dst=dst, bias=bias, strided=strided):
            from cutlass_ops.w8a8.epilogue import bias_and_activation_gpu

            M, N = 9, 33
            data = _activations(M, N + 7, _DT[src], seed=8, scale=8.0)
            data = data[:, :N] if strided else data[:, :N].contiguous()
            out = None if src == dst else torch.empty((M, N), dtype=_DT[dst], device=_cuda())
            return bias_and_activation_gpu(data, _vector(N, torch.float32) if bias else None, "relu6", out=out)
        _add(f"bias_act/{src}-to-{dst}-M9-N33" + ("-bias" if bias else "") + ("-strided" if strided else "")
             + ("-inplace" if src == dst else ""), "scheme2_epilogue", [_ref(S2, f"bias_act_{src}_{dst}")], run_bias)


# -- quantize_weight.cu ------------------------------------------------------------------------

def _build_quantize_weight_cases() -> None:
    QW = "quantize_weight.cu"
    tags = {**_DT_NAME, torch.float64: "f64"}
    # (dtype, bits, symmetric, shape, block_size, transposed): linear [N, K] or conv [Co, Ci, Kh, Kw]; ragged
    # N, per channel (None), an RGB stem (K = 147, int4 rows padded to 152), depthwise, a strided linear weight
    problems = ((torch.float16, 8, True, (3, 320), 64, False), (torch.bfloat16, 4, False, (257, 256), 32, False),
                (torch.float32, 8, False, (64, 3, 7, 7), None, False), (torch.float32, 4, True, (5, 1024), None, True),
                (torch.float64, 8, True, (17, 96), 32, False), (torch.float64, 4, False, (64, 3, 7, 7), None, False),
                (torch.float16, 4, False, (8, 16, 3, 3), 48, False),
                (torch.bfloat16, 8, False, (24, 1, 3, 3), 9, False))
    for dtype, bits, symmetric, shape, block_size, transposed in problems:
        def run(dtype=dtype, bits=bits, symmetric=symmetric, shape=shape, block_size=block_size,
                transposed=transposed):
            from cutlass_ops.formats import quantize_conv_weight, quantize_weight

            g = torch.Generator().manual_seed(sum(shape) + bits)
            w = torch.randn(shape[::-1] if transposed else shape, generator=g, dtype=torch.float64).to(dtype)
            w = w.to(_cuda()).t() if transposed else w.to(_cuda())
            quantize = quantize_conv_weight if len(shape) == 4 else quantize_weight
            return quantize(w, bits=bits, block_size=block_size, symmetric=symmetric).qweight
        name = (f"quantize_weight/{tags[dtype]}-W{bits}-{'x'.join(map(str, shape))}-g{block_size}"
                f"-{'sym' if symmetric else 'asym'}" + ("-strided" if transposed else ""))
        _add(name, "quantize_weight", [_ref(QW, f"quantize_weight_w{bits}_{tags[dtype]}")], run)


# -- quant_token.cu ----------------------------------------------------------------------------

def _build_quant_token_cases() -> None:
    QT = "quant_token.cu"
    # (dtype, M, K, row offset): 1, 2, 4 and 8 warps per row; an offset of 1 or 3 elements starts the rows
    # off a 16-byte boundary (a scalar head and tail around the vectors)
    problems = ((torch.float16, 3, 4096, 0), (torch.bfloat16, 17, 4097, 1), (torch.float32, 64, 7, 0),
                (torch.float16, 5, 14336, 3), (torch.float32, 9, 1000, 1), (torch.bfloat16, 1, 1, 0))
    for dtype, M, K, offset in problems:
        def run(dtype=dtype, M=M, K=K, offset=offset):
            from cutlass_ops.torch_ops import quantize_per_token

            x = _activations(M, K + offset, dtype, seed=9, scale=3.0)[:, offset:]
            return quantize_per_token(x)[0]
        _add(f"quant_token/{_DT_NAME[dtype]}-M{M}-K{K}" + (f"-offset{offset}" if offset else ""), "quant_token",
             [_ref(QT, f"quant_token_{_DT_NAME[dtype]}")], run)


# -- w8a8_kblock_fused.cu ----------------------------------------------------------------------

K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4352, 256: 4352}  # not multiples of the 128-wide K tile


def _w8a8_weight(N: int, K: int, block_size: int):
    from cutlass_ops.formats import QuantizedWeight

    g = torch.Generator().manual_seed(N + K + block_size)
    G = K // block_size
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, G, generator=g) * 0.02 + 1e-3
    offset = torch.randn(N, G, generator=g) * 0.05
    return QuantizedWeight(q.to(_cuda()), scale.to(_cuda()), offset.to(_cuda()), 8, block_size, N, K, None, False)


def _build_w8a8_cases() -> None:
    from cutlass_ops.w8a8 import fused as wf
    from cutlass_ops.w8a8 import tiles

    F = "w8a8_kblock_fused.cu"
    # Every tile variant once, each block size at least once (L: block 128 > BK = 64; L128: block 32,
    # four blocks per K tile), M = 129 and N = 200 ragged in both directions, A pre-quantized.
    plan = (("T", 32, torch.float16, True), ("T32", 256, torch.bfloat16, False), ("S", 128, torch.float32, True),
            ("M", 64, torch.float16, False), ("L", 128, torch.bfloat16, True), ("L128", 32, torch.float32, True))
    for config, bs, dtype, bias in plan:
        if config not in tiles.TILE_CONFIGS:
            continue
        def run(config=config, bs=bs, dtype=dtype, bias=bias):
            M, N, K = 129, 200, K_FOR_BLOCK[bs]
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=9, scale=2.0)
            qa = wf.quantize_activation_torch(x, bs)
            return wf.linear_w8a8_fused(x, qw, _vector(N, dtype) if bias else None, 1, quantized_A=qa, config=config)
        _add(f"w8a8_fused/{config}-g{bs}-{_DT_NAME[dtype]}-M129-N200-K{K_FOR_BLOCK[bs]}", "w8a8_kblock_fused",
             [_ref(F, "w8a8_kblock_gemm", tiles.TILE_CONFIGS[config].defines(bs))], run)
    # The Hopper wgmma kernel: every block size (1, 2, 4 blocks per K tile and 2 tiles per block),
    # the ragged second M tile holds one row; the TMA producers (M and N split) at the extremes
    # (four blocks' parameters per K tile, two K tiles per block).
    for config, bs, dtype, bias in (("W", 32, torch.float16, True), ("W", 64, torch.bfloat16, False),
                                    ("W", 128, torch.float32, True), ("W", 256, torch.float16, False),
                                    ("WT", 32, torch.bfloat16, True), ("WT", 256, torch.float32, False),
                                    ("WN", 32, torch.float16, True), ("WN", 64, torch.bfloat16, False),
                                    ("WN", 128, torch.float32, True), ("WN", 256, torch.bfloat16, True),
                                    ("WP", 32, torch.bfloat16, False), ("WP", 64, torch.float16, True),
                                    ("WP", 128, torch.float32, False), ("WP", 256, torch.float16, True)):
        cfg = tiles.TILE_CONFIGS[config]
        # WN and WP at block 64 quantize inside the call (QuantA writes the row planes); the others
        # pass pre-quantized A (the planar variants then transpose the row parameters themselves)
        quantize_inside = config in ("WN", "WP") and bs == 64
        def run_wgmma(config=config, bs=bs, dtype=dtype, bias=bias, quantize_inside=quantize_inside):
            M, N, K = 129, 200, K_FOR_BLOCK[bs]
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=12, scale=2.0)
            qa = None if quantize_inside else wf.quantize_activation_torch(x, bs)
            return wf.linear_w8a8_fused(x, qw, _vector(N, dtype) if bias else None, 2, quantized_A=qa, config=config)
        refs = [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs))]
        if quantize_inside:
            refs.append(_ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}"))
        elif cfg.planes:
            refs.append(_ref(cfg.kernel_file, tiles.ROW_PLANES_KERNEL, cfg.defines(bs)))
        _add(f"w8a8_fused/{config}-g{bs}-{_DT_NAME[dtype]}-M129-N200-K{K_FOR_BLOCK[bs]}", "w8a8_kblock_wgmma",
             refs, run_wgmma, min_cc=tiles.WGMMA_CC)
    done = {p[0] for p in plan} | {"W", "WT", "WN", "WP"}
    for c in sorted(set(tiles.TILE_CONFIGS) - done):  # variants added later
        def run_extra(c=c):
            qw = _w8a8_weight(200, 4160, 64)
            x = _activations(129, 4160, torch.float16, seed=10)
            return wf.linear_w8a8_fused(x, qw, None, 0, quantized_A=wf.quantize_activation_torch(x, 64), config=c)
        cfg = tiles.TILE_CONFIGS[c]
        _add(f"w8a8_fused/{c}-g64-f16-M129-N200-K4160", "w8a8_kblock_wgmma" if cfg.wgmma else "w8a8_kblock_fused",
             [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(64))], run_extra,
             min_cc=tiles.WGMMA_CC if cfg.wgmma else 0)
    # Default variant choice (choose_config) with the GPU QuantA inside the call; the last through the
    # public API (linear_w8a8, path="fused": no CUTLASS involved).
    for M, N, bs, dtype, public in ((1, 4097, 64, torch.float16, False), (17, 1000, 128, torch.bfloat16, False),
                                    (32, 640, 64, torch.float32, True)):
        K = K_FOR_BLOCK[bs]
        cfg = tiles.choose_config(M, N)  # M <= 32: the mma.sync kernel on every GPU (wgmma cases above)
        def run_default(M=M, N=N, K=K, bs=bs, dtype=dtype, public=public):
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=11)
            b = _vector(N, dtype)
            if public:
                import cutlass_ops

                return cutlass_ops.linear_w8a8(x, qw, b, "relu6", path="fused")
            return wf.linear_w8a8_fused(x, qw, b, 2)
        _add(f"w8a8_fused/default-{cfg}-g{bs}-{_DT_NAME[dtype]}-M{M}-N{N}-K{K}" + ("-public" if public else ""),
             "w8a8_kblock_fused",
             [_ref(F, "w8a8_kblock_gemm", tiles.TILE_CONFIGS[cfg].defines(bs)),
              _ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}")], run_default)


def _build_block_scaled_cases() -> None:
    from cutlass_ops.w8a8 import block_scaled as bsc
    from cutlass_ops.w8a8 import tiles
    from cutlass_ops.w8a8.block_scaled_plan import REDUCE_KERNEL, SYMMETRIC

    # The block-scaled symmetric kernel (W8A8W_BLOCK_SCALED): every variant once, each block size, ragged M
    # (one row in the second M tile, or fewer than a tile) and N, K not a multiple of the 128-wide K tile
    # (block 64) or blocks spanning two K tiles (256); split-K (grid y, fp32 workspace + reduce) forced where
    # splits > 1, the last slice short; A quantized inside the call (symmetric QuantA) or passed in.
    problems = (("WSB", 64, torch.float16, 17, 200, 576, 3, True), ("WSB", 128, torch.bfloat16, 3, 320, 1024, 1, False),
                ("WSB", 256, torch.float32, 63, 192, 1280, 2, True),
                ("WMB", 64, torch.bfloat16, 129, 200, 576, 5, False),
                ("WNB", 128, torch.float16, 129, 200, 1024, 1, True),
                ("WPB", 256, torch.bfloat16, 129, 1000, 1280, 2, True),
                ("WPB128", 128, torch.float32, 129, 200, 1024, 3, False))
    for config, bs, dtype, M, N, K, splits, inside in problems:
        cfg = tiles.BLOCK_SCALED_CONFIGS[config]
        def run(bs=bs, dtype=dtype, M=M, N=N, K=K, config=config, splits=splits, inside=inside):
            g = torch.Generator().manual_seed(M + N + K + bs)
            weight = bsc.quantize_weight_block_scaled(torch.randn(N, K, generator=g), bs).to(_cuda())
            x = _activations(M, K, dtype, seed=13, scale=2.0)
            qa = None if inside else tuple(t.to(_cuda()) for t in
                                           bsc.quantize_activation_block_scaled_reference(x.cpu(), bs))
            return bsc.linear_w8a8_block_scaled(x, weight, _vector(N, dtype), 1, quantized_A=qa, config=config,
                                                splits=splits)
        refs = [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs))]
        if splits > 1:
            refs.append(_ref(cfg.kernel_file, REDUCE_KERNEL, cfg.defines(bs)))
        if inside:
            refs.append(_ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}", dict(SYMMETRIC)))
        _add(f"w8a8_block_scaled/{config}-g{bs}-{_DT_NAME[dtype]}-M{M}-N{N}-K{K}-s{splits}", "w8a8_kblock_wgmma",
             refs, run, min_cc=tiles.WGMMA_CC)


def build_cases() -> list[Case]:
    if not CASES:
        _build_weight_only_cases()
        _build_converter_cases()
        _build_conv_cases()
        _build_scheme2_helper_cases()
        _build_w8a8_cases()
        _build_block_scaled_cases()
        _build_quantize_weight_cases()
        _build_quant_token_cases()
    return CASES


# ---------------------------------------------------------------------------------------------
# kernel names in the sources (no GPU)
# ---------------------------------------------------------------------------------------------

_NAME_EXPR = r"([A-Za-z_]\w*(?:\s*##\s*\w+)*)"
_EXTERN_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?'
                        + _NAME_EXPR + r"\s*\(")
_DEFINE_RE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$", re.M)


def kernel_names_in_source(text: str) -> set[str]:
    """Every extern "C" __global__ name a .cu text defines: direct definitions and those generated by
    function-like macros, also through macros that call them (``#define ENTRY(M_) extern "C" __global__
    void k_m##M_(...)``, ``#define ENTRIES(T_) ENTRY(T_##1) ENTRY(T_##2)`` + ``ENTRIES(f16)``), whatever
    the #if around them."""
    text = re.sub(r"\\\r?\n", " ", text)           # splice continued lines (before comments, as cpp does)
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    macros = {m.group(1): ([p.strip() for p in m.group(2).split(",")], m.group(3)) for m in _DEFINE_RE.finditer(text)}
    calls = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\s*\(([^()]*)\)") if macros else None

    def names_in(code: str, depth: int) -> set[str]:
        found = {m.group(1) for m in _EXTERN_RE.finditer(code) if "##" not in m.group(1)}
        if calls is None or depth > 8:  # (cpp forbids recursion; the depth only bounds a malformed file)
            return found
        for call in calls.finditer(code):
            params, body = macros[call.group(1)]
            args = dict(zip(params, (a.strip() for a in call.group(2).split(","))))
            expanded = re.sub(r"\s*##\s*", "", re.sub(r"\b\w+\b", lambda w: args.get(w.group(0), w.group(0)), body))
            found |= names_in(expanded, depth + 1)
        return found

    return names_in(_DEFINE_RE.sub("", text), 0)


def source_kernels() -> dict[str, set[str]]:
    """{file name: kernel names} over custom_kernels/kernels/*.cu."""
    return {p.name: kernel_names_in_source(p.read_text()) for p in sorted(KERNEL_DIR.glob("*.cu"))}


def check_coverage(cases: list[Case]) -> int:
    sources = source_kernels()
    defined = {(f, n) for f, names in sources.items() for n in names}
    claimed = {(r.file, r.name) for c in cases for r in c.refs}
    problems = 0
    total = sum(len(v) for v in sources.values())
    print(f"{total} extern \"C\" __global__ kernels in {len(sources)} files of {KERNEL_DIR.relative_to(ROOT)}:")
    for f, names in sources.items():
        hit = {n for n in names if (f, n) in claimed}
        print(f"  {f:24s} {len(hit):3d} / {len(names):3d} reached")
    missing = sorted(defined - claimed)
    unreachable = [(f, n) for f, n in missing if n in UNREACHABLE]
    uncovered = [(f, n) for f, n in missing if n not in UNREACHABLE]
    for f, n in unreachable:
        print(f"  unreachable {f}:{n}: {UNREACHABLE[n]}")
    for f, n in uncovered:
        print(f"  NOT COVERED {f}:{n}")
        problems += 1
    for f, n in sorted(claimed - defined):
        print(f"  UNKNOWN (claimed by a case, not in the sources) {f}:{n}")
        problems += 1
    unmatched = sorted(n for _, n in defined if not any(p in n for p in SANITIZER_PREFIXES))
    for n in unmatched:
        print(f"  NOT MATCHED by the sanitizer filters: {n}")
        problems += 1
    print(f"coverage: {len(defined & claimed)} of {len(defined)} kernels reached by {len(cases)} cases; "
          f"{len(uncovered)} not covered, {len(unreachable)} unreachable, "
          f"{len(claimed - defined)} unknown, {len(unmatched)} outside the sanitizer filters")
    return 1 if problems else 0


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation (no GPU needed with --arch)
# ---------------------------------------------------------------------------------------------

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


def family_names(families: list[str] | None) -> set[str] | None:
    """The families ``--family`` names (aliases expanded); None for all."""
    if not families:
        return None
    wanted: set[str] = set()
    for f in families:  # an alias names one family or several
        alias = ALIASES.get(f, f)
        wanted.update((alias,) if isinstance(alias, str) else alias)
    return wanted


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


# ---------------------------------------------------------------------------------------------
# run-time trace of the launches (which kernels a case really launched)
# ---------------------------------------------------------------------------------------------

class LaunchTrace:
    """Wraps the one launch path (custom_kernels.launch.LaunchShape) to record (source file, kernel
    name) of every launch. Best effort: a missing hook only disables the check."""

    def __init__(self):
        self.current: list[tuple[str, str]] = []
        self.all: set[tuple[str, str]] = set()
        self.active = False

    def _record(self, module_name: str, kernel_name: str) -> None:
        key = (str(module_name).split("@")[0], kernel_name)
        self.current.append(key)
        self.all.add(key)

    def install(self) -> None:
        trace = self
        try:
            from custom_kernels.launch import LaunchShape

            init, launch = LaunchShape.__init__, LaunchShape.launch
            if not getattr(launch, "_sanitize_wrapped", False):
                def init_w(self, kernel, *a, **kw):
                    init(self, kernel, *a, **kw)
                    self._sanitize_module = getattr(getattr(kernel, "module", None), "name", "?")

                def launch_w(self, *a, **kw):
                    trace._record(getattr(self, "_sanitize_module", "?"), self.name)
                    return launch(self, *a, **kw)
                launch_w._sanitize_wrapped = True
                LaunchShape.__init__, LaunchShape.launch = init_w, launch_w
            self.active = True
        except Exception as exc:  # noqa: BLE001
            print(f"note: launch trace off ({exc})")

    def take(self) -> list[tuple[str, str]]:
        out, self.current = self.current, []
        return out


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------

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
