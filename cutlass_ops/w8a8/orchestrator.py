"""Scheme 2, ``path="orchestrator"``: QuantA once over all blocks, then one CUTLASS int8 GEMM per
K block whose ``kblock_accumulate`` epilogue adds that block's 4-term result to the running fp32
output (D = C + accum*r1*c1 + r2*c2 + r3*c3; see ``epilogues/kblock.py``), so neither atomics nor
a separate dequantization kernel are needed. Bias and activation come last
(:func:`cutlass_ops.w8a8.linear_w8a8`, one pass that also converts to the output dtype).

For K block i (block_size = bs columns of A and of B):

    C_fp += sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB        (row m, column n)

Nothing here synchronizes; a call can be captured in a CUDA graph once its kernels are loaded.
"""
from __future__ import annotations

import torch

from cutlass_ops.cutlass import int8_gemm

from .blocks import BucketBuffers, prepare_weight_blocks, round_up
from .quant_a import quantize_activation_gpu

__all__ = ["OrchestratorPlan"]


class OrchestratorPlan:
    """The orchestrator path for one weight: ``plan(x2d)`` -> the fp32 accumulator [M, Np]."""

    def __init__(self, qw):
        self.prep = prepare_weight_blocks(qw)
        self.block_size = qw.block_size
        G, Np, dev = self.prep["G"], self.prep["Np"], qw.qweight.device
        self.buffers = BucketBuffers(lambda Mb: {
            "A_blocks": torch.empty((G, Mb, qw.block_size), dtype=torch.int8, device=dev),  # block i: [M, bs]
            # kblock_accumulate's per-row vectors, block-major; rows padded to 16 bytes so that every
            # block's vector starts aligned (the kernels read them with vector loads)
            "r": torch.empty((3, G, round_up(Mb, 4)), dtype=torch.float32, device=dev),
            # two fp32 accumulators used alternately: each GEMM reads C from one and writes D to the other
            "acc": torch.empty((2, Mb, Np), dtype=torch.float32, device=dev),
        }, dev)

    def __call__(self, x2d: torch.Tensor) -> torch.Tensor:
        M, bs, prep = x2d.shape[0], self.block_size, self.prep
        G = prep["G"]
        buf = self.buffers.get(M)
        A_q, sA, oA, sum_A = quantize_activation_gpu(x2d, bs)
        A_blocks = buf["A_blocks"][:, :M]
        A_blocks.copy_(A_q.view(M, G, bs).transpose(0, 1))
        r = buf["r"]
        r[0, :, :M] = sA.T
        torch.mul(sA, sum_A, out=r[1, :, :M].T)
        r[2, :, :M] = oA.T
        r1, r2, r3 = (r[j, :, :M] for j in range(3))
        acc = buf["acc"][:, :M]
        acc[0].zero_()
        c1, c2, c3, B_blocks = prep["c1"], prep["c2"], prep["c3"], prep["B_blocks"]
        for i in range(G):
            int8_gemm(A_blocks[i], B_blocks[i], "kblock_accumulate", out=acc[(i + 1) % 2],
                      C=acc[i % 2], r1=r1[i], c1=c1[i], r2=r2[i], c2=c2[i], r3=r3[i], c3=c3[i])
        return acc[G % 2]
