"""Scheme 2 helper kernels: QuantA, Precompute_SumBq, DequantAndAcc, BiasAndActivation.

Thin launchers over custom_kernels/kernels/quant_a.cu and scheme2_epilogue.cu. The
orchestrator calls them once per K block, so they take preallocated outputs, accept row
strides (last dimension contiguous) and keep their checks cheap. The maths is that of
cutlass_ops.formats.quantize_activation_reference (QuantA, bit-exact) and
cutlass_ops.reference.w8a8_kblock_reference (the per-block 4-term sum).
"""
from __future__ import annotations

import functools
import math

import torch

from cutlass_ops._validate import FLOAT_DTYPES, check_block_size, check_cuda, check_dtype, check_ndim, parse_activation
from cutlass_ops.ops._loader import load_kernel, on_device
from custom_kernels.launcher import Kernel

__all__ = [
    "quantize_activation_gpu", "quantize_activation_planes_gpu", "quantize_activation_block_gpu", "sum_bq_gpu",
    "dequant_and_acc_gpu",
    "bias_and_activation_gpu",
]

_TAGS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_QUANT_A_SIGNATURE = "PqPqPPPqqii"  # x, lda, A_q, ldq, scale, offset, sum_q, ld_param, g_stride, G, bs
_QUANT_A_WARP_SIGNATURE = "PqPqPPPqqiii"  # the same, then M
_WARP_ITEM_MAX = 1024  # blocks up to this long take one warp each (32 elements per lane at most)
_SUM_BQ_SIGNATURE = "PqPiii"
_DEQUANT_ACC_SIGNATURE = "PqPqPPPqPPPqiii"
_BIAS_ACT_SIGNATURE = "PqPqPiii"
_SUM_BQ_WARPS = 8
_DEQUANT_BLOCK = (32, 8, 1)
_THREADS = 256


@functools.lru_cache(maxsize=None)
def _kernel(source: str, name: str, signature: str, device: int) -> Kernel:
    return load_kernel(source, name, signature)


