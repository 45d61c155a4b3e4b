"""float64 CPU references for every op (pure torch, no GPU runtime).

Each function states the maths it evaluates; the GPU ops are tested against these. Float
results are float64; integer results are exact.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cutlass_ops._validate import (
    FLOAT_DTYPES, check_conv_operands, check_dtype, check_int, check_int8_operands, check_shape,
    parse_activation, parse_pair,
)
from cutlass_ops.formats import QuantizedWeight, quantize_activation_reference

__all__ = [
    "apply_activation", "linear_reference", "conv2d_reference", "int8_gemm_reference",
    "requant_gemm_reference", "w8a8_kblock_reference", "w8a8_dequant_reference",
]

_REF_DTYPES = FLOAT_DTYPES + (torch.float64,)
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def apply_activation(y: torch.Tensor, activation=None) -> torch.Tensor:
    """None / "relu" / "relu6" (or the codes 0 / 1 / 2); relu6 clamps to [0, 6]."""
    act = parse_activation(activation)
    if act == 1:
        return y.clamp_min(0)
    if act == 2:
        return y.clamp(0, 6)
    return y


def _check_qw(qw, name: str = "qw") -> QuantizedWeight:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{name} must be a QuantizedWeight, got {type(qw).__name__}")
    return qw


def _bias64(bias, N: int) -> torch.Tensor | None:
    if bias is None:
        return None
    check_dtype(bias, "bias", _REF_DTYPES)
    check_shape(bias, "bias", (N,), "[N]")
    return bias.to(torch.float64)


def linear_reference(x: torch.Tensor, qw: QuantizedWeight, bias=None, activation=None) -> torch.Tensor:
    """act(x @ dequantize(qw)^T + bias) in float64; x [..., K] -> [..., N]."""
    _check_qw(qw)
    check_dtype(x, "x", _REF_DTYPES)
    if x.dim() < 1 or x.shape[-1] != qw.K:
        raise ValueError(f"x must have shape [..., K={qw.K}], got {tuple(x.shape)}")
    w = qw.to(x.device).dequantize(torch.float64, flat=True)
    y = x.to(torch.float64) @ w.T
    b = _bias64(bias, qw.N)
    if b is not None:
        y = y + b.to(y.device)
    return apply_activation(y, activation)


def conv2d_reference(x: torch.Tensor, qw: QuantizedWeight, bias=None, stride=1, padding=0, dilation=1,
                     activation=None, groups=1) -> torch.Tensor:
    """act(conv2d(x, dequantize(qw), groups=groups) + bias) in float64; x NCHW -> NCHW (F.conv2d in
    float64). The weight is [Co, Ci/groups, Kh, Kw]: output channel co reads input channels
    [g*Ci/groups, (g+1)*Ci/groups) with g = co // (Co/groups)."""
    _check_qw(qw)
    Co, Kh, Kw, Ci = check_conv_operands(x, qw, _REF_DTYPES, groups)
    w = qw.to(x.device).dequantize(torch.float64)
    b = _bias64(bias, Co)
    y = F.conv2d(x.to(torch.float64), w, None if b is None else b.to(x.device),
                 stride=parse_pair(stride, "stride", 1), padding=parse_pair(padding, "padding", 0),
                 dilation=parse_pair(dilation, "dilation", 1), groups=groups)
    return apply_activation(y, activation)


def _exact_int_mm(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """A [M, K] @ B[N, K]^T in int64 (exact for |products sum| < 2^63)."""
    return A.to(torch.int64) @ B.to(torch.int64).T


def int8_gemm_reference(A_q: torch.Tensor, B_q: torch.Tensor) -> torch.Tensor:
    """C[M, N] = sum_k A_q[m, k] * B_q[n, k], exact (int64), returned as int32.

    ValueError if a result does not fit int32 (the GPU accumulator would wrap).
    """
    check_int8_operands(A_q, B_q, "A_q", "B_q")
    C = _exact_int_mm(A_q, B_q)
    if C.numel() and (int(C.min()) < _INT32_MIN or int(C.max()) > _INT32_MAX):
        raise ValueError(f"the int8 GEMM result overflows int32 (K={A_q.shape[1]})")
    return C.to(torch.int32)


def requant_gemm_reference(A_q: torch.Tensor, W_q: torch.Tensor, M: torch.Tensor, fused_bias: torch.Tensor,
                           clamp_min: int = -128, clamp_max: int = 127) -> torch.Tensor:
    """O_q = clamp(round_half_even(M * (Accum32 + FusedBias)), clamp_min, clamp_max) as int8.

    Accum32 = A_q @ W_q^T exactly; M and FusedBias ([N], from ``formats.requant_params``) are
    used in float64 at their stored values.
    """
    check_int8_operands(A_q, W_q, "A_q", "W_q")
    N = W_q.shape[0]
    for name, t in (("M", M), ("fused_bias", fused_bias)):
        check_dtype(t, name, (torch.float32, torch.float64))
        check_shape(t, name, (N,), "[N]")
    check_int(clamp_min, "clamp_min")
    check_int(clamp_max, "clamp_max")
    if not -128 <= clamp_min <= clamp_max <= 127:
        raise ValueError(f"need -128 <= clamp_min <= clamp_max <= 127, got ({clamp_min}, {clamp_max})")
    acc = int8_gemm_reference(A_q, W_q).to(torch.float64)
    out = torch.round(M.to(torch.float64) * (acc + fused_bias.to(torch.float64)))
    return out.clamp(clamp_min, clamp_max).to(torch.int8)


def _kblock_sizes(qw: QuantizedWeight, block_size) -> tuple[int, int]:
    """(activation block size, common sub-block size) for scheme 2."""
    block_size = qw.block_size if block_size is None else check_int(block_size, "block_size", minimum=1)
    small, large = sorted((block_size, qw.block_size))
    if qw.K % block_size != 0 or large % small != 0:
        raise ValueError(f"block_size={block_size} and qw.block_size={qw.block_size} must divide K={qw.K} "
                         f"and one must divide the other")
    return block_size, small


def _flatten_x(x: torch.Tensor, K: int) -> torch.Tensor:
    check_dtype(x, "x", FLOAT_DTYPES)
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"x must have shape [..., K={K}], got {tuple(x.shape)}")
    return x.reshape(-1, K)


