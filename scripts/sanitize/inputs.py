"""Inputs of the cases (built lazily, inside the case, on the GPU)."""
from __future__ import annotations

import functools
import math

import torch


def _cuda() -> str:
    return "cuda"


@functools.lru_cache(maxsize=None)
def _linear_weight(N: int, K: int, bits: int, block_size: int | None, symmetric: bool = False):
    from cutlass_ops.formats import quantize_weight

    g = torch.Generator().manual_seed(N * 31 + K * 7 + bits * 3 + (block_size or 0))
    w = torch.randn(N, K, generator=g) * (1.0 / math.sqrt(K))
    return quantize_weight(w, bits=bits, block_size=block_size, symmetric=symmetric).to(_cuda())


def _activations(M: int, K: int, dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + M * 13 + K)
    return (torch.randn(M, K, generator=g) * scale).to(dtype).to(_cuda())


def _vector(N: int, dtype, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + N)
    return (torch.randn(N, generator=g) * 0.5).to(dtype).to(_cuda())