def _device(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """ValueError unless ``t`` is 2-D with a contiguous last dimension (rows may be strided)."""
    check_ndim(t, name, 2)
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")
    return t


def _quant_a_threads(block_size: int) -> int:
    # About 4 elements per thread, 1 to 8 warps.
    return 32 * min(8, max(1, math.ceil(block_size / 128)))


def _param_column(t: torch.Tensor, name: str, rows: int, column: int, dtype: torch.dtype) -> tuple[int, int]:
    """(address of t[0, column] or t[0], row stride) of a per-row parameter: [rows] or [rows, G]."""
    check_dtype(t, name, (dtype,))
    check_cuda(t, name)
    if t.dim() == 1:
        if t.shape[0] != rows:
            raise ValueError(f"{name} must have {rows} rows, got shape {tuple(t.shape)}")
        return t.data_ptr(), t.stride(0)
    check_ndim(t, name, 2)
    if t.shape[0] != rows or not 0 <= column < t.shape[1]:
        raise ValueError(f"{name} [{rows}, G] has no column {column}: shape {tuple(t.shape)}")
    return t.data_ptr() + column * t.stride(1) * t.element_size(), t.stride(0)


def _quantize_rows(x2d: torch.Tensor, block_size: int | None, planes: bool) -> tuple:
    """QuantA of every (row, K block) of x2d in one launch: (A_q, scale, offset, sum_q) as [M, G],
    or with ``planes`` (A_q, planes [G, 3, M rounded up to 4]) for the fused Hopper kernel."""
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_cuda(x2d, "x2d")
    _rows(x2d, "x2d")
    M, K = x2d.shape
    block_size = check_block_size(block_size, K)
    G = K // block_size
    dev = x2d.device
    A_q = torch.empty((M, K), dtype=torch.int8, device=dev)
    if planes:
        Mp = -(-M // 4) * 4
        out = (torch.empty((G, 3, Mp), dtype=torch.float32, device=dev),)
        base = out[0].data_ptr()
        # plane p of block g at (3 g + p) Mp: row stride 1, block stride 3 Mp; sum_q as its int32 bits
        params, ld_param, g_stride = (base, base + 4 * Mp, base + 8 * Mp), 1, 3 * Mp
    else:
        out = (torch.empty((M, G), dtype=torch.float32, device=dev), torch.empty((M, G), dtype=torch.float32, device=dev),
               torch.empty((M, G), dtype=torch.int32, device=dev))
        params, ld_param, g_stride = out, G, 1
    if M * G:
        args = (x2d, x2d.stride(0), A_q, K, *params, ld_param, g_stride, G, block_size)
        if block_size <= _WARP_ITEM_MAX:  # one warp per (row, block), 8 per thread block
            k = _kernel("quant_a.cu", f"quant_a_warp_{_TAGS[x2d.dtype]}", _QUANT_A_WARP_SIGNATURE, _device(x2d))
            grid, threads, args = -(-M * G // 8), 256, (*args, M)
        else:
            k = _kernel("quant_a.cu", f"quant_a_{_TAGS[x2d.dtype]}", _QUANT_A_SIGNATURE, _device(x2d))
            grid, threads = M * G, _quant_a_threads(block_size)
        with on_device(dev):
            k.launch((grid, 1, 1), (threads, 1, 1), args)
    return (A_q, *out)


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
    _rows(x2d, "x2d")
    M, K = x2d.shape
    if not (isinstance(k_start, int) and isinstance(block_size, int)) or block_size < 1 or k_start < 0 \
            or k_start + block_size > K:
        raise ValueError(f"k_start={k_start!r}, block_size={block_size!r} must select columns inside K={K}")
    check_dtype(A_q, "A_q", (torch.int8,))
    check_cuda(A_q, "A_q")
    _rows(A_q, "A_q")
    if A_q.shape[0] != M or A_q.shape[1] < block_size:
        raise ValueError(f"A_q must be [M={M}, >= {block_size}], got {tuple(A_q.shape)}")
    column = k_start // block_size if group is None else group
    s_ptr, ld = _param_column(scale, "scale", M, column, torch.float32)
    o_ptr, ld_o = _param_column(offset, "offset", M, column, torch.float32)
    q_ptr, ld_q = _param_column(sum_q, "sum_q", M, column, torch.int32)
    if not ld == ld_o == ld_q:
        raise ValueError(f"scale, offset and sum_q must share one row stride, got {ld}, {ld_o}, {ld_q}")
    if M == 0:
        return
    k = _kernel("quant_a.cu", f"quant_a_{_TAGS[x2d.dtype]}", _QUANT_A_SIGNATURE, _device(x2d))
    x_ptr = x2d.data_ptr() + k_start * x2d.element_size()
    with on_device(x2d.device):
        k.launch((M, 1, 1), (_quant_a_threads(block_size), 1, 1),
                 (x_ptr, x2d.stride(0), A_q, A_q.stride(0), s_ptr, o_ptr, q_ptr, ld, 1, 1, block_size))


def sum_bq_gpu(qweight: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """Precompute_SumBq: sum_B_q int32 [N, G], the sum of int8 qweight [N, K] over each K block."""
    check_dtype(qweight, "qweight", (torch.int8,))
    check_cuda(qweight, "qweight")
    _rows(qweight, "qweight")
    N, K = qweight.shape
    block_size = check_block_size(block_size, K)
    G = K // block_size
    out = torch.empty((N, G), dtype=torch.int32, device=qweight.device)
    if N * G:
        k = _kernel("quant_a.cu", "precompute_sum_bq", _SUM_BQ_SIGNATURE, _device(qweight))
        with on_device(qweight.device):
            k.launch((math.ceil(N * G / _SUM_BQ_WARPS), 1, 1), (32 * _SUM_BQ_WARPS, 1, 1),
                     (qweight, qweight.stride(0), out, N, G, block_size))
    return out


def dequant_and_acc_gpu(Cq: torch.Tensor, out: torch.Tensor, scale_A: torch.Tensor, offset_A: torch.Tensor,
                        sum_A: torch.Tensor, scale_B: torch.Tensor, offset_B: torch.Tensor, sum_B: torch.Tensor,
                        group: int, block_len: int) -> None:
    """DequantAndAcc (atomicAdd): out[m, n] += sA*(Cq*sB + sumA*oB) + oA*(sumB*sB + block_len*oB).

    Cq: int32 [M, >= N] (row stride free), block ``group``'s int8 GEMM result. out: float32 /
    fp16 / bf16 [M, N]. A parameters (scale_A, offset_A float32; sum_A int32): [M] for this block,
    or [M, G] of which column ``group`` is read. B parameters: [N, G] (scale_B, offset_B float32,
    sum_B int32), column ``group``.
    """
    check_dtype(Cq, "Cq", (torch.int32,))
    check_dtype(out, "out", FLOAT_DTYPES)
    _rows(Cq, "Cq")
    _rows(out, "out")
    check_cuda(out, "out")
    check_cuda(Cq, "Cq")
    M, N = out.shape
    if Cq.shape[0] != M or Cq.shape[1] < N:
        raise ValueError(f"Cq must be [M={M}, >= N={N}], got {tuple(Cq.shape)}")
    sA, ld_a = _param_column(scale_A, "scale_A", M, group, torch.float32)
    oA, ld_oa = _param_column(offset_A, "offset_A", M, group, torch.float32)
    qA, ld_qa = _param_column(sum_A, "sum_A", M, group, torch.int32)
    sB, ld_b = _param_column(scale_B, "scale_B", N, group, torch.float32)
    oB, ld_ob = _param_column(offset_B, "offset_B", N, group, torch.float32)
    qB, ld_qb = _param_column(sum_B, "sum_B", N, group, torch.int32)
    if not (ld_a == ld_oa == ld_qa and ld_b == ld_ob == ld_qb):
        raise ValueError("the A parameters (and the B parameters) must share one row stride each")
    if M * N == 0:
        return
    k = _kernel("scheme2_epilogue.cu", f"dequant_and_acc_{_TAGS[out.dtype]}", _DEQUANT_ACC_SIGNATURE, _device(out))
    bx, by, _ = _DEQUANT_BLOCK
    with on_device(out.device):
        k.launch((math.ceil(N / bx), math.ceil(M / by), 1), _DEQUANT_BLOCK,
                 (Cq, Cq.stride(0), out, out.stride(0), sA, oA, qA, ld_a, sB, oB, qB, ld_b, M, N, block_len))


def bias_and_activation_gpu(data: torch.Tensor, bias: torch.Tensor | None = None, act=0,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """BiasAndActivation: act(data + bias) in place, or into ``out`` (same dtype, or fp16/bf16 from fp32).

    data: [M, N] float32/fp16/bf16 (row stride free); bias: None or float32 [N] (other float
    dtypes are converted, one extra copy per call); act: 0/None, 1/"relu", 2/"relu6".
    Returns the tensor written (``out`` or ``data``).
    """
    check_dtype(data, "data", FLOAT_DTYPES)
    check_cuda(data, "data")
    _rows(data, "data")
    M, N = data.shape
    act = parse_activation(act, "act")
    dst = data if out is None else out
    if out is not None:
        allowed = (data.dtype,) + ((torch.float16, torch.bfloat16) if data.dtype == torch.float32 else ())
        check_dtype(out, "out", allowed)
        check_cuda(out, "out")
        _rows(out, "out")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out must be [M={M}, N={N}] like data, got {tuple(out.shape)}")
    if bias is not None:
        check_dtype(bias, "bias", FLOAT_DTYPES)
        if tuple(bias.shape) != (N,):
            raise ValueError(f"bias must be [N={N}], got {tuple(bias.shape)}")
        bias = bias.to(device=data.device, dtype=torch.float32).contiguous()
    if M * N == 0:
        return dst
    name = f"bias_act_{_TAGS[data.dtype]}_{_TAGS[dst.dtype]}"
    k = _kernel("scheme2_epilogue.cu", name, _BIAS_ACT_SIGNATURE, _device(data))
    blocks = min(math.ceil(M * N / _THREADS), 65535)
    with on_device(data.device):
        k.launch((blocks, 1, 1), (_THREADS, 1, 1), (data, data.stride(0), dst, dst.stride(0), bias, M, N, act))
    return dst