def _finish(y: torch.Tensor, x: torch.Tensor, qw: QuantizedWeight, bias, activation) -> torch.Tensor:
    b = _bias64(bias, qw.N)
    if b is not None:
        y = y + b.to(y.device)
    return apply_activation(y, activation).reshape(*x.shape[:-1], qw.N)


def w8a8_kblock_reference(x: torch.Tensor, qw: QuantizedWeight, block_size=None, bias=None,
                          activation=None) -> torch.Tensor:
    """Scheme 2 by its per-block formula, float64: x [..., K] -> [..., N].

    A = QuantA(x, block_size) (``quantize_activation_reference``), B = qw. For each K block i
    (of the smaller of the two block sizes), row m and column n:
      C += sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs_i*oA*oB,   Cq_i = sum_{k in i} A_q B_q,
    then + bias, then the activation. ``block_size`` None => qw.block_size.
    """
    _check_qw(qw)
    x2d = _flatten_x(x, qw.K)
    block_size, kb = _kblock_sizes(qw, block_size)
    A_q, sA, oA, sum_q = quantize_activation_reference(x2d, block_size)
    M, K, N = x2d.shape[0], qw.K, qw.N
    Gs = K // kb
    A_blocks = A_q.to(torch.int64).reshape(M, Gs, kb).transpose(0, 1)        # [Gs, M, kb]
    B_blocks = qw.int_values().to(torch.int64).to(x.device).reshape(N, Gs, kb).transpose(0, 1)
    Cq = torch.bmm(A_blocks, B_blocks.transpose(1, 2)).to(torch.float64)    # [Gs, M, N], exact
    sumA = sum_q if kb == block_size else A_blocks.sum(dim=-1).T            # [M, Gs]
    sumA = sumA.to(torch.float64).T[:, :, None]                             # [Gs, M, 1]
    sumB = B_blocks.sum(dim=-1).to(torch.float64)[:, None, :]               # [Gs, 1, N]
    a_idx = torch.arange(Gs, device=x.device) * kb // block_size           # A group of sub-block i
    b_idx = torch.arange(Gs, device=x.device) * kb // qw.block_size        # W group of sub-block i
    sA = sA.to(torch.float64)[:, a_idx].T[:, :, None]                       # [Gs, M, 1]
    oA = oA.to(torch.float64)[:, a_idx].T[:, :, None]
    sB = qw.scale.to(x.device, torch.float64)[:, b_idx].T[:, None, :]       # [Gs, 1, N]
    oB = qw.offset.to(x.device, torch.float64)[:, b_idx].T[:, None, :]
    C = sA * sB * Cq + sA * oB * sumA + oA * sB * sumB + kb * oA * oB
    return _finish(C.sum(dim=0), x, qw, bias, activation)


def w8a8_dequant_reference(x: torch.Tensor, qw: QuantizedWeight, block_size=None, bias=None,
                           activation=None) -> torch.Tensor:
    """Scheme 2 the direct way, float64: dequantize QuantA(x) and qw, then matmul, bias, activation."""
    _check_qw(qw)
    x2d = _flatten_x(x, qw.K)
    block_size, _ = _kblock_sizes(qw, block_size)
    A_q, sA, oA, _ = quantize_activation_reference(x2d, block_size)
    M, K = A_q.shape
    A = A_q.to(torch.float64).reshape(M, K // block_size, block_size)
    A = (A * sA.to(torch.float64)[..., None] + oA.to(torch.float64)[..., None]).reshape(M, K)
    W = qw.to(x.device).dequantize(torch.float64, flat=True)
    return _finish(A @ W.T, x, qw, bias, activation)
