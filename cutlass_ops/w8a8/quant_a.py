"""QuantA and Precompute_SumBq on the GPU (``custom_kernels/kernels/quant_a.cu``).

QuantA quantizes activations per row and K block (asymmetric, offset form), bit-exact with
``cutlass_ops.formats.quantize_activation_reference``; SumBq sums an int8 weight per row and
K block. The orchestrator calls the single-block QuantA once per K block, so it takes
preallocated outputs, accepts row strides (last dimension contiguous) and keeps its checks cheap.
"""
from __future__ import annotations

import math

import torch

from cutlass_ops._validate import FLOAT_DTYPES, check_block_size, check_cuda, check_dtype
from custom_kernels.device import on_device
from custom_kernels.launch import I32, I64, KernelArgs, Ptr

from .launches import TAGS, device_index, grid_launches, param_column, rows

__all__ = [
    "QuantAArgs", "QuantAWarpArgs", "SumBqArgs", "quantize_activation_gpu", "quantize_activation_planes_gpu",
    "quantize_activation_block_gpu", "sum_bq_gpu", "quantize_rows_into", "quantize_rows_launch", "plane_addresses",
]

SOURCE = "quant_a.cu"
WARP_ITEM_MAX = 1024  # blocks up to this long take one warp each (32 elements per lane at most)
WARPS_PER_BLOCK = 8
SUM_BQ_WARPS = 8


class QuantAArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("lda", I64), ("A_q", Ptr), ("ldq", I64), ("scale", Ptr), ("offset", Ptr),
                ("sum_q", Ptr), ("ld_param", I64), ("g_stride", I64), ("G", I32), ("block_size", I32)]


class QuantAWarpArgs(KernelArgs):
    _fields_ = QuantAArgs._fields_ + [("M", I32)]


class SumBqArgs(KernelArgs):
    _fields_ = [("B_q", Ptr), ("ldb", I64), ("sum_B_q", Ptr), ("N", I32), ("G", I32), ("block_size", I32)]


class BvecArgs(KernelArgs):
    _fields_ = [("B_q", Ptr), ("ldb", I64), ("scale", Ptr), ("offset", Ptr), ("sum_B_q", Ptr), ("bvec", Ptr),
                ("N", I32), ("G", I32), ("block_size", I32)]


BVEC_KERNEL = "precompute_bvec"  # the fused path's weight preparation (w8a8.fused)


def _quant_a_threads(block_size: int) -> int:
    # About 4 elements per thread, 1 to 8 warps.
    return 32 * min(8, max(1, math.ceil(block_size / 128)))


