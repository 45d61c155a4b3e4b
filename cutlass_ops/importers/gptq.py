"""GPTQ (AutoGPTQ / GPTQModel) checkpoints -> QuantizedWeight.

Source layout (bits b in {4, 8}, f = 32 // b values per int32 word, W is [N, K]):
- ``qweight`` int32 [K // f, N]: element k of column n sits in word k // f, bits b*(k % f)...
  (packed along K, low bits first);
- ``qzeros``  int32 [G, N // f]: zero point of (group g, column n) in word n // f, field n % f
  (packed along N, low bits first);
- ``scales``  fp16 [G, N];  ``g_idx`` int32 [K]: the group of input channel k.
Values are unsigned, q, z in [0, 2^b). The source dequantizes w[n, k] = s * (q - z) with
s, z those of group g_idx[k]; checkpoint_format "gptq" (v1) stores z - 1 (the loader adds 1),
"gptq_v2" stores z.

Mapping (h = 2^(b-1)): q' = q - h (signed: int4 [-8, 7], int8 [-128, 127]), scale = s,
offset = s * (h - z), so that q' * scale + offset = s * (q - z) in exact arithmetic.

Rounding: in float32, with fp16 (or bf16) scales every step is exact: q' * s and s * (h - z)
are products of an 11-bit significand and an integer of at most 9 bits, and their sum
s * (q - z) has at most 20 significant bits, so the float32 addition is exact too. The
imported ``dequantize()`` therefore equals float32(s) * (q - z) bit for bit, and rounding it to
fp16 gives AutoGPTQ's own fp16 dequantization bit for bit (one rounding of the exact value).
Only with float32 scales can the two roundings (of q' * s, then of the sum) differ from one
rounding of s * (q - z): by at most about one float32 ulp of the block's largest |w|.
Signed zeros: a zero offset is stored as -0.0, so q' * s is reproduced with its sign.
"""
from __future__ import annotations

import torch

from cutlass_ops.importers._common import (
    Imported, UnsupportedFormatError, act_order_perm, build_weight, check_2d, check_bits,
    check_packed, resolve_group_size, unpack_words, zero_point_offset,
)

CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, bits: int,
                checkpoint_format: str = "gptq") -> tuple[torch.Tensor, torch.Tensor]:
    """(q int32 [K, N], z int32 [G, N]) as the source defines them (v1: stored zero + 1)."""
    q = unpack_words(qweight, bits, dim=0)
    z = unpack_words(qzeros, bits, dim=1)
    if checkpoint_format == "gptq":
        z = z + 1  # v1 stores z - 1; AutoGPTQ's kernels add the 1 back
    return q, z


def _check_args(qweight, qzeros, scales, bits, group_size, checkpoint_format):
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise UnsupportedFormatError(
            f"checkpoint_format must be one of {list(CHECKPOINT_FORMATS)}, got {checkpoint_format!r}")
    bits = check_bits(bits, "bits", source="GPTQ")
    check_packed(qweight, qzeros, scales)
    f = 32 // bits
    K, N = qweight.shape[0] * f, qweight.shape[1]
    if N % f != 0:
        raise UnsupportedFormatError(f"GPTQ qzeros pack {f} columns per word: N={N} must be a "
                                     f"multiple of {f}")
    group_size = resolve_group_size(group_size, K)
    G = K // group_size
    check_2d(scales, "scales", (G, N), f"[G = K // group_size, N] (K={K}, group_size={group_size})")
    check_2d(qzeros, "qzeros", (G, N // f), f"[G, N // {f}]")
    return bits, K, N, group_size, G


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: torch.Tensor | None = None, *, bits: int, group_size: int, sym: bool = True,
              checkpoint_format: str = "gptq") -> Imported:
    """Import one GPTQ linear layer exactly (see the module docstring for the maths).

    group_size=-1 means one group over K. With a non-trivial ``g_idx`` (desc_act), the K
    columns are permuted once so that groups are contiguous: the result's ``perm`` must be
    applied to the activations (``apply_perm``). sym=True checks that every zero point is
    2^(bits-1) (it catches a v1/v2 ``checkpoint_format`` mix-up); the stored zeros are used as
    they are either way, and ``QuantizedWeight.symmetric`` is set when all offsets are zero.
    """
    bits, K, N, group_size, G = _check_args(qweight, qzeros, scales, bits, group_size,
                                            checkpoint_format)
    q, z = unpack_gptq(qweight, qzeros, bits, checkpoint_format)
    h = 1 << (bits - 1)
    if sym and not bool((z == h).all()):
        found = sorted(set(torch.unique(z).tolist()))[:4]
        raise ValueError(f"sym=True but the zero points from qzeros are not all {h} "
                         f"(found {found}...): wrong checkpoint_format={checkpoint_format!r}, or "
                         f"pass sym=False")
    perm = None if g_idx is None else act_order_perm(g_idx, K, group_size)
    qn = (q - h).t()  # [N, K] signed
    if perm is not None:
        qn = qn.index_select(1, perm)
    scale = scales.to(torch.float32).t().contiguous()  # [N, G]
    offset = zero_point_offset(scale, (h - z).t())
    weight = build_weight(qn, scale, offset, bits, group_size)
    return Imported(weight, perm)

