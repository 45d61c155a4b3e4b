"""AWQ (AutoAWQ "GEMM" version) checkpoints -> QuantizedWeight. 4-bit only.

Source layout (W is [N, K], G = K // group_size):
- ``qweight`` int32 [K, N // 8]: packed along N; nibble i of word c holds column
  8c + AWQ_ORDER[i] (AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]);
- ``qzeros``  int32 [G, N // 8]: the same packing;  ``scales`` fp16 [G, N].
The source dequantizes w[n, k] = s * (q - z) with q, z in [0, 15] (AutoAWQ's
``dequantize_gemm``: fp16 scales times integers, one rounding).

Mapping: q' = q - 8, scale = s, offset = s * (8 - z); exact in float32 for fp16/bf16 scales for
the reasons given in ``gptq.py`` (the maths is the same once unpacked).
"""
from __future__ import annotations

import torch

from cutlass_ops.importers._common import (
    Imported, UnsupportedFormatError, build_weight, check_2d, check_packed,
    resolve_group_size, unpack_words, zero_point_offset,
)

# Nibble i of each word holds column AWQ_ORDER[i] of its 8 columns (AutoAWQ's pack order) ...
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# ... so column j of the 8 sits in nibble AWQ_REVERSE_ORDER[j] (the inverse permutation).
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C // 8] packed along columns in AWQ order -> int32 [R, C] in [0, 15]."""
    nibbles = unpack_words(packed, 4, dim=1)  # column 8c + i <- nibble i
    R, C = nibbles.shape
    return nibbles.reshape(R, C // 8, 8)[..., list(AWQ_REVERSE_ORDER)].reshape(R, C)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *,
             group_size: int, bits: int = 4) -> Imported:
    """Import one AutoAWQ GEMM linear layer exactly (``perm`` is always None)."""
    if bits != 4:
        raise UnsupportedFormatError(f"bits={bits!r} is not supported: AWQ import handles the "
                                     "4-bit GEMM layout only")
    check_packed(qweight, qzeros, scales)
    K, N = qweight.shape[0], qweight.shape[1] * 8
    group_size = resolve_group_size(group_size, K)
    G = K // group_size
    check_2d(scales, "scales", (G, N), f"[G = K // group_size, N] (K={K}, group_size={group_size})")
    check_2d(qzeros, "qzeros", (G, N // 8), "[G, N // 8]")
    q = unpack_awq(qweight)  # [K, N]
    z = unpack_awq(qzeros)  # [G, N]
    scale = scales.to(torch.float32).t().contiguous()  # [N, G]
    offset = zero_point_offset(scale, (8 - z).t())
    return Imported(build_weight((q - 8).t(), scale, offset, 4, group_size), None)
