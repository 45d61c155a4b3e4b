"""The default ("minmax") quantization of a CUDA weight in one launch (``custom_kernels/kernels/quantize_weight.cu``).

Bit for bit what :mod:`cutlass_ops.quantizers.minmax` and ``formats``' packing give on the CPU (the .cu
header says why), without that path's ~15 float64 torch ops, whose first launches in a fresh process
cost ~200 ms on an H100; the cubin ships prebuilt and loads in about a millisecond. The weight is read
in place with its strides (a conv weight [Co, Ci, Kh, Kw] in the stored K order (kh, kw, ci)), the
outputs are fresh ``torch.empty`` tensors, and the per-row NaN / Inf flags come back with one host
synchronisation; :func:`cutlass_ops.formats.quantize_weight` raises its own errors from them.
"""
from __future__ import annotations

import functools
import operator

import torch

from cutlass_ops._validate import check_cuda, check_dtype
from cutlass_ops.w8a8.launches import device_index, grid_launches
from custom_kernels.device import on_device
from custom_kernels.launch import I32, I64, KernelArgs, Ptr

__all__ = ["SOURCE", "TAGS", "MAX_K", "NONFINITE_W", "W_BEYOND_FLOAT32", "NONFINITE_SCALE", "NONFINITE_OFFSET",
           "INPUT_FLAGS", "QuantizeWeightArgs", "kernel", "threads", "quantize_minmax_cuda"]

SOURCE = "quantize_weight.cu"
TAGS = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64"}
MAX_WARPS = 8                 # kMaxWarps: at most 256 threads per row
MAX_K = 2 ** 30               # int32 element indices, with room for the loops' last stride
# flags[n] bits (quant_w::Flag)
NONFINITE_W, W_BEYOND_FLOAT32, NONFINITE_SCALE, NONFINITE_OFFSET = 1, 2, 4, 8
INPUT_FLAGS = NONFINITE_W | W_BEYOND_FLOAT32


class QuantizeWeightArgs(KernelArgs):
    _fields_ = [("w", Ptr), ("s_n", I64), ("s_ci", I64), ("s_kh", I64), ("s_kw", I64), ("Ci", I32), ("Kw", I32),
                ("K", I32), ("K_packed", I32), ("block_size", I32), ("symmetric", I32), ("qweight", Ptr),
                ("scale", Ptr), ("offset", Ptr), ("flags", Ptr)]


def kernel(dtype: torch.dtype, bits: int) -> tuple[str, str, dict[str, int]]:
    """(source, kernel, defines) quantizing a ``dtype`` weight to ``bits`` bits."""
    return SOURCE, f"quantize_weight_w{bits}_{TAGS[dtype]}", {}


def threads(K: int) -> int:
    """Threads per row: about 256 K elements per warp, 1 to 8 warps."""
    return 32 * min(MAX_WARPS, max(1, -(-K // 256)))


def quantize_minmax_cuda(w: torch.Tensor, bits: int, block_size: int, symmetric: bool, K_packed: int):
    """Quantize the CUDA weight w, [N, K] or a conv weight [Co, Ci, Kh, Kw] (N = Co, K = Kh*Kw*Ci in the
    order (kh, kw, ci)), per block of ``block_size`` along K with method "minmax".

    Returns (qweight, scale, offset, flags): qweight int8 [N, K] (bits 8) or uint8 [N, K_packed // 2]
    (bits 4, interleaved, rows padded with q = 0 to ``K_packed``), scale and offset float32 [N, G], and
    flags, the OR of the rows' flag bits (``NONFINITE_W``, ``W_BEYOND_FLOAT32``, ``NONFINITE_SCALE``,
    ``NONFINITE_OFFSET``; 0 when all is well).
    """
    check_dtype(w, "w", tuple(TAGS))
    check_cuda(w, "w")
    if w.dim() == 2:
        N, K = w.shape
        Ci, Kw = K, 1
        strides = (w.stride(0), w.stride(1), 0, 0)
    elif w.dim() == 4:
        N, Ci, Kh, Kw = w.shape
        K = Kh * Kw * Ci
        strides = (w.stride(0), w.stride(1), w.stride(2), w.stride(3))
    else:
        raise ValueError(f"w must be 2-D [N, K] or 4-D [Co, Ci, Kh, Kw], got shape {tuple(w.shape)}")
    if not 0 < K <= MAX_K or N < 1:
        raise ValueError(f"w must have 1 <= K <= {MAX_K} and N >= 1, got N={N}, K={K}")
    # cheap guards for the kernel's indexing (formats' checks come first and name the user's arguments)
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    if block_size < 1 or K % block_size:
        raise ValueError(f"block_size={block_size} must divide K={K}")
    if K_packed != K and not (bits == 4 and K_packed == -(-K // 8) * 8):
        raise ValueError(f"K_packed={K_packed} must be K={K} (or, int4, K rounded up to 8)")
    if bits == 4 and K_packed % 8:
        raise ValueError(f"K_packed={K_packed} must be a multiple of 8 for int4 (8 nibbles per word)")
    G = K // block_size
    dev = w.device
    if bits == 8:
        qweight = torch.empty((N, K), dtype=torch.int8, device=dev)
    else:
        qweight = torch.empty((N, K_packed // 2), dtype=torch.uint8, device=dev)
    scale = torch.empty((N, G), dtype=torch.float32, device=dev)
    offset = torch.empty((N, G), dtype=torch.float32, device=dev)
    flags = torch.empty((N,), dtype=torch.int32, device=dev)  # every row writes its word: no zeroing launch
    device = device_index(w)
    source, name, _ = kernel(w.dtype, bits)
    launches = grid_launches(source, name, QuantizeWeightArgs, threads(K), device)
    with on_device(device):
        launches(N, w=w.data_ptr(), s_n=strides[0], s_ci=strides[1], s_kh=strides[2], s_kw=strides[3], Ci=Ci,
                 Kw=Kw, K=K, K_packed=K_packed, block_size=block_size, symmetric=int(symmetric),
                 qweight=qweight.data_ptr(), scale=scale.data_ptr(), offset=offset.data_ptr(),
                 flags=flags.data_ptr())
    row_flags = flags.cpu()  # the one synchronisation
    found = functools.reduce(operator.or_, row_flags.unique().tolist(), 0) if bool(row_flags.any()) else 0
    return qweight, scale, offset, found