def _quantize_rows(x2d: torch.Tensor, block_size: int | None, planes: bool) -> tuple:
    """QuantA of every (row, K block) of x2d in one launch: (A_q, scale, offset, sum_q) as [M, G],
    or with ``planes`` (A_q, planes [G, 3, M rounded up to 4]) for the fused Hopper kernel."""
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_cuda(x2d, "x2d")
    rows(x2d, "x2d")
    M, K = x2d.shape
    block_size = check_block_size(block_size, K)
    G = K // block_size
    dev = x2d.device
    A_q = torch.empty((M, K), dtype=torch.int8, device=dev)
    if planes:
        Mp = -(-M // 4) * 4
        out = (torch.empty((G, 3, Mp), dtype=torch.float32, device=dev),)
        params, ld_param, g_stride = plane_addresses(out[0].data_ptr(), Mp)
    else:
        out = (torch.empty((M, G), dtype=torch.float32, device=dev), torch.empty((M, G), dtype=torch.float32, device=dev),
               torch.empty((M, G), dtype=torch.int32, device=dev))
        params, ld_param, g_stride = tuple(t.data_ptr() for t in out), G, 1
    quantize_rows_into(x2d, block_size, A_q.data_ptr(), params, ld_param, g_stride)
    return (A_q, *out)


def plane_addresses(base: int, Mp: int) -> tuple[tuple[int, int, int], int, int]:
    """((scale, offset, sum_q) addresses, row stride, block stride) of row parameters written as planes
    [G, 3, Mp] at ``base``: plane p of block g at (3 g + p) Mp (sum_q as its int32 bits)."""
    return (base, base + 4 * Mp, base + 8 * Mp), 1, 3 * Mp


def quantize_rows_launch(dtype: torch.dtype, M: int, K: int, lda: int, block_size: int, device: int, x, A_q,
                         params: tuple, ld_param: int, g_stride: int, defines: tuple = ()):
    """(launches, grid, fields) of QuantA over every (row, K block) of x [M, K] (row stride lda elements) into
    A_q int8 [M, K] and (scale, offset, sum_q) of (row m, block g) at m * ld_param + g * g_stride elements
    from ``params``: the one description behind :func:`quantize_rows_into` (addresses as ints) and the
    recipes (per-call addresses as ``custom_kernels.recipe.At``). ``defines``: the module's build
    (``QUANT_A_SYMMETRIC``: the block-scaled scheme's QuantA, same kernel names)."""
    G = K // block_size
    fields = dict(x=x, lda=lda, A_q=A_q, ldq=K, scale=params[0], offset=params[1], sum_q=params[2],
                  ld_param=ld_param, g_stride=g_stride, G=G, block_size=block_size)
    if block_size <= WARP_ITEM_MAX:  # one warp per (row, block), 8 per thread block
        launches = grid_launches(SOURCE, f"quant_a_warp_{TAGS[dtype]}", QuantAWarpArgs, 32 * WARPS_PER_BLOCK, device,
                                 defines)
        return launches, -(-M * G // WARPS_PER_BLOCK), dict(fields, M=M)
    launches = grid_launches(SOURCE, f"quant_a_{TAGS[dtype]}", QuantAArgs, _quant_a_threads(block_size), device,
                             defines)
    return launches, M * G, fields


def quantize_rows_into(x2d: torch.Tensor, block_size: int, A_q: int, params: tuple[int, int, int], ld_param: int,
                       g_stride: int, defines: tuple = ()) -> None:
    """QuantA of x2d [M, K] (CUDA, a float dtype, rows with a contiguous last dimension, block_size dividing
    K: the caller's checks) into device addresses: A_q int8 [M, K] (row stride K), (scale, offset, sum_q) of
    (row m, block g) at m * ld_param + g * g_stride elements from ``params``. One launch. ``defines``: as
    :func:`quantize_rows_launch`'s."""
    M, K = x2d.shape
    if not M * (K // block_size):
        return
    device = device_index(x2d)
    with on_device(device):
        launches, grid, fields = quantize_rows_launch(x2d.dtype, M, K, x2d.stride(0), block_size, device,
                                                      x2d.data_ptr(), A_q, params, ld_param, g_stride, defines)
        launches(grid, **fields)


def quantize_activation_gpu(x2d: torch.Tensor, block_size: int | None = None):
    """QuantA of x2d [M, K] per row and K block: (A_q int8 [M, K], scale f32 [M, G], offset f32 [M, G], sum_q int32 [M, G]).

    block_size None => one block per row (G = 1). Bit-exact with formats.quantize_activation_reference.
    """
    return _quantize_rows(x2d, block_size, planes=False)


def quantize_activation_planes_gpu(x2d: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """QuantA of x2d [M, K] with the row parameters written as planes: (A_q int8 [M, K], planes
    float32 [G, 3, Mp]) with planes[g, 0, m] = scale, [g, 1, m] = offset and [g, 2, m] the int32
    sum_q's bits (Mp = M rounded up to 4; the fused Hopper kernel copies a block's 128 rows of each
    plane into shared memory). Same values as ``quantize_activation_gpu``; one launch."""
    return _quantize_rows(x2d, block_size, planes=True)


def quantize_activation_block_gpu(x2d: torch.Tensor, k_start: int, block_size: int, A_q: torch.Tensor,
                                  scale: torch.Tensor, offset: torch.Tensor, sum_q: torch.Tensor,
                                  group: int | None = None) -> None:
    """QuantA of the single K block x2d[:, k_start : k_start + block_size] into preallocated buffers.

    A_q: int8 [M, block_size] (row stride free). scale/offset (float32) and sum_q (int32): [M],
    or [M, G] of which column ``group`` (default k_start // block_size) is written.
    """
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_cuda(x2d, "x2d")
    rows(x2d, "x2d")
    M, K = x2d.shape
    if not (isinstance(k_start, int) and isinstance(block_size, int)) or block_size < 1 or k_start < 0 \
            or k_start + block_size > K:
        raise ValueError(f"k_start={k_start!r}, block_size={block_size!r} must select columns inside K={K}")
    check_dtype(A_q, "A_q", (torch.int8,))
    check_cuda(A_q, "A_q")
    rows(A_q, "A_q")
    if A_q.shape[0] != M or A_q.shape[1] < block_size:
        raise ValueError(f"A_q must be [M={M}, >= {block_size}], got {tuple(A_q.shape)}")
    column = k_start // block_size if group is None else group
    s_ptr, ld = param_column(scale, "scale", M, column, torch.float32)
    o_ptr, ld_o = param_column(offset, "offset", M, column, torch.float32)
    q_ptr, ld_q = param_column(sum_q, "sum_q", M, column, torch.int32)
    if not ld == ld_o == ld_q:
        raise ValueError(f"scale, offset and sum_q must share one row stride, got {ld}, {ld_o}, {ld_q}")
    if M == 0:
        return
    device = device_index(x2d)
    launches = grid_launches(SOURCE, f"quant_a_{TAGS[x2d.dtype]}", QuantAArgs, _quant_a_threads(block_size), device)
    with on_device(device):
        launches(M, x=x2d.data_ptr() + k_start * x2d.element_size(), lda=x2d.stride(0), A_q=A_q.data_ptr(),
                 ldq=A_q.stride(0), scale=s_ptr, offset=o_ptr, sum_q=q_ptr, ld_param=ld, g_stride=1, G=1,
                 block_size=block_size)


def sum_bq_gpu(qweight: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """Precompute_SumBq: sum_B_q int32 [N, G], the sum of int8 qweight [N, K] over each K block."""
    check_dtype(qweight, "qweight", (torch.int8,))
    check_cuda(qweight, "qweight")
    rows(qweight, "qweight")
    N, K = qweight.shape
    block_size = check_block_size(block_size, K)
    G = K // block_size
    out = torch.empty((N, G), dtype=torch.int32, device=qweight.device)
    if N * G:
        device = device_index(qweight)
        launches = grid_launches(SOURCE, "precompute_sum_bq", SumBqArgs, 32 * SUM_BQ_WARPS, device)
        with on_device(device):
            launches(math.ceil(N * G / SUM_BQ_WARPS), B_q=qweight.data_ptr(), ldb=qweight.stride(0),
                     sum_B_q=out.data_ptr(), N=N, G=G, block_size=block_size)
    return out


def precompute_bvec_gpu(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                        block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_B_q int32 [N, G], bvec float32 [G, N, 4] = (sB, oB, sB * sum_B_q + block_size * oB, 0)) of the
    int8 CUDA weight qweight [N, K] (rows contiguous) with its float32 scale / offset [N, G], in one launch:
    the fused kernel's per-column data (``w8a8.fused``), bit for bit the float64 torch expression it
    replaces (whose ~10 first launches of torch kernels cost tens of ms in a fresh process)."""
    N, K = qweight.shape
    G = K // block_size
    scale, offset = scale.contiguous(), offset.contiguous()
    sum_B_q = torch.empty((N, G), dtype=torch.int32, device=qweight.device)
    bvec = torch.empty((G, N, 4), dtype=torch.float32, device=qweight.device)
    if N * G:
        device = device_index(qweight)
        launches = grid_launches(SOURCE, BVEC_KERNEL, BvecArgs, 32 * SUM_BQ_WARPS, device)
        with on_device(device):
            launches(math.ceil(N * G / SUM_BQ_WARPS), B_q=qweight.data_ptr(), ldb=qweight.stride(0),
                     scale=scale.data_ptr(), offset=offset.data_ptr(), sum_B_q=sum_B_q.data_ptr(),
                     bvec=bvec.data_ptr(), N=N, G=G, block_size=block_size)
    return sum_B_q, bvec
