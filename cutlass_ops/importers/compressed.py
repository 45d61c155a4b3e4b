"""compressed-tensors (llm-compressor) checkpoints -> QuantizedWeight: int4 and int8 weights.

Formats (W is [N, K], values signed, q in [-2^(b-1), 2^(b-1))):
- "pack-quantized": ``weight_packed`` int32 [N, ceil(K * b / 32)], packed along K low bits first
  (element k in word k // (32 // b), bits b * (k % (32 // b))), each field holding q + 2^(b-1);
  ``weight_shape`` [2] = (N, K). An asymmetric ``weight_zero_point`` is packed the same way along
  N (dim 0): int32 [ceil(N * b / 32), G] (compressed-tensors >= 0.10; an unpacked int8 [N, G]
  from older writers is accepted too).
- "int-quantized" / "naive-quantized": ``weight`` int8 [N, K] holds q itself (b = 8).
``weight_scale`` [N, G] (group: G = K // group_size; channel: [N, 1]; tensor: one value),
``weight_zero_point`` signed, same shape as the scale, present only when asymmetric.
The source dequantizes w = (q - z) * s in the scale's dtype (``_dequantize``: one rounding).

Mapping: q' = q, scale = s, offset = -z * s (-0.0 when symmetric). In float32, q' * s and z * s
are exact for fp16/bf16 scales and so is their sum (q - z) * s (at most 9 + 11 significant bits),
so ``dequantize()`` rounded to the scale's dtype equals the source's result bit for bit. Legacy
``weight_g_idx`` (actorder="group") is imported by permuting K, as in ``gptq.py``.
"""
from __future__ import annotations

import math

import torch

from cutlass_ops.importers._common import (
    Imported, UnsupportedFormatError, act_order_perm, build_weight, check_bits, check_float,
    check_int32, resolve_group_size, unpack_words, zero_point_offset,
)

PACKED_FORMATS = ("pack-quantized",)
INT8_FORMATS = ("int-quantized", "naive-quantized")
STRATEGIES = ("group", "channel", "tensor")


def _scale_groups(weight_scale: torch.Tensor, N: int, K: int, strategy: str, group_size):
    """(scale [N, G] as given dtype, block_size)."""
    if strategy == "tensor":
        if weight_scale.numel() != 1:
            raise ValueError(f"weight_scale must hold one value for strategy='tensor', "
                             f"got shape {tuple(weight_scale.shape)}")
        return weight_scale.reshape(1, 1).expand(N, 1), K
    if strategy == "channel":
        block_size = K
    else:
        if group_size is None:
            raise ValueError("group_size is required for strategy='group'")
        block_size = resolve_group_size(group_size, K)
    G = K // block_size
    s = weight_scale.reshape(N, -1) if weight_scale.dim() == 1 else weight_scale
    if tuple(s.shape) != (N, G):
        raise ValueError(f"weight_scale must have shape ({N}, {G}) [N, K // group_size] for "
                         f"strategy={strategy!r}, got {tuple(weight_scale.shape)}")
    return s, block_size


def _zero_points(zp: torch.Tensor, bits: int, N: int, G: int, packed_format: bool) -> torch.Tensor:
    """Signed zero points int32 [N, G] from a packed int32 [ceil(N*b/32), G] or plain [N, G]."""
    rows = math.ceil(N * bits / 32)
    if zp.dim() == 1 and zp.numel() in (N * G, 1):
        zp = zp.reshape(-1, 1).expand(N, G) if zp.numel() == 1 else zp.reshape(N, G)
    if zp.dim() == 2 and zp.shape[0] == N and zp.shape[1] == G and not zp.dtype.is_floating_point:
        return zp.to(torch.int32)
    if packed_format and zp.dtype == torch.int32 and tuple(zp.shape) == (rows, G):
        return unpack_words(zp, bits, dim=0)[:N] - (1 << (bits - 1))
    raise ValueError(f"weight_zero_point must be int [N, G] = ({N}, {G}) or, packed along N, "
                     f"int32 ({rows}, {G}); got {zp.dtype} {tuple(zp.shape)}")


