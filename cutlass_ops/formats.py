"""Quantized formats: the shared ``QuantizedWeight`` layout, quantizers, int4 packing, QuantA.

Pure torch (no GPU runtime): everything here also runs on a machine without a GPU.

Conventions (see the shared data format in the project notes):
- A weight W is [N, K]; D[M, N] = A[M, K] @ W^T. A conv weight [Co, Ci, Kh, Kw] (Ci: input channels
  per group) is stored as [Co, Kh, Kw, Ci] and flattened to N = Co, K = Kh*Kw*Ci, with blocks along
  that K. An int4 conv row is padded with q = 0 to whole 32-bit words (``packed_K``): the padding
  belongs to no block and is never read, so any Kh*Kw*Ci packs.
- Per K block of ``block_size`` elements (G = K // block_size groups per row):
  offset form w = q * scale + offset; zero-point form w = scale * (q - z), offset = -scale * z.
- int4 values q in [-8, 7] are stored as u = q + 8, two per byte.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from cutlass_ops._validate import (
    FLOAT_DTYPES, check_bits, check_block_size, check_dtype, check_int, check_int4_K, check_ndim,
    check_shape, check_tensor,
)

INT4_ORDERS = ("interleaved", "low_first", "high_first")

# Nibble i (bits 4i..4i+3) of each 32-bit word holds element INT4_INTERLEAVE[i] of its 8 K elements:
# the lop3 int4->fp16 converter extracts nibbles (0,4), (1,5), (2,6), (3,7) as the fp16 pairs
# (e0,e1), (e2,e3), (e4,e5), (e6,e7), so e0..e7 must sit in nibbles 0,4,1,5,2,6,3,7.
INT4_INTERLEAVE = (0, 2, 4, 6, 1, 3, 5, 7)
# Element j of the 8 sits in nibble INT4_DEINTERLEAVE[j] (the inverse permutation).
INT4_DEINTERLEAVE = (0, 4, 1, 5, 2, 6, 3, 7)


# --------------------------------------------------------------------------------------------
# int4 packing
# --------------------------------------------------------------------------------------------

def _check_order(order) -> str:
    if order not in INT4_ORDERS:
        raise ValueError(f"order must be one of {list(INT4_ORDERS)}, got {order!r}")
    return order


def pack_int4(q: torch.Tensor, order: str = "interleaved") -> torch.Tensor:
    """Pack signed int4 values q [..., K] (in [-8, 7]) into uint8 [..., K // 2] as u = q + 8.

    order: "interleaved" (the lop3 converter's order, K % 8 == 0), "low_first" (element 2j in
    the low nibble of byte j) or "high_first" (element 2j in the high nibble of byte j).
    """
    _check_order(order)
    check_tensor(q, "q")
    if q.dtype.is_floating_point or q.dtype.is_complex or q.dtype == torch.bool:
        raise TypeError(f"q must have an integer dtype, got {q.dtype}")
    if q.dim() < 1:
        raise ValueError("q must have at least one dimension (K last)")
    K = q.shape[-1]
    if order == "interleaved":
        check_int4_K(K, "q.shape[-1]")
    elif K % 2 != 0:
        raise ValueError(f"q.shape[-1] must be even to pack two int4 values per byte, got K={K}")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"q values must lie in [-8, 7], got [{int(q.min())}, {int(q.max())}]")
    u = (q.to(torch.int32) + 8)
    if order == "interleaved":
        u = u.reshape(*q.shape[:-1], K // 8, 8)[..., list(INT4_INTERLEAVE)].reshape(q.shape)
    first, second = u[..., 0::2], u[..., 1::2]
    if order == "high_first":
        packed = (first << 4) | second
    else:  # interleaved nibbles are laid out low nibble first within each byte (little-endian words)
        packed = first | (second << 4)
    return packed.to(torch.uint8)


def unpack_int4(packed: torch.Tensor, order: str = "interleaved") -> torch.Tensor:
    """Inverse of ``pack_int4``: uint8 [..., K // 2] -> int8 q [..., K] in [-8, 7]."""
    _check_order(order)
    check_dtype(packed, "packed", (torch.uint8,))
    if packed.dim() < 1:
        raise ValueError("packed must have at least one dimension")
    p = packed.to(torch.int32)
    low, high = p & 0xF, p >> 4
    first, second = (high, low) if order == "high_first" else (low, high)
    u = torch.stack((first, second), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    if order == "interleaved":
        K = u.shape[-1]
        check_int4_K(K, "2 * packed.shape[-1]")
        u = u.reshape(*u.shape[:-1], K // 8, 8)[..., list(INT4_DEINTERLEAVE)].reshape(u.shape)
    return (u - 8).to(torch.int8)


def packed_K(K: int, bits: int, conv: bool) -> int:
    """K elements stored per row: int4 conv rows are padded to whole 32-bit words (8 nibbles), so a
    stem's Kh*Kw*Ci = 147 packs as 152; linear rows and int8 rows store exactly K."""
    return -(-K // 8) * 8 if bits == 4 and conv else K


# --------------------------------------------------------------------------------------------
# zero point <-> offset
# --------------------------------------------------------------------------------------------

def offset_to_zero_point(offset: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """z such that scale * (q - z) == q * scale + offset, i.e. z = -offset / scale."""
    return -offset / scale


def zero_point_to_offset(zero_point: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """offset such that q * scale + offset == scale * (q - z), i.e. offset = -scale * z."""
    return -scale * zero_point


# --------------------------------------------------------------------------------------------
# QuantizedWeight
# --------------------------------------------------------------------------------------------

@dataclass(eq=False)  # tensor fields: compare with torch.equal, not ==
class QuantizedWeight:
    """A weight W [N, K] quantized per block of ``block_size`` along K (offset form).

    bits=8: ``qweight`` int8 [N, K]. bits=4: ``qweight`` uint8 [N, K_packed // 2], u = q + 8 packed in
    the interleaved order (``INT4_INTERLEAVE``). ``scale``/``offset``: float32 [N, K // block_size].
    ``conv_shape`` = (Co, Kh, Kw, Ci) for a conv weight stored as [Co, Kh, Kw, Ci] (Ci per group),
    else None. K_packed = K except for int4 conv weights, whose rows are padded with q = 0 to a
    multiple of 8 (``packed_K``; K itself and conv_shape keep the true size).
    """

    qweight: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int
    block_size: int
    N: int
    K: int
    conv_shape: tuple[int, int, int, int] | None = None
    symmetric: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field against the format (ValueError/TypeError naming the field)."""
        _check_bits(self.bits, "QuantizedWeight.bits")
        N = check_int(self.N, "QuantizedWeight.N", minimum=1)
        K = check_int(self.K, "QuantizedWeight.K", minimum=1)
        check_int(self.block_size, "QuantizedWeight.block_size", minimum=1)
        check_block_size(self.block_size, K, "QuantizedWeight.block_size", "K")
        if self.bits == 8:
            check_dtype(self.qweight, "QuantizedWeight.qweight", (torch.int8,))
            check_shape(self.qweight, "QuantizedWeight.qweight", (N, K), "[N, K]")
        else:
            if self.conv_shape is None:
                check_int4_K(K, "QuantizedWeight.K")
            check_dtype(self.qweight, "QuantizedWeight.qweight", (torch.uint8,))
            check_shape(self.qweight, "QuantizedWeight.qweight", (N, self.K_packed // 2), "[N, K_packed // 2]")
        G = K // self.block_size
        for name in ("scale", "offset"):
            t = getattr(self, name)
            check_dtype(t, f"QuantizedWeight.{name}", (torch.float32,))
            check_shape(t, f"QuantizedWeight.{name}", (N, G), "[N, K // block_size]")
            if not bool(torch.isfinite(t).all()):  # the kernels would write NaN/Inf silently
                raise ValueError(f"QuantizedWeight.{name} holds NaN or Inf values")
        for name in ("qweight", "scale", "offset"):  # the kernels index them as dense row-major arrays
            if not getattr(self, name).is_contiguous():
                raise ValueError(f"QuantizedWeight.{name} must be contiguous (call .contiguous() on it)")
        if self.conv_shape is not None:
            Co, Kh, Kw, Ci = self.conv_shape
            if Co != N or Kh * Kw * Ci != K:
                raise ValueError(f"QuantizedWeight.conv_shape={self.conv_shape} does not flatten to "
                                 f"[N={N}, K={K}]")
            self.conv_shape = (int(Co), int(Kh), int(Kw), int(Ci))

    @property
    def num_groups(self) -> int:
        """G = K // block_size quantization groups per row."""
        return self.K // self.block_size

    @property
    def K_packed(self) -> int:
        """K elements stored per qweight row (``packed_K``: K, or an int4 conv row padded to 8)."""
        return packed_K(self.K, self.bits, self.conv_shape is not None)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """Bytes held by qweight, scale and offset."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale, self.offset))

    def int_values(self) -> torch.Tensor:
        """The integer values q as int32 [N, K] (unpacked and de-interleaved for int4)."""
        if self.bits == 8:
            return self.qweight.to(torch.int32)
        return unpack_int4(self.qweight, "interleaved")[:, :self.K].to(torch.int32)  # drop the row padding

    def zero_point(self) -> torch.Tensor:
        """Zero points z = -offset / scale, float32 [N, G]."""
        return offset_to_zero_point(self.offset, self.scale)

    def dequantize(self, dtype: torch.dtype = torch.float32, *, flat: bool = False) -> torch.Tensor:
        """w = q * scale + offset as ``dtype``: [N, K], or [Co, Ci, Kh, Kw] for a conv weight.

        flat=True returns the stored [N, K] view also for a conv weight ([Co, Kh*Kw*Ci]).
        """
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype (w = q * scale + offset is not an "
                            f"integer), got {dtype!r}")
        q = self.int_values().to(dtype).reshape(self.N, self.num_groups, self.block_size)
        w = q * self.scale.to(dtype)[..., None] + self.offset.to(dtype)[..., None]
        w = w.reshape(self.N, self.K)
        if self.conv_shape is not None and not flat:
            w = w.reshape(self.conv_shape).permute(0, 3, 1, 2).contiguous()
        return w

    def to(self, device) -> "QuantizedWeight":
        """A copy with qweight, scale and offset on ``device``."""
        return dataclasses.replace(self, qweight=self.qweight.to(device), scale=self.scale.to(device),
                                   offset=self.offset.to(device))


# --------------------------------------------------------------------------------------------
# Weight quantization
# --------------------------------------------------------------------------------------------

def _check_bits(bits, name: str = "bits") -> int:
    """TypeError unless bits is an int (not a bool or a float such as 8.0); ValueError unless 4 or 8."""
    check_int(bits, name)
    return check_bits(bits, name)


def _check_weight_args(w, name: str, ndim: int, layout: str, bits, symmetric, values: bool = True) -> None:
    """The weight's dtype, shape, bits and symmetric; with ``values`` also its values (``_check_weight_values``)."""
    check_dtype(w, name, FLOAT_DTYPES + (torch.float64,))
    check_ndim(w, name, ndim, layout)
    _check_bits(bits)
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    if values:
        _check_weight_values(w, name)


def _check_weight_values(w: torch.Tensor, name: str) -> None:
    """ValueError if w holds NaN or Inf, or (float64) values that the float32 scale and offset cannot hold."""
    if w.numel() and not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    if w.dtype == torch.float64 and w.numel():
        absmax = float(w.abs().max())
        if absmax > torch.finfo(torch.float32).max:
            raise ValueError(f"{name} has values beyond the float32 range (max |{name}| = {absmax:g}); "
                             f"the float32 scale and offset cannot represent them")


def _quantize(w_nk: torch.Tensor, bits: int, block_size: int, symmetric: bool, method, calibration,
              options):
    from cutlass_ops import quantizers  # the methods (GPTQ, HQQ, ...): loaded by the first quantization

    q, scale, offset = quantizers.quantize(w_nk, bits=bits, block_size=block_size, symmetric=symmetric,
                                           method=method, calibration=calibration, options=options)
    for name, t in (("scale", scale), ("offset", offset)):
        if not bool(torch.isfinite(t).all()):
            raise _nonfinite_param_error(name, w_nk)
    return q, scale, offset


def _nonfinite_param_error(name: str, w: torch.Tensor) -> ValueError:
    return ValueError(f"w: quantization gave a non-finite {name} (values too large for the "
                      f"float32 {name}, max |w| = {float(w.abs().max()):g})")


def _kernel_block_size(w: torch.Tensor, K: int, block_size, default_block: int, conv: bool, bits: int, method,
                       calibration, options) -> int | None:
    """The block size with which the minmax kernel (``quantizers.minmax_cuda``) quantizes w, or None where the
    torch path runs: a CPU or empty weight, another method, calibration or options, or a block_size / K that
    the torch path rejects (it raises its errors in its own order). ``default_block``: what None means."""
    if not (w.is_cuda and w.numel() and isinstance(method, str) and method == "minmax" and calibration is None):
        return None
    if options is not None and not (isinstance(options, Mapping) and len(options) == 0):
        return None
    if block_size is None:
        block_size = default_block
    elif isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        return None
    if K % block_size or (bits == 4 and not conv and K % 8):
        return None
    from cutlass_ops.quantizers.minmax_cuda import MAX_K

    return block_size if K <= MAX_K else None


def _quantize_cuda(w: torch.Tensor, bits: int, block_size: int, symmetric: bool, K_packed: int):
    """(qweight, scale, offset) of the CUDA weight w by the minmax kernel, raising the torch path's errors
    from the kernel's flags (read with one host synchronisation)."""
    from cutlass_ops.quantizers import minmax_cuda

    qweight, scale, offset, flags = minmax_cuda.quantize_minmax_cuda(w, bits, block_size, symmetric, K_packed)
    if flags:
        if flags & minmax_cuda.INPUT_FLAGS:
            _check_weight_values(w, "w")  # its messages need max |w|: torch, on this error path only
        for name, bit in (("scale", minmax_cuda.NONFINITE_SCALE), ("offset", minmax_cuda.NONFINITE_OFFSET)):
            if flags & bit:
                raise _nonfinite_param_error(name, w)
        raise RuntimeError(f"quantize_weight.cu flagged {flags:#x}, which the torch checks do not confirm")
    return qweight, scale, offset


def _kernel_weight(qweight, scale, offset, bits: int, block_size: int, N: int, K: int, conv_shape,
                   symmetric: bool) -> QuantizedWeight:
    """The QuantizedWeight of the kernel's outputs, built without ``validate``: they are well formed by
    construction and the kernel checked scale and offset finite, while validate's isfinite checks would be
    the first launches of two torch kernels (tens of ms in a fresh process)."""
    values = dict(qweight=qweight, scale=scale, offset=offset, bits=bits, block_size=block_size, N=N, K=K,
                  conv_shape=conv_shape, symmetric=symmetric)
    qw = object.__new__(QuantizedWeight)
    for field in dataclasses.fields(QuantizedWeight):  # a KeyError if a new field is not set here
        setattr(qw, field.name, values[field.name])
    return qw


def _pack(q: torch.Tensor, bits: int, K_packed: int | None = None) -> torch.Tensor:
    """q [N, K] as stored: int8, or int4 packed after padding the rows with q = 0 up to ``K_packed``."""
    if bits == 8:  # contiguous: a transposed w's q keeps w's strides through the elementwise ops
        return q.to(torch.int8).contiguous()
    if K_packed is not None and K_packed != q.shape[1]:
        q = torch.nn.functional.pad(q, (0, K_packed - q.shape[1]))
    return pack_int4(q, "interleaved")


def quantize_weight(w: torch.Tensor, *, bits: int = 8, block_size: int | None = 128,
                    symmetric: bool = True, method: str = "minmax",
                    calibration: torch.Tensor | None = None, options: dict | None = None) -> QuantizedWeight:
    """Quantize w [N, K] per block of ``block_size`` along K (None => per output channel).

    method="minmax" (default):
    symmetric: scale = absmax / qmax (qmax 127 or 7), offset = 0.
    asymmetric: scale = (max - min) / (2^bits - 1), offset = max - qmax * scale.
    q = clamp(round_half_even((w - offset) / scale), qmin, qmax). A zero block (symmetric) or a
    zero-range block (asymmetric) gets scale 1 (and offset = max), so it round-trips exactly.
    A CUDA weight is quantized so by one NVRTC kernel (``quantizers.minmax_cuda``), bit for bit as on the CPU.

    Other methods ("mse", "hqq", "imatrix", "gptq"; see ``cutlass_ops.quantizers``) choose the
    scale/offset (and, for "gptq", the integers) to lower the error, in the same format.
    calibration: layer inputs X [*, K] for "imatrix" and "gptq" (ValueError if missing there or
    given to another method). options: a dict of the method's options, e.g. {"act_order": True}.
    """
    _check_weight_args(w, "w", 2, "[N, K]", bits, symmetric, values=False)
    N, K = w.shape
    kernel_block = _kernel_block_size(w, K, block_size, K, False, bits, method, calibration, options)
    if kernel_block is not None:  # a CUDA weight, default method: one NVRTC launch instead of ~15 torch ops
        qweight, scale, offset = _quantize_cuda(w, bits, kernel_block, symmetric, K)
        return _kernel_weight(qweight, scale, offset, bits, kernel_block, N, K, None, symmetric)
    _check_weight_values(w, "w")
    block_size = check_block_size(block_size, K)
    if bits == 4:
        check_int4_K(K, "w.shape[1]")
    q, scale, offset = _quantize(w, bits, block_size, symmetric, method, calibration, options)
    return QuantizedWeight(_pack(q, bits), scale, offset, bits, block_size, N, K, None, symmetric)


def quantize_conv_weight(w: torch.Tensor, *, bits: int = 8, block_size: int | None = None,
                         symmetric: bool = True, method: str = "minmax",
                         calibration: torch.Tensor | None = None,
                         options: dict | None = None) -> QuantizedWeight:
    """Quantize a conv weight [Co, Ci, Kh, Kw]: stored as [Co, Kh, Kw, Ci] = [N, K = Kh*Kw*Ci].

    Ci is the weight's own dim 1 (input channels per group for a grouped conv). Blocks run along
    K in the stored order (kh, kw, ci); ``block_size`` must divide K: a divisor of Ci gives blocks
    within each (kh, kw), a multiple of Ci blocks of whole (kh, kw) positions (a depthwise 3x3
    weight, Ci = 1, takes block_size=9: one block per output channel). None => one block per
    (co, kh, kw) over the whole Ci (G = Kh*Kw groups per output channel). int4 takes any K: rows
    are padded with q = 0 to a multiple of 8 (``packed_K``). method/calibration/options as in
    ``quantize_weight``; calibration rows are im2col patches in the stored K order (kh, kw, ci).
    """
    _check_weight_args(w, "w", 4, "[Co, Ci, Kh, Kw]", bits, symmetric, values=False)
    Co, Ci, Kh, Kw = w.shape
    K = Kh * Kw * Ci
    kernel_block = _kernel_block_size(w, K, block_size, Ci, True, bits, method, calibration, options)
    if kernel_block is not None:  # read in place as [Co, Kh, Kw, Ci]: no permuted copy either
        qweight, scale, offset = _quantize_cuda(w, bits, kernel_block, symmetric, packed_K(K, bits, conv=True))
        return _kernel_weight(qweight, scale, offset, bits, kernel_block, Co, K, (Co, Kh, Kw, Ci), symmetric)
    _check_weight_values(w, "w")
    block_size = Ci if block_size is None else check_block_size(block_size, K, "block_size", "Kh*Kw*Ci")
    w_nk = w.permute(0, 2, 3, 1).reshape(Co, K)
    q, scale, offset = _quantize(w_nk, bits, block_size, symmetric, method, calibration, options)
    return QuantizedWeight(_pack(q, bits, packed_K(K, bits, conv=True)), scale, offset, bits, block_size, Co, K,
                           (Co, Kh, Kw, Ci), symmetric)


# --------------------------------------------------------------------------------------------
# Activation quantization (QuantA, scheme 2)
# --------------------------------------------------------------------------------------------

def quantize_activation_reference(x: torch.Tensor, block_size: int | None = None):
    """QuantA per row and per K block: (A_q int8 [M,K], scale f32 [M,G], offset f32 [M,G], sum_q int32 [M,G]).

    Evaluated in float32, one IEEE-rounded operation at a time, in the kernels' order (no FMA):
      scale  = (max - min) / 255
      offset = max - (scale * 127)
      q      = clamp(rint((x - offset) / scale), -128, 127)   (rint: round half to even)
    A zero-range block (scale == 0, i.e. max == min) gets scale = 1 and offset = max, so q = 0
    reproduces it exactly. sum_q is the int32 sum of q over the block.
    """
    check_dtype(x, "x", FLOAT_DTYPES)
    check_ndim(x, "x", 2, "[M, K]")
    block_size = check_block_size(block_size, x.shape[1])
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError("x contains NaN or Inf")
    return quant_a_blocks(x, block_size)


def quant_a_blocks(x2d: torch.Tensor, block_size: int):
    """The arithmetic of :func:`quantize_activation_reference` without its checks, on x's device
    (the GPU path's torch fallback shares it, so the two are bit-identical)."""
    M, K = x2d.shape
    G = K // block_size
    xb = x2d.to(torch.float32).reshape(M, G, block_size)
    x_max, x_min = xb.amax(dim=-1), xb.amin(dim=-1)
    # Tensor / tensor division: torch's CPU scalar-division path may multiply by a reciprocal.
    scale = (x_max - x_min) / torch.full_like(x_max, 255.0)
    offset = x_max - scale * 127.0
    zero_range = scale == 0
    scale = torch.where(zero_range, torch.ones_like(scale), scale)
    offset = torch.where(zero_range, x_max, offset)
    q = torch.round((xb - offset[..., None]) / scale[..., None]).clamp_(-128, 127).to(torch.int8)
    sum_q = q.sum(dim=-1, dtype=torch.int32)
    return q.reshape(M, K), scale, offset, sum_q


# --------------------------------------------------------------------------------------------
# Requantization parameters (ConvInt8: int8 in, int8 out)
# --------------------------------------------------------------------------------------------

def _per_channel(v, name: str, N: int, f64: dict) -> torch.Tensor:
    t = torch.as_tensor(v, **f64)
    if t.dim() == 0:
        return t.expand(N)
    return check_shape(t, name, (N,), "[N]")


def requant_params(S_I: float, Z_I: float, S_W, W_q: torch.Tensor, B_fp, S_O: float, Z_O: float):
    """Fold input/weight/output quantization into (M [N], FusedBias [N]), float32.

    With I_fp = S_I (I_q - Z_I), W_fp = S_W W_q (symmetric weights), O_q = O_fp / S_O + Z_O:
      O_q = M * (Accum32 + FusedBias),  M = S_I * S_W / S_O,
      FusedBias = -Z_I * sum_k W_q + B_fp / (S_I * S_W) + Z_O / M.
    Computed in float64, returned as float32 (what the kernels consume). S_W: scalar or [N];
    B_fp: None, scalar or [N].
    """
    check_dtype(W_q, "W_q", (torch.int8, torch.int32, torch.int64))
    check_ndim(W_q, "W_q", 2, "[N, K]")
    N = W_q.shape[0]
    for name, v in (("S_I", S_I), ("S_O", S_O)):
        if float(v) == 0.0:
            raise ValueError(f"{name} must be nonzero, got {v}")
    f64 = dict(dtype=torch.float64, device=W_q.device)
    S_W = _per_channel(S_W, "S_W", N, f64)
    if bool((S_W == 0).any()):
        raise ValueError("S_W must be nonzero")
    B = torch.zeros(N, **f64) if B_fp is None else _per_channel(B_fp, "B_fp", N, f64)
    M = float(S_I) * S_W / float(S_O)
    sum_w = W_q.to(torch.int64).sum(dim=1).to(torch.float64)
    fused_bias = -float(Z_I) * sum_w + B / (float(S_I) * S_W) + float(Z_O) / M
    return M.to(torch.float32), fused_bias.to(torch.float32)
