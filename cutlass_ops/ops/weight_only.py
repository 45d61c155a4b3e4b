"""Weight-only (scheme 1) linear: D[M, N] = act(x[M, K] @ dequantize(qw)^T + bias), raw NVRTC kernels.

Strategies (``strategy=`` forces one; the default picks by M, dtype and GPU):

============== ============================================ =========================================
strategy       kernel (custom_kernels/kernels/)             applies to
============== ============================================ =========================================
gemv_mma       gemv_weight_only.cu ``gemv_mma_mt*``          M <= 64, fp16/bf16, sm_80+; block_size /
               tensor cores with swapped operands, split-K   (32 int4 | 16 int8) a power of two or
                                                             per-channel
gemv_stream    gemv_weight_only.cu ``gemv_stream_m*``        M <= 8, fp16/bf16, any arch; K and
               CUDA cores, two trips of 16-byte loads in     block_size multiples of 32 (int4) or
               flight per lane, activations in shared        16 (int8)
               memory, split-K for small N
gemv_simt      gemv_weight_only.cu ``gemv_simt_m*``          M <= 8, any dtype; block_size % 32 (int4)
               warp per row, fp32 arithmetic                 or % 16 (int8)
gemv_dp4a      gemv_dp4a.cu: q8_1 activations, __dp4a        M <= 8, int8 weights, block_size % 32;
                                                             APPROXIMATE (activations rounded to int8)
gemm_mma       gemm_weight_only.cu ``gemm_mma_mt*``          any M, fp16/bf16, sm_80+; block_size % 16
               mma.sync (weights as the A operand),
               cp.async pipeline
dequant_cublas dequant_weight.cu ``dequant_weight`` writes   any M; fp16 any arch, bf16 sm_80+, fp32;
               W [N, K] in the activation type (transient),  block_size % 8 (int4) or % 4 (int8)
               then torch.addmm / matmul (cuBLAS)
gemm_simt      gemm_weight_only.cu ``gemm_simt``             anything (the fallback)
============== ============================================ =========================================

Default: the first that applies of
  dequant_cublas (fp16/bf16, M >= ``DEQUANT_CUBLAS_MIN_M``),
  ``SMALL_M_GEMV[M]`` (fp16/bf16, sm_80+, M <= 8: "gemv_mma" or "gemv_stream", a table to flip after
  measuring), gemv_mma (fp16/bf16, sm_80+, M <= ``GEMV_MMA_MAX_M``), gemv_simt (M <= 8),
  gemm_mma (fp16/bf16, sm_80+), gemm_simt.
fp32 stays on CUDA cores: a tf32 path would round A and W to 10-bit mantissas (a forced dequant_cublas
in fp32 follows torch's matmul precision setting). gemv_dp4a changes the numerics and is only used
when asked for.

Numerics: the tensor-core kernels dequantize to the activation type (w = q * s + o rounded once, with
s and o rounded to that type) and accumulate in fp32; gemv_stream sums x * q in the activation type
over one 16-byte chunk (32 int4 / 16 int8 products, 16 / 8 per half of a pair; float16 activation
rows with max |x| > 256 (int4) / 32 (int8) are scaled by a power of two first, so no partial sum can
overflow), then applies s and o (rounded to that type) in fp32; dequant_cublas computes
w = fma(q, s, o) in fp32 with fp32 s and o and rounds once to the activation type, then cuBLAS
(fp32 accumulation; torch's reduced-precision-reduction flags apply). The CUDA-core kernels
gemv_simt / gemm_simt compute in fp32 throughout.

Per weight, everything derived once is cached on the QuantizedWeight (attribute ``_kernel_cache``):
the (scale, offset) pairs packed as two 16-bit halves per int32 for the tensor-core and gemv_stream
kernels, and one launch plan per (strategy, M, dtype, device) with its argument block prebuilt, so
that a call only writes the per-call pointers. A plan notices a replaced qweight/scale/offset tensor
or an in-place change of scale/offset and is rebuilt. dequant_cublas keeps no dense copy of W: it is
written to a fresh torch allocation (the caching allocator recycles it) on every call.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import math
import threading
from typing import Callable

import torch
from cuda.bindings import driver

from custom_kernels.launcher import LaunchShape, check, device_capability
from cutlass_ops.ops._loader import load_kernel, on_device
from cutlass_ops.ops.weight_only_variants import (  # noqa: F401  (re-exported)
    _STREAM_MIN_BLOCKS, _STREAM_ROWS, _STREAM_STATIC_SMEM, _STREAM_WARPS, GEMM_CONFIGS, SMALL_M_INT4_GEMV_MMA,
    GemmConfig, GemvMmaConfig, StreamConfig, StreamShape, chunk_elems as _chunk_elems, default_gemm_config,
    default_gemv_mma_config, stream_launch_shape,
)

log = logging.getLogger(__name__)

__all__ = ["STRATEGIES", "GEMV_MMA_MAX_M", "DEQUANT_CUBLAS_MIN_M", "SMALL_M_GEMV", "GemmConfig", "GEMM_CONFIGS",
           "GemvMmaConfig", "StreamConfig", "default_gemv_mma_config",
           "linear_weight_only", "dequantize_weight", "choose_strategy", "strategy_problem", "StreamShape",
           "stream_launch_shape"]

# Every strategy name (benchmarks and tests iterate over this).
STRATEGIES = ("gemv_mma", "gemv_stream", "gemv_simt", "gemv_dp4a", "gemm_mma", "dequant_cublas", "gemm_simt")
# Default switch from the tensor-core GEMV to the GEMM. H200, N = K = 8192, W4A16: gemv_mma 23 us at
# M = 16, 39 us at 32, 62 us at 64; gemm_mma 103-106 us at M = 16..64.
GEMV_MMA_MAX_M = 64
# From this M on, fp16/bf16 go through dequant_cublas. H200, N = K = 8192, W4A16 g128: gemm_mma 149 us
# at M = 256 and 2272 us at M = 4096 (0.37x fp16 cuBLAS: 54 / 808 us). Predicted dequant_cublas: the
# dequantization moves 32 MB + 128 MB (about 40-50 us at 4.25 TB/s), so ~105 us at M = 256 and
# ~860 us (0.94x cuBLAS) at M = 4096; at M = 64 gemv_mma (62 us) beats ~46 + 45 us. To be adjusted
# after measuring (gemm_mma measured 103-106 us at M = 16..64, so M = 65..127 may also gain).
DEQUANT_CUBLAS_MIN_M = 128
# Small-M GEMV per M on sm_80+ fp16/bf16: "gemv_mma" (tensor cores) or "gemv_stream" (CUDA cores).
# Timed side by side (scripts/sweep_gemv.py, H100, W4A16 g128, every variant of each): at M = 1 the
# best of each is within 1-2% (N = K = 8192: 21.9 vs 22.1 us; N = 28672: 56.5 vs 57.3 us), at M = 8
# gemv_stream is 2.4x slower (54.5 vs 22.4 us): gemv_mma everywhere. Default plans are cached per
# weight: a change here (or to DEQUANT_CUBLAS_MIN_M) applies to weights not yet called with that M.
SMALL_M_GEMV: dict[int, str] = {M: "gemv_mma" for M in range(1, 9)}
_GEMV_MMA_LIMIT_M = 64   # kMTiles = 8 tiles of 8 rows
_GEMV_MAX_M = 8          # gemv_simt / gemv_stream / gemv_dp4a instantiate M = 1..8

_ELEMENT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


_CTYPES = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "q": ctypes.c_int64}

# torch's C++ accessor is several times cheaper than torch.cuda.current_stream(); fall back if absent.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device_index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class _Launch:
    """One kernel launch whose argument block is built once; a call rewrites only the ``dynamic`` slots."""

    def __init__(self, kernel, signature: str, grid, block, smem: int, args: list, dynamic: tuple[int, ...],
                 device_index: int):
        fields = [(f"a{i}", _CTYPES[c]) for i, c in enumerate(signature)]
        struct_type = type(f"Args_{kernel.name}", (ctypes.Structure,), {"_fields_": fields})
        self.args = struct_type(*[0 if a is None else a for a in args])
        offsets = [getattr(struct_type, f"a{i}").offset for i in range(len(signature))]
        base = ctypes.addressof(self.args)
        self._ptrs = (ctypes.c_void_p * len(signature))(*[base + o for o in offsets])
        self.params = ctypes.addressof(self._ptrs)
        self.names = tuple(f"a{i}" for i in dynamic)
        self.grid = (tuple(grid) + (1, 1))[:3]
        self.block = (tuple(block) + (1, 1))[:3]
        self.smem = smem
        self.name = kernel.name
        self.device_index = device_index
        with torch.cuda.device(device_index):
            self.function = kernel.function(device_index)
        self._shape = LaunchShape(self.function, self.grid, self.block, smem, name=kernel.name)
        self._lock = threading.Lock()

    def __call__(self, *values) -> None:
        with self._lock:  # the argument block is shared; the launch copies it before returning
            for name, value in zip(self.names, values):
                setattr(self.args, name, value)
            self._shape.launch(_stream(self.device_index), self.params)


# ---------------------------------------------------------------------------------------------
# eligibility
# ---------------------------------------------------------------------------------------------

def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def strategy_problem(strategy: str, M: int, dtype: torch.dtype, qw, cc: int) -> str | None:
    """Why ``strategy`` cannot run this problem (None if it can)."""
    bits, K, bs = qw.bits, qw.K, qw.block_size
    ce = _chunk_elems(bits)
    per_channel = bs == K
    if strategy in ("gemv_mma", "gemm_mma"):
        if dtype == torch.float32:
            return f"{strategy} needs float16/bfloat16 activations, got float32"
        if cc < 80:
            return f"{strategy} needs sm_80+ (mma.m16n8k16), this GPU is sm_{cc}"
    if strategy == "gemv_mma":
        if M > _GEMV_MMA_LIMIT_M:
            return f"gemv_mma takes M <= {_GEMV_MMA_LIMIT_M}, got M={M}"
        if K % ce:
            return f"gemv_mma needs K % {ce} == 0 for {bits}-bit weights, got K={K}"
        if not per_channel and not (bs % ce == 0 and _is_pow2(bs // ce)):
            return f"gemv_mma needs block_size = {ce} * 2^j or per-channel, got block_size={bs}"
    elif strategy == "gemm_mma":
        if bs % 16:
            return f"gemm_mma needs block_size % 16 == 0, got block_size={bs}"
        if K % ce:
            return f"gemm_mma needs K % {ce} == 0 for {bits}-bit weights, got K={K}"
    elif strategy in ("gemv_simt", "gemv_stream"):
        if strategy == "gemv_stream" and dtype == torch.float32:
            return "gemv_stream needs float16/bfloat16 activations, got float32"
        if M > _GEMV_MAX_M:
            return f"{strategy} takes M <= {_GEMV_MAX_M}, got M={M}"
        if K % ce or bs % ce:
            return f"{strategy} needs K and block_size multiples of {ce}, got K={K}, block_size={bs}"
    elif strategy == "dequant_cublas":
        if dtype == torch.bfloat16 and cc < 80:
            return f"dequant_cublas in bfloat16 needs sm_80+ (cuBLAS bf16 GEMM), this GPU is sm_{cc}"
        return _dequant_problem(qw)
    elif strategy == "gemv_dp4a":
        if bits != 8:
            return f"gemv_dp4a needs int8 weights, got bits={bits}"
        if M > _GEMV_MAX_M:
            return f"gemv_dp4a takes M <= {_GEMV_MAX_M}, got M={M}"
        if K % 32 or bs % 32:
            return f"gemv_dp4a needs K and block_size multiples of 32, got K={K}, block_size={bs}"
    elif strategy != "gemm_simt":
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    return None


def choose_strategy(M: int, dtype: torch.dtype, qw, cc: int) -> str:
    """The default strategy for this problem (see the module docstring)."""
    tensor_cores = dtype != torch.float32 and cc >= 80
    order = ["dequant_cublas"] if dtype != torch.float32 and M >= DEQUANT_CUBLAS_MIN_M else []
    if tensor_cores and M in SMALL_M_GEMV:
        if SMALL_M_GEMV[M] not in ("gemv_mma", "gemv_stream"):
            raise ValueError(f"SMALL_M_GEMV[{M}] must be 'gemv_mma' or 'gemv_stream', got {SMALL_M_GEMV[M]!r}")
        order.append(SMALL_M_GEMV[M])
    order += ["gemv_mma"] if tensor_cores and M <= GEMV_MMA_MAX_M else []
    order += ["gemv_simt"] if M <= _GEMV_MAX_M else []
    order += ["gemm_mma"] if tensor_cores else []
    order += ["gemm_simt"]
    for strategy in order:
        if strategy_problem(strategy, M, dtype, qw, cc) is None:
            return strategy
    return "gemm_simt"


# ---------------------------------------------------------------------------------------------
# per-weight cache
# ---------------------------------------------------------------------------------------------

def _cache(qw) -> dict:
    return qw.__dict__.setdefault("_kernel_cache", {})


def _signature(qw) -> tuple:
    """Identity of the tensors a plan points at, plus in-place versions of the ones it repacks."""
    return (qw.qweight.data_ptr(), qw.scale.data_ptr(), qw.offset.data_ptr(), qw.scale._version,
            qw.offset._version)


def _scale_offset_words(qw, dtype: torch.dtype) -> torch.Tensor:
    """int32 [N, G]: scale in the low 16 bits, offset in the high 16 bits, both as ``dtype``."""
    pair = torch.stack((qw.scale.to(dtype), qw.offset.to(dtype)), dim=-1)
    if not bool(torch.isfinite(pair).all()):
        raise ValueError(f"qw.scale/qw.offset overflow {dtype} (the tensor-core kernels dequantize in the "
                         f"activation type); use float32 activations or strategy='gemm_simt'/'gemv_simt'")
    tiny = torch.finfo(dtype).tiny
    if dtype == torch.float16 and bool(((qw.scale.abs() < tiny) & (qw.scale != 0)).any()):
        log.warning("some qw.scale values are below the float16 normal range (%g): they lose relative "
                    "precision in the float16 tensor-core kernels", tiny)
    return pair.contiguous().view(torch.int32).reshape(qw.N, qw.num_groups)


# ---------------------------------------------------------------------------------------------
# plans: one per (strategy, M, dtype, device); each returns run(x, bias, act, out)
# ---------------------------------------------------------------------------------------------

def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _block_shift(qw) -> int:
    """log2(block_size) for power-of-two blocks, 30 for one group per row (k >> 30 == 0), else -1."""
    if qw.num_groups == 1:
        return 30
    return int(math.log2(qw.block_size)) if _is_pow2(qw.block_size) else -1


def _plan_gemv_mma(qw, M: int, dtype, dev: int, config: GemvMmaConfig | None = None) -> Callable:
    if config is None:
        config = default_gemv_mma_config(M, qw.bits)
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits, **config.defines()}
    ce = _chunk_elems(qw.bits)
    K, N, G = qw.K, qw.N, qw.num_groups
    chunks = K // ce
    group_shift = 30 if G == 1 else int(math.log2(qw.block_size // ce))
    m_tiles = next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)
    blocks_n = -(-N // (16 * config.row_tiles))
    # Split K across blocks only when N alone leaves SMs idle (aim for 2 blocks per SM then);
    # each split keeps >= one trip (4 chunks) for each of 8 warps.
    sm = _sm_count(dev)
    if config.splits is not None:
        splits = min(config.splits, max(1, chunks // 4))
    else:
        splits = 1 if blocks_n >= sm else max(1, min(-(-2 * sm // blocks_n), chunks // 32))
    per_split = -(-chunks // splits)
    splits = -(-chunks // per_split)
    warps = config.warps
    while warps > 1 and 4 * warps > per_split:
        warps //= 2
    so = _scale_offset_words(qw, dtype)
    sig = "PPPPPPiiiiiii"
    gemv = _Launch(load_kernel("gemv_weight_only.cu", f"gemv_mma_mt{m_tiles}", sig, defines), sig,
                   (blocks_n, splits), (32 * warps,), 0,
                   [0, qw.qweight.data_ptr(), so.data_ptr(), 0, 0, 0, M, N, K, G, group_shift, per_split, 0],
                   (0, 3, 4, 5, 12), dev)
    return _gemv_run(gemv, splits, M, N, defines, dev, so)


def _gemv_run(gemv: _Launch, splits: int, M: int, N: int, defines: dict, dev: int, keep) -> Callable:
    """run() for a GEMV launch taking (x, bias, out, workspace, act) as its dynamic arguments: direct
    (one split), or into an fp32 workspace [splits, M, N] that splitk_reduce sums in a fixed order."""
    if splits == 1:
        def run(x, bias, act, out):
            gemv(x.data_ptr(), bias, out.data_ptr(), 0, act)
        run.keep = keep
        return run

    rsig = "PPPiiii"
    total = M * N
    reduce = _Launch(load_kernel("gemv_weight_only.cu", "splitk_reduce", rsig, defines), rsig,
                     (min(-(-total // 256), 8 * _sm_count(dev)),), (256,), 0,
                     [0, 0, 0, M, N, splits, 0], (0, 1, 2, 6), dev)

    def run(x, bias, act, out):
        workspace = torch.empty((splits, M, N), dtype=torch.float32, device=x.device)
        gemv(x.data_ptr(), bias, out.data_ptr(), workspace.data_ptr(), act)
        reduce(workspace.data_ptr(), bias, out.data_ptr(), act)
    run.keep = keep
    return run


# ---------------------------------------------------------------------------------------------
# gemv_stream
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _smem_limits(device_index: int) -> tuple[int, int, int]:
    """(shared memory per SM, opt-in maximum per block, reserved per block) in bytes."""
    check(driver.cuInit(0), "cuInit")
    dev = check(driver.cuDeviceGet(device_index), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    return tuple(check(driver.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})")
                 for a in (attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                           attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                           attr.CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK))


def _aligned_qweight(qw) -> torch.Tensor:
    """qw.qweight, or a contiguous 16-byte aligned copy of it (the 16-byte loads need both); the plan keeps it."""
    t = qw.qweight
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    log.info("copying qw.qweight (non-contiguous or not 16-byte aligned) for the 16-byte loads")
    return t.clone(memory_format=torch.contiguous_format)


def _plan_gemv_stream(qw, M: int, dtype, dev: int, config: StreamConfig = StreamConfig()) -> Callable:
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits, **config.defines()}
    ce = _chunk_elems(qw.bits)
    K, N, G = qw.K, qw.N, qw.num_groups
    qweight = _aligned_qweight(qw)
    chunks_per_group = qw.block_size // ce
    group_shift = 30 if G == 1 else (int(math.log2(chunks_per_group)) if _is_pow2(chunks_per_group) else -1)
    sig = "PPPPPPiiiiiii"
    kernel = load_kernel("gemv_weight_only.cu", f"gemv_stream_m{M}", sig, defines)
    sm = _sm_count(dev)
    limits = _smem_limits(dev)
    shape = stream_launch_shape(M, N, K, qw.bits, sm, *limits, config=config)
    kernel.set_max_dynamic_smem(shape.smem)
    threads = 32 * config.warps
    occupancy = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        kernel.function(dev), threads, shape.smem), f"cuOccupancyMaxActiveBlocksPerMultiprocessor("
                      f"gemv_stream_m{M})")
    if occupancy < 1:
        raise RuntimeError(f"gemv_stream_m{M} cannot run with {shape.smem} bytes of shared memory on device {dev}")
    if occupancy != config.min_blocks:
        log.debug("gemv_stream_m%d: %d blocks per SM (expected %d)", M, occupancy, config.min_blocks)
        shape = stream_launch_shape(M, N, K, qw.bits, sm, *limits, blocks_per_sm=occupancy, config=config)
    so = _scale_offset_words(qw, dtype)
    gemv = _Launch(kernel, sig, (shape.grid_x, shape.splits), (threads,), shape.smem,
                   [0, qweight.data_ptr(), so.data_ptr(), 0, 0, 0, N, K, G, group_shift, chunks_per_group,
                    shape.chunks_per_split, 0], (0, 3, 4, 5, 12), dev)
    return _gemv_run(gemv, shape.splits, M, N, defines, dev, (so, qweight))


def _plan_gemv_simt(qw, M: int, dtype, dev: int) -> Callable:
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits}
    sig = "PPPPPPiiiii"
    rows_per_block = 4
    launch = _Launch(load_kernel("gemv_weight_only.cu", f"gemv_simt_m{M}", sig, defines), sig,
                     (-(-qw.N // rows_per_block),), (32 * rows_per_block,), 0,
                     [0, qw.qweight.data_ptr(), qw.scale.data_ptr(), qw.offset.data_ptr(), 0, 0,
                      qw.N, qw.K, qw.num_groups, qw.block_size, 0], (0, 4, 5, 10), dev)

    def run(x, bias, act, out):
        launch(x.data_ptr(), bias, out.data_ptr(), act)
    return run


def _plan_gemv_dp4a(qw, M: int, dtype, dev: int) -> Callable:
    defines = {"WO_ELEMENT": _ELEMENT[dtype]}
    K, N = qw.K, qw.N
    q_blocks = K // 32
    warps = 8
    qsig = "PPPPi"
    quant = _Launch(load_kernel("gemv_dp4a.cu", "quantize_q8_1", qsig, defines), qsig,
                    (-(-q_blocks // warps), M), (32 * warps,), 0, [0, 0, 0, 0, K], (0, 1, 2, 3), dev)
    sig = "PPPPPPPPiiiii"
    rows_per_block = 4
    gemv = _Launch(load_kernel("gemv_dp4a.cu", f"gemv_dp4a_m{M}", sig, defines), sig,
                   (-(-N // rows_per_block),), (32 * rows_per_block,), 0,
                   [0, 0, 0, qw.qweight.data_ptr(), qw.scale.data_ptr(), qw.offset.data_ptr(), 0, 0,
                    N, K, qw.num_groups, qw.block_size, 0], (0, 1, 2, 6, 7, 12), dev)
    q_bytes = M * K  # int8 activations, then float32 d and sum per 32-block (K % 32 == 0 keeps alignment)

    def run(x, bias, act, out):
        buf = torch.empty(q_bytes + 8 * M * q_blocks, dtype=torch.uint8, device=x.device)
        xq = buf.data_ptr()
        xd = xq + q_bytes
        xs = xd + 4 * M * q_blocks
        quant(x.data_ptr(), xq, xd, xs)
        gemv(xq, xd, xs, bias, out.data_ptr(), act)
    return run


def _gemm_mma_smem(m_tile: int, bits: int) -> int:
    """Dynamic shared memory of the gemm_mma kernels: 4 stages of A, B and (scale, offset) tiles."""
    bn, bk, stages = 128, 64, 4
    return stages * (m_tile * bk * 2 + bn * bk * bits // 8 + bn * (bk // 16) * 4)


def _plan_gemm_mma(qw, M: int, dtype, dev: int, config: GemmConfig | None = None) -> Callable:
    config = config or default_gemm_config(M)
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits}
    smem = _gemm_mma_smem(config.m_tile, qw.bits)
    sig = "PPPPPiiiiiii"
    kernel = load_kernel("gemm_weight_only.cu", config.kernel_name(), sig, defines)
    kernel.set_max_dynamic_smem(smem)
    tiles = -(-M // config.m_tile) * -(-qw.N // 128)
    so = _scale_offset_words(qw, dtype)
    launch = _Launch(kernel, sig, (tiles,), (256,), smem,
                     [0, qw.qweight.data_ptr(), so.data_ptr(), 0, 0, M, qw.N, qw.K, qw.num_groups,
                      qw.block_size, _block_shift(qw), 0], (0, 3, 4, 11), dev)

    def run(x, bias, act, out):
        launch(x.data_ptr(), bias, out.data_ptr(), act)
    run.keep = so
    return run


def _plan_gemm_simt(qw, M: int, dtype, dev: int) -> Callable:
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits}
    sig = "PPPPPPiiiiiii"
    launch = _Launch(load_kernel("gemm_weight_only.cu", "gemm_simt", sig, defines), sig,
                     (-(-qw.N // 64), -(-M // 64)), (256,), 0,
                     [0, qw.qweight.data_ptr(), qw.scale.data_ptr(), qw.offset.data_ptr(), 0, 0, M, qw.N,
                      qw.K, qw.num_groups, qw.block_size, _block_shift(qw), 0], (0, 4, 5, 12), dev)

    def run(x, bias, act, out):
        launch(x.data_ptr(), bias, out.data_ptr(), act)
    return run


# ---------------------------------------------------------------------------------------------
# dequant_cublas: dequantize to a transient dense W, then cuBLAS
# ---------------------------------------------------------------------------------------------

_DEQUANT_WARPS = 8          # kWarps in dequant_weight.cu
_DEQUANT_BLOCKS_PER_SM = 2  # its __launch_bounds__ minimum: one wave of persistent blocks
_DEQUANT_WORDS_PER_TILE = 128  # 32 lanes x 16 bytes


def _dequant_problem(qw) -> str | None:
    """Why the dequant_weight kernel cannot handle ``qw`` (None if it can)."""
    word = 32 // qw.bits  # K elements per 32-bit word of qweight
    if qw.block_size % word:
        return f"dequant_cublas needs block_size % {word} == 0 for {qw.bits}-bit weights, got block_size={qw.block_size}"
    if qw.N * qw.K * qw.bits // 8 // 16 >= 2 ** 31:
        return f"dequant_cublas indexes 16-byte chunks with int32, N * K = {qw.N * qw.K} is too large"
    return None


def _plan_dequant(qw, dtype, dev: int) -> Callable:
    """dequant(W) writes q * scale + offset into the contiguous [N, K] ``dtype`` tensor W and returns it."""
    defines = {"WO_ELEMENT": _ELEMENT[dtype], "WO_BITS": qw.bits}
    qweight, scale, offset = _aligned_qweight(qw), qw.scale.contiguous(), qw.offset.contiguous()
    bs = qw.block_size
    chunk_elems = _chunk_elems(qw.bits)
    total_words = qw.N * qw.K * qw.bits // 32
    tiles = total_words // _DEQUANT_WORDS_PER_TILE
    blocks = max(1, min(-(-tiles // _DEQUANT_WARPS), _DEQUANT_BLOCKS_PER_SM * _sm_count(dev)))
    sig = "PPPPqiii"
    launch = _Launch(load_kernel("dequant_weight.cu", "dequant_weight", sig, defines), sig, (blocks,),
                     (32 * _DEQUANT_WARPS,), 0,
                     [qweight.data_ptr(), scale.data_ptr(), offset.data_ptr(), 0, total_words, bs,
                      int(math.log2(bs)) if _is_pow2(bs) else -1, int(bs % chunk_elems == 0)], (3,), dev)

    def dequant(w: torch.Tensor) -> torch.Tensor:
        launch(w.data_ptr())
        return w
    dequant.keep = (qweight, scale, offset)
    return dequant


def _get_dequant(qw, dtype, dev: int) -> Callable:
    cache = _cache(qw)
    key = ("dequant", dtype, dev)
    sig = _signature(qw)
    entry = cache.get(key)
    if entry is not None and entry[0] == sig:
        return entry[1]
    with on_device(dev):
        dequant = _plan_dequant(qw, dtype, dev)
    cache[key] = (sig, dequant)
    return dequant


def _plan_dequant_cublas(qw, M: int, dtype, dev: int) -> Callable:
    N, K = qw.N, qw.K
    # A changed qw rebuilds this plan (_get_plan), and with it the dequantization launch.
    dequant = _get_dequant(qw, dtype, dev)

    def run(x, bias, act, out):
        w = dequant(torch.empty((N, K), dtype=x.dtype, device=x.device))  # transient: back to the allocator
        with torch.no_grad():  # like the raw kernels (out= ops refuse inputs that require grad)
            if bias is None:
                torch.matmul(x, w.t(), out=out)
            else:
                torch.addmm(bias, x, w.t(), out=out)
            if act == 1:
                out.clamp_(min=0)
            elif act == 2:
                out.clamp_(0, 6)
    run.bias_tensor = True  # run() takes the bias tensor (or None), not its address
    return run


_CONFIG_TYPES = {"gemm_mma": GemmConfig, "gemv_mma": GemvMmaConfig, "gemv_stream": StreamConfig}

_PLANNERS = {
    "gemv_mma": _plan_gemv_mma,
    "gemv_stream": _plan_gemv_stream,
    "gemv_simt": _plan_gemv_simt,
    "gemv_dp4a": _plan_gemv_dp4a,
    "gemm_mma": _plan_gemm_mma,
    "dequant_cublas": _plan_dequant_cublas,
    "gemm_simt": _plan_gemm_simt,
}


def _get_plan(qw, M: int, dtype, dev: int, strategy: str | None, config=None) -> Callable:
    cache = _cache(qw)
    key = ("plan", strategy, M, dtype, dev, config)
    sig = _signature(qw)
    entry = cache.get(key)
    if entry is not None and entry[0] == sig:
        return entry[1]
    cc = device_capability(dev)
    chosen = strategy or choose_strategy(M, dtype, qw, cc)
    problem = strategy_problem(chosen, M, dtype, qw, cc)
    if problem is not None:
        raise ValueError(f"strategy={chosen!r} cannot run M={M}, N={qw.N}, K={qw.K}, bits={qw.bits}, "
                         f"block_size={qw.block_size}, dtype={dtype}: {problem}")
    if config is not None and not isinstance(config, _CONFIG_TYPES.get(chosen, ())):
        raise TypeError(f"config for strategy={chosen!r} must be a "
                        f"{_CONFIG_TYPES[chosen].__name__ if chosen in _CONFIG_TYPES else 'None'}, got {config!r}")
    with on_device(dev):
        run = _PLANNERS[chosen](qw, M, dtype, dev, *(() if config is None else (config,)))
    run.strategy = chosen
    run.bias_tensor = getattr(run, "bias_tensor", False)
    cache[key] = (sig, run)
    return run


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------

def dequantize_weight(qw, dtype: torch.dtype = torch.float16, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """W = q * scale + offset as a dense [N, K] ``dtype`` tensor on qw's CUDA device (the kernel of
    strategy "dequant_cublas": fp32 fma with fp32 scale/offset, rounded once to ``dtype``).

    out: optional contiguous [N, K] ``dtype`` tensor on that device, 16-byte aligned, written in full.
    """
    if dtype not in _ELEMENT:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    if not qw.qweight.is_cuda:
        raise ValueError(f"qw must be on a CUDA device, got {qw.qweight.device}")
    problem = _dequant_problem(qw)
    if problem is not None:
        raise ValueError(problem)
    shape = (qw.N, qw.K)
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=qw.qweight.device)
    elif (out.shape != shape or out.dtype != dtype or out.device != qw.qweight.device or not out.is_contiguous()
          or out.data_ptr() % 16):
        raise ValueError(f"out must be a contiguous, 16-byte aligned {list(shape)} {dtype} tensor on "
                         f"{qw.qweight.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    return _get_dequant(qw, dtype, qw.qweight.device.index)(out)


def linear_weight_only(x2d: torch.Tensor, qw, bias: torch.Tensor | None = None, act: int = 0, *,
                       strategy: str | None = None, out: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """act(x2d @ dequantize(qw)^T + bias) -> [M, N] of x2d.dtype.

    x2d: contiguous CUDA [M, K] float16/bfloat16/float32; qw: a QuantizedWeight on the same device;
    bias: [N] or None (converted to x2d.dtype if it differs); act: 0 none, 1 relu, 2 relu6.
    strategy: None (default dispatch) or one of ``STRATEGIES``; out: optional contiguous [M, N]
    tensor of x2d.dtype, 16-byte aligned, written in full. config: a kernel variant for the strategy
    (benchmarks and tests): GemmConfig for "gemm_mma" (None = ``default_gemm_config(M)``),
    GemvMmaConfig for "gemv_mma" (None = ``default_gemv_mma_config(M, bits)``), StreamConfig for
    "gemv_stream" (None = the defaults).
    """
    if not isinstance(x2d, torch.Tensor) or x2d.dtype not in _ELEMENT:
        raise TypeError(f"x2d must be a float16/bfloat16/float32 tensor, got "
                        f"{x2d.dtype if isinstance(x2d, torch.Tensor) else type(x2d).__name__}")
    if x2d.dim() != 2 or x2d.shape[1] != qw.K:
        raise ValueError(f"x2d must be [M, K] with K={qw.K} (qw.K), got shape {tuple(x2d.shape)}")
    if not x2d.is_cuda or x2d.device != qw.qweight.device:
        raise ValueError(f"x2d ({x2d.device}) and qw ({qw.qweight.device}) must be on the same CUDA device")
    if act not in (0, 1, 2):
        raise ValueError(f"act must be 0 (none), 1 (relu) or 2 (relu6), got {act!r}")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"strategy must be None or one of {list(STRATEGIES)}, got {strategy!r}")
    M, N = x2d.shape[0], qw.N
    if not x2d.is_contiguous() or x2d.data_ptr() % 16:
        x2d = x2d.contiguous() if x2d.data_ptr() % 16 == 0 else x2d.clone(memory_format=torch.contiguous_format)
    if bias is not None:
        if bias.shape != (N,):
            raise ValueError(f"bias must be [N] with N={N}, got shape {tuple(bias.shape)}")
        if bias.device != x2d.device:
            raise ValueError(f"bias is on {bias.device} but x2d is on {x2d.device}")
        if bias.dtype != x2d.dtype or not bias.is_contiguous():
            bias = bias.to(x2d.dtype).contiguous()
    if out is None:
        out = torch.empty((M, N), dtype=x2d.dtype, device=x2d.device)
    elif (out.shape != (M, N) or out.dtype != x2d.dtype or out.device != x2d.device or not out.is_contiguous()
          or out.data_ptr() % 16):
        raise ValueError(f"out must be a contiguous, 16-byte aligned [{M}, {N}] {x2d.dtype} tensor on "
                         f"{x2d.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    if M == 0:
        return out
    run = _get_plan(qw, M, x2d.dtype, x2d.device.index, strategy, config)
    run(x2d, bias if run.bias_tensor else (0 if bias is None else bias.data_ptr()), act, out)
    return out
