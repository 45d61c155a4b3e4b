"""Tensor-parallel shards of a ``QuantizedWeight``: split N (column parallel) or K (row parallel).

W [N, K] is used as D = A @ W^T. With ``world`` ranks:
  column parallel: rank r holds W[r*N/world : (r+1)*N/world, :] and computes its N slice of D;
  row parallel:    rank r holds W[:, r*K/world : (r+1)*K/world], multiplies its K slice of A, and
                   the partial D's are summed (all-reduce).
Both splits are exact: ``shard.dequantize()`` equals the matching slice of ``qw.dequantize()`` bit for
bit, because a shard keeps whole quantization blocks (and whole packed int4 words) with their own
scale and offset. A K split that would cut a block of ``block_size`` (or a 32-bit word of 8 packed int4
values) is refused; a per-channel weight (one block spanning K) stays per channel: each K shard keeps
the row's scale and offset over its own K / world columns (block_size becomes K / world).

A ``BlockScaledWeight`` (symmetric per block_size x block_size tile) splits the same way in whole tiles:
N / world and K / world must be multiples of block_size (its scale has one row per N block).

Pure torch: runs on CPU tensors, no process group needed.
"""
from __future__ import annotations

import dataclasses

import torch

from cutlass_ops._validate import check_int
from cutlass_ops.formats import QuantizedWeight

__all__ = ["shard_column", "shard_row", "shard_perm", "shard_bias", "check_rank"]

INT4_WORD = 8  # int4 values per 32-bit word of the interleaved packing (formats.INT4_INTERLEAVE)


def check_rank(rank, world) -> tuple[int, int]:
    """(rank, world) as ints with world >= 1 and 0 <= rank < world (errors name the argument)."""
    check_int(world, "world", minimum=1)
    check_int(rank, "rank", minimum=0)
    if rank >= world:
        raise ValueError(f"rank must be < world, got rank={rank}, world={world}")
    return rank, world


def _block_scaled(qw) -> bool:
    """True for a BlockScaledWeight, False for a QuantizedWeight; TypeError for anything else."""
    if isinstance(qw, QuantizedWeight):
        return False
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight  # pure torch, loaded on first use

    if isinstance(qw, BlockScaledWeight):
        return True
    raise TypeError(f"qw must be a QuantizedWeight or a BlockScaledWeight, got {type(qw).__name__}")


