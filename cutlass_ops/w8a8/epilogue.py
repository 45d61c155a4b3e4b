"""Scheme 2's per-block epilogue kernels (``custom_kernels/kernels/scheme2_epilogue.cu``):
DequantAndAcc (the 4-term sum of one K block, added with atomics) and BiasAndActivation.

The maths is that of ``cutlass_ops.reference.w8a8_kblock_reference`` (the per-block 4-term sum).
They take preallocated outputs, accept row strides (last dimension contiguous) and keep their
checks cheap: the literal path calls DequantAndAcc once per K block.
"""
from __future__ import annotations

import math

import torch

from cutlass_ops._validate import FLOAT_DTYPES, check_cuda, check_dtype, parse_activation
from custom_kernels.device import on_device
from custom_kernels.launch import I32, I64, KernelArgs, Ptr

from .launches import TAGS, device_index, grid_launches, param_column, rows

__all__ = ["DequantAndAccArgs", "BiasActArgs", "dequant_and_acc_gpu", "bias_and_activation_gpu"]

SOURCE = "scheme2_epilogue.cu"
DEQUANT_BLOCK = (32, 8, 1)
THREADS = 256
MAX_BLOCKS = 65535


class DequantAndAccArgs(KernelArgs):
    _fields_ = [("Cq", Ptr), ("ldc", I64), ("out", Ptr), ("ldo", I64), ("scale_A", Ptr), ("offset_A", Ptr),
                ("sum_A", Ptr), ("ld_a", I64), ("scale_B", Ptr), ("offset_B", Ptr), ("sum_B", Ptr), ("ld_b", I64),
                ("M", I32), ("N", I32), ("block_len", I32)]


class BiasActArgs(KernelArgs):
    _fields_ = [("src", Ptr), ("lds", I64), ("dst", Ptr), ("ldd", I64), ("bias", Ptr), ("M", I32), ("N", I32),
                ("act", I32)]


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
    rows(Cq, "Cq")
    rows(out, "out")
    check_cuda(out, "out")
    check_cuda(Cq, "Cq")
    M, N = out.shape
    if Cq.shape[0] != M or Cq.shape[1] < N:
        raise ValueError(f"Cq must be [M={M}, >= N={N}], got {tuple(Cq.shape)}")
    sA, ld_a = param_column(scale_A, "scale_A", M, group, torch.float32)
    oA, ld_oa = param_column(offset_A, "offset_A", M, group, torch.float32)
    qA, ld_qa = param_column(sum_A, "sum_A", M, group, torch.int32)
    sB, ld_b = param_column(scale_B, "scale_B", N, group, torch.float32)
    oB, ld_ob = param_column(offset_B, "offset_B", N, group, torch.float32)
    qB, ld_qb = param_column(sum_B, "sum_B", N, group, torch.int32)
    if not (ld_a == ld_oa == ld_qa and ld_b == ld_ob == ld_qb):
        raise ValueError("the A parameters (and the B parameters) must share one row stride each")
    if M * N == 0:
        return
    device = device_index(out)
    launches = grid_launches(SOURCE, f"dequant_and_acc_{TAGS[out.dtype]}", DequantAndAccArgs, DEQUANT_BLOCK, device)
    bx, by, _ = DEQUANT_BLOCK
    with on_device(device):
        launches((math.ceil(N / bx), math.ceil(M / by)), Cq=Cq.data_ptr(), ldc=Cq.stride(0), out=out.data_ptr(),
                 ldo=out.stride(0), scale_A=sA, offset_A=oA, sum_A=qA, ld_a=ld_a, scale_B=sB, offset_B=oB,
                 sum_B=qB, ld_b=ld_b, M=M, N=N, block_len=block_len)


def bias_and_activation_gpu(data: torch.Tensor, bias: torch.Tensor | None = None, act=0,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """BiasAndActivation: act(data + bias) in place, or into ``out`` (same dtype, or fp16/bf16 from fp32).

    data: [M, N] float32/fp16/bf16 (row stride free); bias: None or float32 [N] (other float
    dtypes are converted, one extra copy per call); act: 0/None, 1/"relu", 2/"relu6".
    Returns the tensor written (``out`` or ``data``).
    """
    check_dtype(data, "data", FLOAT_DTYPES)
    check_cuda(data, "data")
    rows(data, "data")
    M, N = data.shape
    act = parse_activation(act, "act")
    dst = data if out is None else out
    if out is not None:
        allowed = (data.dtype,) + ((torch.float16, torch.bfloat16) if data.dtype == torch.float32 else ())
        check_dtype(out, "out", allowed)
        check_cuda(out, "out")
        rows(out, "out")
        if tuple(out.shape) != (M, N):
            raise ValueError(f"out must be [M={M}, N={N}] like data, got {tuple(out.shape)}")
    if bias is not None:
        check_dtype(bias, "bias", FLOAT_DTYPES)
        if tuple(bias.shape) != (N,):
            raise ValueError(f"bias must be [N={N}], got {tuple(bias.shape)}")
        bias = bias.to(device=data.device, dtype=torch.float32).contiguous()
    if M * N == 0:
        return dst
    bias_and_activation(data, dst, bias, act)
    return dst


def bias_and_activation(data: torch.Tensor, dst: torch.Tensor, bias: torch.Tensor | None, act: int) -> None:
    """The launch of :func:`bias_and_activation_gpu` without its checks (callers that made the
    tensors themselves): data, dst [M, N] with contiguous rows, bias None or contiguous float32 [N]."""
    M, N = data.shape
    device = device_index(data)
    launches = grid_launches(SOURCE, f"bias_act_{TAGS[data.dtype]}_{TAGS[dst.dtype]}", BiasActArgs, THREADS, device)
    with on_device(device):
        launches(min(math.ceil(M * N / THREADS), MAX_BLOCKS), src=data.data_ptr(), lds=data.stride(0),
                 dst=dst.data_ptr(), ldd=dst.stride(0), bias=0 if bias is None else bias.data_ptr(), M=M, N=N,
                 act=act)
