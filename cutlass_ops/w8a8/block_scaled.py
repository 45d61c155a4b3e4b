"""Block-scaled symmetric W8A8 (issue 18): DeepSeek-V3's FP8 recipe in int8.

Activations x [M, K] are quantized symmetric per row and K block of ``block_size`` columns (one scale
sA[m, j] per 1 x bs block, no offset); weights W [N, K] symmetric per bs x bs tile (one scale
sW[n // bs, j] per N block and K block, no offset). With Cq_j the int32 dot product of K block j:

    D[m, n] = act( sum_j sA[m, j] * sW[n // bs, j] * Cq_j[m, n] + bias[n] )

The arithmetic, in float32 with one IEEE rounding per operation (the GPU kernels repeat it bit for
bit: QuantA built with ``QUANT_A_SYMMETRIC``, ``custom_kernels/kernels/quant_a.cu``):

- weight tile:       scale = amax |w| / 127;  q = clamp(round_half_even(w / scale), -127, 127);
                     a tile whose scale is 0 (all zero, or amax / 127 below float32's subnormals)
                     keeps scale 0 and gets q = 0.
- activation block:  s = amax |x| / 127, and s = 1 where that is 0 (so q = rint(x / 1) = 0, no 0 / 0,
                     as the per-token quantizer does);  q = clamp(round_half_even(x / s), -127, 127).

Division by the scale (not a product with 127 / amax): one rounding, the rule QuantA and the
per-token quantizer already follow. w and x widen to float32 exactly and |.| and the maximum are
exact, so the reduction order does not matter.

This module is pure torch (the format, the quantizers, the float64 reference, the layouts the kernel
reads); :func:`linear_w8a8_block_scaled` runs the Hopper kernel through :mod:`.block_scaled_plan`,
imported on its first call.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cutlass_ops._validate import (FLOAT_DTYPES, check_dtype, check_int, check_ndim, check_shape,
                                   parse_activation)

__all__ = [
    "DEFAULT_BLOCK_SIZE", "BlockScaledWeight", "quantize_weight_block_scaled",
    "quantize_activation_block_scaled_reference", "linear_block_scaled_reference", "row_scale_planes",
    "slice_scales", "scale_per_element", "dequantize_tiles", "linear_w8a8_block_scaled",
]

DEFAULT_BLOCK_SIZE = 128
QMAX = 127  # symmetric int8: [-127, 127]


def _check_block_size(block_size, K: int, name: str = "block_size") -> int:
    check_int(block_size, name, minimum=1)
    if K % block_size != 0:
        raise ValueError(f"K={K} must be a multiple of {name}={block_size} (one scale per K block)")
    return block_size


@dataclass(frozen=True, eq=False)  # tensor fields: compare with torch.equal, not ==
class BlockScaledWeight:
    """A weight W [N, K] quantized symmetric per ``block_size`` x ``block_size`` tile.

    qweight: int8 [N, K] in [-127, 127]; scale: float32 [ceil(N / block_size), K / block_size],
    W[n, k] ~= qweight[n, k] * scale[n // block_size, k // block_size]. N need not be a multiple of
    block_size (the last N block is shorter); K must be.
    """

    qweight: torch.Tensor
    scale: torch.Tensor
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        check_dtype(self.qweight, "BlockScaledWeight.qweight", (torch.int8,))
        check_ndim(self.qweight, "BlockScaledWeight.qweight", 2, "[N, K]")
        N, K = self.qweight.shape
        if N < 1 or K < 1:
            raise ValueError(f"BlockScaledWeight.qweight must be non-empty [N, K], got shape {(N, K)}")
        bs = _check_block_size(self.block_size, K, "BlockScaledWeight.block_size")
        check_dtype(self.scale, "BlockScaledWeight.scale", (torch.float32,))
        check_shape(self.scale, "BlockScaledWeight.scale", (-(-N // bs), K // bs),
                    "[ceil(N / block_size), K / block_size]")
        if self.scale.device != self.qweight.device:
            raise ValueError(f"BlockScaledWeight.scale is on {self.scale.device} but qweight is on "
                             f"{self.qweight.device}")
        if not bool(torch.isfinite(self.scale).all()):  # the kernel would write NaN / Inf silently
            raise ValueError("BlockScaledWeight.scale holds NaN or Inf values")

    @property
    def N(self) -> int:
        return self.qweight.shape[0]

    @property
    def K(self) -> int:
        return self.qweight.shape[1]

    @property
    def num_groups(self) -> int:
        """G = K // block_size K blocks."""
        return self.K // self.block_size

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def to(self, device) -> "BlockScaledWeight":
        """A copy with qweight and scale on ``device``."""
        return dataclasses.replace(self, qweight=self.qweight.to(device), scale=self.scale.to(device))

    def scale_per_element(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """scale[n // bs, k // bs] as ``dtype`` [N, K]."""
        return scale_per_element(self.scale, self.N, self.block_size, dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W = q * scale as ``dtype`` [N, K] (exact in float64)."""
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        return dequantize_tiles(self.qweight, self.scale, self.block_size, dtype)


def scale_per_element(scale: torch.Tensor, N: int, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The tile scales [ceil(N / bs), K / bs] spread to [N, K] as ``dtype`` (torch ops only: traceable)."""
    return scale.to(dtype).repeat_interleave(block_size, 0)[:N].repeat_interleave(block_size, 1)


def dequantize_tiles(qweight: torch.Tensor, scale: torch.Tensor, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W = qweight * scale per tile as ``dtype`` [N, K], unchecked (``BlockScaledWeight.dequantize`` checks;
    the backward of the custom op calls this on its saved tensors)."""
    return qweight.to(dtype) * scale_per_element(scale, qweight.shape[0], block_size, dtype)


def _check_finite(t: torch.Tensor, name: str) -> None:
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")


def _divide_by_127(amax: torch.Tensor) -> torch.Tensor:
    # tensor / tensor: one IEEE division per element (torch's CPU scalar path may multiply by 1/127)
    return amax / torch.full_like(amax, float(QMAX))


def _round_clamp(v: torch.Tensor) -> torch.Tensor:
    # torch.round rounds half to even, as the kernels' rintf
    return torch.round(v).clamp_(-QMAX, QMAX).to(torch.int8)


def quantize_weight_block_scaled(w: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> BlockScaledWeight:
    """W [N, K] (float16 / bfloat16 / float32, any device) -> :class:`BlockScaledWeight`, symmetric per
    block_size x block_size tile (module docstring: the arithmetic). K % block_size == 0; N is free."""
    check_dtype(w, "w", FLOAT_DTYPES)
    check_ndim(w, "w", 2, "[N, K]")
    N, K = w.shape
    if N < 1 or K < 1:
        raise ValueError(f"w must be non-empty [N, K], got shape {(N, K)}")
    bs = _check_block_size(block_size, K)
    _check_finite(w, "w")
    NB, G = -(-N // bs), K // bs
    w32 = w.to(torch.float32)
    padded = torch.zeros(NB * bs, K, dtype=torch.float32, device=w.device)  # |0| never raises a tile's amax
    padded[:N] = w32
    amax = padded.abs().reshape(NB, bs, G, bs).amax(dim=(1, 3))
    scale = _divide_by_127(amax)
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)  # scale 0: q = round(w / 1) = 0
    per_element = divisor.repeat_interleave(bs, 0)[:N].repeat_interleave(bs, 1)
    return BlockScaledWeight(_round_clamp(w32 / per_element), scale.contiguous(), bs)


def quantize_activation_block_scaled_reference(x2d: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE):
    """(A_q int8 [M, K], scale float32 [M, K / block_size]) of x2d [M, K] (float16 / bfloat16 / float32):
    symmetric per row and K block, the arithmetic of the module docstring; the GPU QuantA built with
    QUANT_A_SYMMETRIC gives the same bits. NaN / Inf raise ValueError."""
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_ndim(x2d, "x2d", 2, "[M, K]")
    M, K = x2d.shape
    bs = _check_block_size(block_size, K)
    _check_finite(x2d, "x2d")
    G = K // bs
    xb = x2d.to(torch.float32).reshape(M, G, bs)
    scale = _divide_by_127(xb.abs().amax(dim=-1))
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _round_clamp(xb / scale[..., None]).reshape(M, K), scale


def _apply_activation(y: torch.Tensor, act: int) -> torch.Tensor:
    if act == 1:
        return y.clamp_min(0)
    if act == 2:
        return y.clamp(0, 6)
    return y


def linear_block_scaled_reference(x: torch.Tensor, weight: BlockScaledWeight, bias: torch.Tensor | None = None,
                                  act=0, *, quantized_A=None) -> torch.Tensor:
    """float64 D [..., N] = act( sum_j sA[m, j] * sW[n // bs, j] * Cq_j[m, n] + bias[n] ) with x [..., K]
    quantized by :func:`quantize_activation_block_scaled_reference` (or ``quantized_A`` = its (A_q, scale)
    of the flattened x), on x's device. Cq_j is exact (float64 sums of int8 products below 2^53); each
    term sA * sW * Cq is one float64 rounding. bias: None or [N] (any float dtype, used as float64)."""
    if not isinstance(weight, BlockScaledWeight):
        raise TypeError(f"weight must be a BlockScaledWeight, got {type(weight).__name__}")
    act = parse_activation(act, "act")
    K, N, bs = weight.K, weight.N, weight.block_size
    if x.shape[-1] != K:
        raise ValueError(f"x has K={x.shape[-1]} columns but weight has K={K}")
    lead = x.shape[:-1]
    A_q, sA = quantized_A if quantized_A is not None else \
        quantize_activation_block_scaled_reference(x.reshape(-1, K), bs)
    M, G = A_q.shape[0], K // bs
    dev = A_q.device
    A = A_q.to(dev, torch.float64).reshape(M, G, bs)
    B = weight.qweight.to(dev, torch.float64).reshape(N, G, bs)
    sW = weight.scale.to(dev, torch.float64).repeat_interleave(bs, 0)[:N]  # [N, G]: row n's N block
    sA = sA.to(dev, torch.float64)
    D = torch.zeros(M, N, dtype=torch.float64, device=dev)
    for j in range(G):
        D += (sA[:, j, None] * sW[None, :, j]) * (A[:, j] @ B[:, j].T)
    if bias is not None:
        check_shape(bias, "bias", (N,), "[N]")
        D += bias.to(dev, torch.float64)[None, :]
    return _apply_activation(D, act).reshape(*lead, N)


# ------------------------------------------------------------------------------------------------
# the layouts the Hopper kernel reads (w8a8_kblock_wgmma.cu, W8A8W_BLOCK_SCALED)
# ------------------------------------------------------------------------------------------------

def row_scale_planes(scale: torch.Tensor) -> torch.Tensor:
    """Activation scales [M, G] -> the kernel's plane [G, Mp] (Mp = M rounded up to 4, zero padding):
    a K block's scales of 128 consecutive rows are one 16-byte-aligned copy. The GPU QuantA writes this
    layout itself; this is the same from given scales (tests, pre-quantized callers)."""
    M, G = scale.shape
    planes = torch.zeros(G, -(-M // 4) * 4, dtype=torch.float32, device=scale.device)
    planes[:, :M] = scale.T
    return planes


def slice_scales(scale: torch.Tensor, N: int, block_size: int, BN: int) -> torch.Tensor:
    """Weight scales [ceil(N / bs), G] -> float32 [G, ceil(N / BN), 4]: for K block j and the CTA tile t of
    columns [t BN, (t + 1) BN), the scale of each 64-column slice s of the tile, sW[(t BN + 64 s) // bs, j],
    0 where the slice starts at or past N or past BN. One 16-byte copy per tile and block; each slice lies
    in one weight block when bs % 64 == 0."""
    if BN % 64 or not 0 < BN <= 256 or block_size % 64:
        raise ValueError(f"slice scales need BN a multiple of 64 up to 256 and block_size a multiple of 64, "
                         f"got BN={BN}, block_size={block_size}")
    NB, G = scale.shape
    tiles = -(-N // BN)
    start = torch.arange(tiles, device=scale.device)[:, None] * BN + 64 * torch.arange(4, device=scale.device)
    valid = (start < N) & (torch.arange(4, device=scale.device) < BN // 64)
    blocks = torch.where(valid, start // block_size, torch.zeros_like(start))  # [tiles, 4]
    out = scale.to(torch.float32)[blocks] * valid[..., None]  # [tiles, 4, G]
    return out.permute(2, 0, 1).contiguous()


def linear_w8a8_block_scaled(x2d: torch.Tensor, weight: BlockScaledWeight, bias: torch.Tensor | None = None,
                             act=0, *, quantized_A=None, out: torch.Tensor | None = None,
                             config: str | None = None, splits: int | None = None) -> torch.Tensor:
    """D [M, N] = act(QuantA_sym(x2d) (*) weight + bias) on a Hopper GPU (sm_90a): one symmetric QuantA
    launch, then the block-scaled wgmma kernel; D in x2d.dtype (or ``out``, contiguous [M, N] of that dtype).

    x2d: CUDA [M, K] float16 / bfloat16 / float32 (rows may be strided). weight: a
    :class:`BlockScaledWeight` with block_size 64, 128 or 256 (moved to x2d's device once, kept per weight).
    bias: None or [N]. act: 0/1/2 or None/"relu"/"relu6". quantized_A: optional (A_q int8 [M, K],
    scale float32 [M, G]) to use instead of quantizing x2d. config: force a variant (a key of
    ``tiles.BLOCK_SCALED_CONFIGS``). splits: force split-K over that many K slices (1 = none; at most
    ``tiles.k_units(K, block_size)``; None: ``tiles.choose_splits``, more than one only where the output
    tiles leave SMs idle; the result then differs from the unsplit one by float32 rounding only).
    Every argument is checked before any GPU work; other GPUs raise ValueError (the kernel is Hopper's wgmma).
    """
    from .block_scaled_plan import linear  # GPU runtime only when the kernel is first used

    return linear(x2d, weight, bias, act, quantized_A=quantized_A, out=out, config=config, splits=splits)