def _shard_block_scaled(qw, rank: int, world: int, column: bool):
    """Rank ``rank``'s N (column) or K (row) slice of a BlockScaledWeight, in whole block_size tiles."""
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight

    bs = qw.block_size
    kind, dim, name = ("column", qw.N, "N (out_features)") if column else ("row", qw.K, "K (in_features)")
    if dim % world:
        raise ValueError(f"{kind} parallel: world={world} must divide {name}={dim}")
    part = dim // world
    if part % bs and world > 1:  # world 1: the whole weight (a short last N block included)
        raise ValueError(f"{kind} parallel: {name[0]} / world = {dim}/{world} = {part} is not a multiple of "
                         f"block_size={bs}; a shard would cut a block_size x block_size weight tile")
    values, tiles = slice(rank * part, (rank + 1) * part), slice(rank * part // bs, -(-(rank + 1) * part // bs))
    if column:
        return BlockScaledWeight(qw.qweight[values].contiguous(), qw.scale[tiles].contiguous(), bs)
    return BlockScaledWeight(qw.qweight[:, values].contiguous(), qw.scale[:, tiles].contiguous(), bs)


def shard_column(qw: QuantizedWeight, rank: int, world: int) -> QuantizedWeight:
    """Rank ``rank``'s N slice of ``qw``: rows [rank * N/world, (rank+1) * N/world) of qweight, scale and
    offset (K, block_size and the packing untouched). ValueError unless world divides N.

    A conv weight (conv_shape (Co, Kh, Kw, Ci)) splits its output channels: conv_shape (Co/world, ...).
    A BlockScaledWeight splits in whole tiles (N / world a multiple of block_size).
    """
    check_rank(rank, world)
    if _block_scaled(qw):
        return _shard_block_scaled(qw, rank, world, column=True)
    if qw.N % world:
        raise ValueError(f"column parallel: world={world} must divide N={qw.N} (out_features)")
    Ns = qw.N // world
    rows = slice(rank * Ns, (rank + 1) * Ns)
    conv_shape = None if qw.conv_shape is None else (Ns, *qw.conv_shape[1:])
    return dataclasses.replace(qw, qweight=qw.qweight[rows].contiguous(), scale=qw.scale[rows].contiguous(),
                               offset=qw.offset[rows].contiguous(), N=Ns, conv_shape=conv_shape)


def _row_split(qw: QuantizedWeight, world: int) -> int:
    """K / world after the checks that the K split keeps whole blocks and whole int4 words."""
    if qw.conv_shape is not None:
        raise ValueError(f"row parallel: qw is a conv weight (conv_shape={qw.conv_shape}); its K = Kh*Kw*Ci "
                         "is not split (split the output channels with shard_column)")
    if qw.K % world:
        raise ValueError(f"row parallel: world={world} must divide K={qw.K} (in_features)")
    Ks = qw.K // world
    per_channel = qw.num_groups == 1
    if not per_channel and Ks % qw.block_size:
        raise ValueError(f"row parallel: K / world = {qw.K}/{world} = {Ks} is not a multiple of "
                         f"block_size={qw.block_size}; a shard would cut a quantization block")
    if qw.bits == 4 and Ks % INT4_WORD:
        raise ValueError(f"row parallel: K / world = {qw.K}/{world} = {Ks} is not a multiple of {INT4_WORD} "
                         f"(int4 values of one packed 32-bit word); a shard would cut a word")
    return Ks


def shard_row(qw: QuantizedWeight, rank: int, world: int) -> QuantizedWeight:
    """Rank ``rank``'s K slice of ``qw``: columns [rank * K/world, (rank+1) * K/world).

    int8: qweight columns; int4: the packed byte columns [rank * K/world / 2, ...) (whole 32-bit words,
    whose interleaving stays inside the word); scale / offset: the group columns of those blocks. ValueError
    (naming K, world and block_size) unless K / world is a multiple of block_size, and of 8 for int4. A
    per-channel weight (block_size == K) stays per channel: the shard keeps scale/offset [N, 1] and has
    block_size = K / world. In the weight's stored K order: for an act-order weight (stored as W[:, perm])
    the shard multiplies the input columns ``shard_perm(perm, rank, world)``. A BlockScaledWeight splits
    in whole tiles (K / world a multiple of block_size).
    """
    check_rank(rank, world)
    if _block_scaled(qw):
        return _shard_block_scaled(qw, rank, world, column=False)
    Ks = _row_split(qw, world)
    if qw.num_groups == 1:  # per channel: every shard keeps the one (scale, offset) of its row
        scale, offset, block_size = qw.scale.clone(), qw.offset.clone(), Ks
    else:
        Gs = Ks // qw.block_size
        groups = slice(rank * Gs, (rank + 1) * Gs)
        scale, offset, block_size = qw.scale[:, groups].contiguous(), qw.offset[:, groups].contiguous(), qw.block_size
    per_byte = 1 if qw.bits == 8 else 2
    cols = slice(rank * Ks // per_byte, (rank + 1) * Ks // per_byte)
    return dataclasses.replace(qw, qweight=qw.qweight[:, cols].contiguous(), scale=scale, offset=offset,
                               block_size=block_size, K=Ks)


def shard_perm(perm: torch.Tensor | None, rank: int, world: int) -> torch.Tensor | None:
    """The global input indices (int64 [K / world]) that rank ``rank``'s row-parallel shard consumes.

    Without act-order (perm None) a shard multiplies the contiguous input columns [rank * K/world, ...):
    returned as ``None``, meaning "the contiguous slice". With act-order the weight is stored as W[:, perm]
    (QuantLinear gathers x[..., perm] before the kernel), so the shard of stored columns
    [rank * K/world, ...) multiplies x[..., perm[rank * K/world : (rank+1) * K/world]]: those indices are
    returned. They are scattered over all of K, so such a shard needs the full input (or a producer whose
    output rows were reordered by ``perm``, so that its contiguous N shard is exactly this slice).
    """
    check_rank(rank, world)
    if perm is None:
        return None
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1:
        raise ValueError(f"perm must be a 1-d integer tensor [K], got {type(perm).__name__} "
                         f"{tuple(getattr(perm, 'shape', ()))}")
    if perm.numel() % world:
        raise ValueError(f"row parallel: world={world} must divide K={perm.numel()} (perm.numel())")
    Ks = perm.numel() // world
    return perm[rank * Ks:(rank + 1) * Ks].to(torch.long).contiguous()


def shard_bias(bias: torch.Tensor | None, rank: int, world: int) -> torch.Tensor | None:
    """Rank ``rank``'s N slice of a column-parallel bias [N] (None stays None)."""
    check_rank(rank, world)
    if bias is None:
        return None
    if bias.dim() != 1 or bias.numel() % world:
        raise ValueError(f"bias must be [N] with world={world} dividing N, got shape {tuple(bias.shape)}")
    Ns = bias.numel() // world
    return bias[rank * Ns:(rank + 1) * Ns].clone()
