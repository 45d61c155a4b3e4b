"""What the per-K-block paths (:mod:`.orchestrator`, :mod:`.literal`) derive from a weight, and
their reusable buffers.

Per weight (through ``cutlass_ops.plan_cache``): B regrouped block-major [G, Np, bs] so each
block's operand is a contiguous int8 matrix, the per-block column vectors, and sum_B_q. N is
padded to Np (a multiple of 8) with zero columns so every store of D stays aligned; the pad is
sliced off by the final bias/activation pass.

Buffers: a path's plan keeps one set per M bucket (M rounded up by at most 1/8, see
:func:`m_bucket`) and a call uses its first M rows, so the per-block GEMMs see the same pointers
on every call of a bucket (their launch parameters stay cached) and a server that sees many M
keeps a few sets (:data:`BUCKETS_KEPT`, oldest dropped). One weight should therefore not run on
two streams at once through these paths.
"""
from __future__ import annotations

from typing import Callable

import torch

from cutlass_ops import plan_cache
from cutlass_ops.graph_pool import outside_graph_pool

from .quant_a import sum_bq_gpu

__all__ = ["N_PAD", "BUCKETS_KEPT", "round_up", "m_bucket", "prepare_weight_blocks", "BucketBuffers"]

N_PAD = 8  # int32 / fp32 rows of D padded to 32 bytes: aligned stores on every kernel generation
BUCKETS_KEPT = 8


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def m_bucket(M: int) -> int:
    """M rounded up to 16, or to a sixteenth of the power of two above it (at most 1/8 more rows)."""
    if M <= 16:
        return 16
    return round_up(M, 1 << ((M - 1).bit_length() - 4))


def _prepare(qw) -> dict:
    N, K, bs = qw.N, qw.K, qw.block_size
    G, Np = K // bs, round_up(qw.N, N_PAD)
    dev = qw.qweight.device
    B = torch.zeros((Np, K), dtype=torch.int8, device=dev)
    B[:N] = qw.qweight
    sum_B = sum_bq_gpu(B, bs)  # [Np, G] int32 (zero for the pad rows)
    sB = torch.zeros((Np, G), dtype=torch.float32, device=dev)
    oB = torch.zeros((Np, G), dtype=torch.float32, device=dev)
    sB[:N], oB[:N] = qw.scale, qw.offset
    return {
        "G": G, "Np": Np,
        "B_blocks": B.view(Np, G, bs).transpose(0, 1).contiguous(),  # [G, Np, bs]
        # kblock_accumulate's per-column vectors, block-major so each block's is contiguous
        "c1": sB.T.contiguous(),
        "c2": oB.T.contiguous(),
        "c3": (sB * sum_B.float() + bs * oB).T.contiguous(),
        # DequantAndAcc reads the B parameters [Np, G] column by column
        "sB": sB, "oB": oB, "sum_B": sum_B,
    }


def prepare_weight_blocks(qw) -> dict:
    """Per-weight tensors of the per-block paths (built once per weight, kept in the plan cache)."""
    return plan_cache.plan(qw, "w8a8.blocks", lambda: _prepare(qw))


class BucketBuffers:
    """A path's buffers per M bucket: ``get(M)`` returns the bucket's set, made by ``make(Mb)`` on ``device``
    (outside a cudagraph-trees warm-up's pool: they are kept across calls)."""

    def __init__(self, make: Callable[[int], dict], device: torch.device):
        self.make = make
        self.device = device
        self._sets: dict[int, dict] = {}

    def get(self, M: int) -> dict:
        Mb = m_bucket(M)
        found = self._sets.get(Mb)
        if found is None:
            if len(self._sets) >= BUCKETS_KEPT:
                self._sets.pop(next(iter(self._sets)))
            found = self._sets[Mb] = outside_graph_pool(lambda: self.make(Mb), self.device)
        return found
