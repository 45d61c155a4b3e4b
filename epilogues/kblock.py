"""Per-K-block accumulation for scheme 2 (W8A8 quantized per K block, offset form).

For K block i the scheme-2 sum  sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB  (row m,
column n) is arranged so that every input is used once (EVT epilogues must form a tree):

    r1 = sA_i[m]              c1 = sB_i[n]
    r2 = sA_i[m] * sumA_i[m]  c2 = oB_i[n]
    r3 = oA_i[m]              c3 = sB_i[n] * sumB_i[n] + block_size * oB_i[n]

with accum = Cq_i (the int32 GEMM of block i) and C the running float32 sum of earlier blocks.
"""
from __future__ import annotations


def kblock_accumulate(accum, C, r1, c1, r2, c2, r3, c3):
    D = C + accum * r1 * c1 + r2 * c2 + r3 * c3
    return D
