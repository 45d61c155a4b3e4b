"""Scheme 2, ``path="literal"``: the documents' sequence, one K block at a time - QuantA of the
block, a plain int32 CUTLASS GEMM into C_q, DequantAndAcc (atomicAdd) into the fp32 output - and
BiasAndActivation at the end (:func:`cutlass_ops.w8a8.linear_w8a8`). Kept so that it can be
compared with the orchestrator and the fused kernel.
"""
from __future__ import annotations

import torch

from cutlass_ops.cutlass import int8_gemm

from .blocks import BucketBuffers, prepare_weight_blocks
from .epilogue import dequant_and_acc_gpu
from .quant_a import quantize_activation_block_gpu

__all__ = ["LiteralPlan"]


class LiteralPlan:
    """The literal path for one weight: ``plan(x2d)`` -> the fp32 accumulator [M, Np]."""

    def __init__(self, qw):
        self.prep = prepare_weight_blocks(qw)
        self.block_size, self.N = qw.block_size, qw.N
        G, Np, dev, bs = self.prep["G"], self.prep["Np"], qw.qweight.device, qw.block_size
        self.buffers = BucketBuffers(lambda Mb: {
            "A_q": torch.empty((Mb, bs), dtype=torch.int8, device=dev),
            "sA": torch.empty((Mb, G), dtype=torch.float32, device=dev),
            "oA": torch.empty((Mb, G), dtype=torch.float32, device=dev),
            "sum_A": torch.empty((Mb, G), dtype=torch.int32, device=dev),
            "C_q": torch.empty((Mb, Np), dtype=torch.int32, device=dev),
            "out": torch.empty((Mb, Np), dtype=torch.float32, device=dev),
        }, dev)

    def __call__(self, x2d: torch.Tensor) -> torch.Tensor:
        M, bs, N, prep = x2d.shape[0], self.block_size, self.N, self.prep
        buf = self.buffers.get(M)
        A_q, sA, oA, sum_A, C_q, out = (buf[k][:M] for k in ("A_q", "sA", "oA", "sum_A", "C_q", "out"))
        out.zero_()
        sB, oB, sum_B, B_blocks = prep["sB"][:N], prep["oB"][:N], prep["sum_B"][:N], prep["B_blocks"]
        for i in range(prep["G"]):
            quantize_activation_block_gpu(x2d, i * bs, bs, A_q, sA, oA, sum_A, group=i)
            int8_gemm(A_q, B_blocks[i], "none", out=C_q)
            dequant_and_acc_gpu(C_q, out[:, :N], sA, oA, sum_A, sB, oB, sum_B, group=i, block_len=bs)
        return out
