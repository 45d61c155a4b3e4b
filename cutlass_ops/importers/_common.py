"""Shared pieces of the checkpoint importers: the result type, int32 word unpacking, act-order.

Pure torch. Every importer builds its ``QuantizedWeight`` through ``build_weight`` from the
signed integers q [N, K] and float32 scale/offset [N, G] it derived, so the packing into the
project's layout (int8 [N, K], or int4 interleaved ``pack_int4``) happens in one place.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cutlass_ops.formats import QuantizedWeight, pack_int4


class UnsupportedFormatError(ValueError):
    """The checkpoint uses a format or option that ``QuantizedWeight`` cannot hold exactly."""


@dataclass(frozen=True, eq=False)  # tensor fields: compare with torch.equal, not ==
class Imported:
    """An imported weight, and the K permutation it needs (act-order) or None.

    ``weight`` holds W[:, perm] (its K columns permuted so that each quantization group is a
    contiguous block of ``block_size``); the layer computes ``apply_perm(x, perm) @ W_perm^T``,
    which equals ``x @ W^T``. ``perm`` is int64 [K], or None when no permutation is needed.
    """

    weight: QuantizedWeight
    perm: torch.Tensor | None = None


def apply_perm(x: torch.Tensor, perm: torch.Tensor | None) -> torch.Tensor:
    """x[..., perm] (x unchanged when perm is None): the activation side of an act-order layer."""
    if perm is None:
        return x
    if x.shape[-1] != perm.numel():
        raise ValueError(f"x.shape[-1]={x.shape[-1]} does not match perm of length K={perm.numel()}")
    return x.index_select(-1, perm.to(device=x.device, dtype=torch.long))


def bits_per_weight(qw: QuantizedWeight) -> float:
    """Storage bits per weight element: (qweight + scale + offset bytes) * 8 / (N * K).

    scale and offset are float32 in ``QuantizedWeight``: 4-bit with block 128 gives
    4 + 2 * 32 / 128 = 4.5 (fp16 scale and offset would give 4.25; fp16 scale alone, 4.125).
    """
    return qw.nbytes * 8 / (qw.N * qw.K)


def check_bits(bits, name: str, allowed=(4, 8), source: str = "") -> int:
    """UnsupportedFormatError unless ``bits`` is in ``allowed`` (QuantizedWeight holds 4 or 8)."""
    if isinstance(bits, bool) or bits not in allowed:
        what = f"{source} " if source else ""
        raise UnsupportedFormatError(
            f"{name}={bits!r} is not supported: {what}import needs bits in {list(allowed)} "
            f"(QuantizedWeight holds 4- or 8-bit integers)")
    return int(bits)


def check_int32(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32 (packed words), got {t.dtype}")
    return t


def check_float(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"{name} must have dtype float16, bfloat16 or float32, got {t.dtype}")
    if t.numel() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return t


def check_packed(qweight, qzeros, scales) -> None:
    """The three tensors of a GPTQ / AWQ layer: int32 packed qweight and qzeros, float scales, 2-D."""
    check_int32(qweight, "qweight")
    check_int32(qzeros, "qzeros")
    check_float(scales, "scales")
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(t.shape)}")


def check_2d(t: torch.Tensor, name: str, expected: tuple, layout: str) -> torch.Tensor:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} {layout}, got {tuple(t.shape)}")
    return t


def resolve_group_size(group_size, K: int, name: str = "group_size") -> int:
    """-1 / None / 0 => one group over K (per channel); else it must divide K."""
    if group_size in (None, -1, 0):
        return K
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{name} must be a positive int or -1 (per channel), got {group_size!r}")
    if K % group_size != 0:
        raise UnsupportedFormatError(f"{name}={group_size} does not divide K={K}")
    return group_size


def unpack_words(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Split each int32 word into 32 // bits unsigned fields, low bits first, along ``dim``.

    Field i of a word is bits [bits*i, bits*(i+1)); the fields of word w become elements
    w * (32 // bits) + i of ``dim``. Returns int32 values in [0, 2^bits).
    """
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    # Arithmetic shift of a negative int32 fills with ones; the mask keeps the field only.
    w = words.movedim(dim, -1)
    fields = (w[..., None] >> shifts) & ((1 << bits) - 1)
    fields = fields.reshape(*w.shape[:-1], w.shape[-1] * per_word)
    return fields.movedim(-1, dim)


def act_order_perm(g_idx: torch.Tensor, K: int, group_size: int) -> torch.Tensor | None:
    """The K permutation that makes the groups contiguous, or None for the natural grouping.

    g_idx [K] gives the group of each input channel k. perm = stable argsort(g_idx), so
    g_idx[perm] is sorted; every group must hold exactly ``group_size`` channels (what GPTQ's
    desc_act produces), so that column j of W[:, perm] lies in group j // group_size.
    """
    if not isinstance(g_idx, torch.Tensor):
        raise TypeError(f"g_idx must be a torch.Tensor, got {type(g_idx).__name__}")
    if g_idx.dtype.is_floating_point or g_idx.dtype == torch.bool or g_idx.dim() != 1:
        raise TypeError(f"g_idx must be a 1-D integer tensor [K], got {g_idx.dtype} {tuple(g_idx.shape)}")
    if g_idx.numel() != K:
        raise ValueError(f"g_idx must have K={K} entries, got {g_idx.numel()}")
    g = g_idx.to(torch.long)
    natural = torch.arange(K, dtype=torch.long, device=g.device) // group_size
    if torch.equal(g, natural):
        return None
    G = K // group_size
    if int(g.min()) < 0 or int(g.max()) >= G:
        raise ValueError(f"g_idx values must lie in [0, {G}) for K={K}, group_size={group_size}; "
                         f"got [{int(g.min())}, {int(g.max())}]")
    counts = torch.bincount(g, minlength=G)
    if not bool((counts == group_size).all()):
        bad = int(torch.nonzero(counts != group_size)[0])
        raise UnsupportedFormatError(
            f"g_idx puts {int(counts[bad])} channels in group {bad}; act-order import needs "
            f"exactly group_size={group_size} channels per group")
    return torch.sort(g, stable=True).indices


def build_weight(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int,
                 block_size: int) -> QuantizedWeight:
    """QuantizedWeight from signed q int [N, K] and float32 scale/offset [N, K // block_size].

    ``symmetric`` is set when every offset is zero.
    """
    N, K = q.shape
    if bits == 4:
        if K % 8 != 0:
            raise UnsupportedFormatError(f"int4 import needs K % 8 == 0 (8 nibbles per word), got K={K}")
        qweight = pack_int4(q.to(torch.int8), "interleaved")
    else:
        qweight = q.to(torch.int8).contiguous()
    symmetric = bool((offset == 0).all())
    return QuantizedWeight(qweight, scale.contiguous(), offset.contiguous(), bits, block_size,
                           N, K, None, symmetric)


def zero_point_offset(scale32: torch.Tensor, midpoint_minus_z: torch.Tensor) -> torch.Tensor:
    """offset = scale * (2^(bits-1) - z) in float32, with -0.0 where the product is zero.

    Both factors are exact in float32 for fp16/bf16 scales (11 or 8 significant bits times an
    integer of at most 9 bits), so the product is exact. Zero becomes -0.0 because x + (-0.0) == x
    for every x including -0.0: a zero offset then leaves q * scale untouched, signed zeros too.
    """
    offset = scale32 * midpoint_minus_z.to(torch.float32)
    return torch.where(offset == 0, torch.full_like(offset, -0.0), offset)
