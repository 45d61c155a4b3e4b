"""``warmup(model, batch_sizes)``: build every plan a model's quantized linears will use, before serving.

A layer's first call with a new M bucket loads its kernels and prepares the per-weight data (packed
scale/offset words, Params, NaN checks: host synchronisations). Doing that ahead of time keeps it out
of the first request and out of CUDA-graph capture, where a synchronisation is not allowed.
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch

from cutlass_ops.nn.modules import QuantLinear

__all__ = ["warmup"]

log = logging.getLogger(__name__)


def warmup(model: torch.nn.Module, batch_sizes: Iterable[int] = (1,), dtype: torch.dtype | None = None) -> int:
    """Run each :class:`~cutlass_ops.nn.QuantLinear` of ``model`` once per M in ``batch_sizes`` (rows of
    x: batch x tokens) on zeros of ``dtype`` (default: the layer's bias dtype, else float16), without
    autograd. Returns the number of calls made. ``QuantConv2d`` layers need real spatial sizes: warm
    them with one forward pass of the model on an example input.
    """
    sizes = list(batch_sizes)
    for M in sizes:
        if isinstance(M, bool) or not isinstance(M, int) or M < 1:
            raise ValueError(f"batch_sizes must hold positive ints, got {M!r}")
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype must be None, torch.float16, torch.bfloat16 or torch.float32, got {dtype}")
    calls = 0
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLinear)]
    with torch.no_grad():
        for name, layer in layers:
            device = layer.qweight.device
            if device.type != "cuda":
                continue  # CPU layers run the float64 references: nothing to prepare
            x_dtype = dtype or (layer.bias.dtype if layer.bias is not None else torch.float16)
            for M in sizes:
                layer(torch.zeros(M, layer.in_features, dtype=x_dtype, device=device))
                calls += 1
    if calls:
        torch.cuda.synchronize()
    log.info("warmup: %d calls over %d quantized linears, M in %s", calls, len(layers), sizes)
    return calls