def _int_values(weight_packed, weight, weight_shape, num_bits: int, format: str) -> torch.Tensor:
    """Signed q int32 [N, K] from either layout."""
    if format in PACKED_FORMATS:
        if weight_packed is None or weight_shape is None:
            raise ValueError(f"format={format!r} needs weight_packed and weight_shape")
        check_int32(weight_packed, "weight_packed")
        N, K = (int(v) for v in torch.as_tensor(weight_shape).reshape(-1).tolist())
        words = math.ceil(K * num_bits / 32)
        if tuple(weight_packed.shape) != (N, words):
            raise ValueError(f"weight_packed must have shape ({N}, {words}) [N, ceil(K * "
                             f"{num_bits} / 32)] for weight_shape=({N}, {K}), got "
                             f"{tuple(weight_packed.shape)}")
        if num_bits == 4 and K % 8 != 0:
            raise UnsupportedFormatError(f"int4 import needs K % 8 == 0, got weight_shape=({N}, {K})")
        return unpack_words(weight_packed, num_bits, dim=1)[:, :K] - (1 << (num_bits - 1))
    if format in INT8_FORMATS:
        if weight is None:
            raise ValueError(f"format={format!r} needs weight (int8 [N, K])")
        if num_bits != 8 or weight.dtype != torch.int8 or weight.dim() != 2:
            raise UnsupportedFormatError(
                f"format={format!r} import handles int8 weights [N, K] (num_bits=8); got "
                f"num_bits={num_bits}, weight {weight.dtype} {tuple(weight.shape)}")
        return weight.to(torch.int32)
    raise UnsupportedFormatError(f"format={format!r} is not supported: use one of "
                                 f"{list(PACKED_FORMATS + INT8_FORMATS)}")


def from_compressed_tensors(weight_scale: torch.Tensor, *, num_bits: int, strategy: str,
                            group_size: int | None = None, format: str = "pack-quantized",
                            weight_packed: torch.Tensor | None = None,
                            weight_shape=None, weight: torch.Tensor | None = None,
                            weight_zero_point: torch.Tensor | None = None,
                            weight_g_idx: torch.Tensor | None = None,
                            symmetric: bool | None = None) -> Imported:
    """Import one compressed-tensors int weight exactly (see the module docstring).

    Tensors are named as in the checkpoint (``<layer>.weight_packed`` etc.); ``num_bits``,
    ``strategy``, ``group_size``, ``symmetric`` and ``format`` come from its quantization_config.
    symmetric=False requires ``weight_zero_point``; None infers it from its presence.
    """
    num_bits = check_bits(num_bits, "num_bits", source="compressed-tensors")
    if strategy not in STRATEGIES:
        raise UnsupportedFormatError(f"strategy={strategy!r} is not supported: use one of "
                                     f"{list(STRATEGIES)}")
    if symmetric is False and weight_zero_point is None:
        raise ValueError("symmetric=False needs weight_zero_point")
    if symmetric is True and weight_zero_point is not None:
        raise ValueError("symmetric=True but weight_zero_point was given")
    check_float(weight_scale, "weight_scale")
    q = _int_values(weight_packed, weight, weight_shape, num_bits, format)
    N, K = q.shape
    s, block_size = _scale_groups(weight_scale, N, K, strategy, group_size)
    G = K // block_size
    z = (torch.zeros(N, G, dtype=torch.int32) if weight_zero_point is None
         else _zero_points(weight_zero_point, num_bits, N, G, format in PACKED_FORMATS))
    qmin, qmax = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    if z.numel() and (int(z.min()) < qmin or int(z.max()) > qmax):
        raise ValueError(f"weight_zero_point values must lie in [{qmin}, {qmax}]")
    perm = None if weight_g_idx is None else act_order_perm(weight_g_idx, K, block_size)
    if perm is not None:
        q = q.index_select(1, perm)
    scale = s.to(torch.float32).contiguous()
    offset = zero_point_offset(scale, -z)
    return Imported(build_weight(q, scale, offset, num_bits, block_size), perm)
