"""Strategy "gemv_dp4a": llama.cpp-style MMVQ for int8 weights and M <= 8 (gemv_dp4a.cu): the
activations are quantized to q8_1 blocks of 32 (``quantize_q8_1``), then ``gemv_dp4a_m{M}`` runs the
dot products as integer __dp4a. APPROXIMATE (activations rounded to int8): only used when asked for."""
from __future__ import annotations

import torch

from custom_kernels.device import raw_stream
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import ELEMENT

__all__ = ["QuantizeQ81Args", "GemvDp4aArgs", "GemvDp4aPlan"]

Q_BLOCK = 32          # activation quantization block (kQBlock)
QUANT_WARPS = 8       # warps per quantize_q8_1 block, one 32-block each
ROWS_PER_BLOCK = 4    # warps per gemv_dp4a block of 128 threads


class QuantizeQ81Args(KernelArgs):
    _fields_ = [("x", Ptr), ("xq", Ptr), ("d", Ptr), ("sum", Ptr), ("K", I32)]


class GemvDp4aArgs(KernelArgs):
    _fields_ = [("xq", Ptr), ("xd", Ptr), ("xsum", Ptr), ("B", Ptr), ("scale", Ptr), ("offset", Ptr),
                ("bias", Ptr), ("D", Ptr), ("N", I32), ("K", I32), ("G", I32), ("block_size", I32), ("act", I32)]


class GemvDp4aPlan:
    strategy = "gemv_dp4a"
    config_type = None
    bias_tensor = False
    per_m = True

    @staticmethod
    def kernels(M: int, dtype, bits: int = 8, config=None) -> tuple:
        """(source, kernel, defines) of the two kernels the plan for M rows loads (int8 weights only)."""
        defines = {"WO_ELEMENT": ELEMENT[dtype]}
        return ("gemv_dp4a.cu", "quantize_q8_1", defines), ("gemv_dp4a.cu", f"gemv_dp4a_m{M}", dict(defines))

    def __init__(self, qw, M: int, dtype, device: int, config=None):
        quant, gemv = self.kernels(M, dtype, qw.bits)
        K, N = qw.K, qw.N
        q_blocks = K // Q_BLOCK
        self.quant = Launch(load_kernel(*quant, device=device),
                            LaunchConfig.of((-(-q_blocks // QUANT_WARPS), M), 32 * QUANT_WARPS),
                            QuantizeQ81Args(K=K), device)
        args = GemvDp4aArgs(B=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(), offset=qw.offset.data_ptr(),
                            N=N, K=K, G=qw.num_groups, block_size=qw.block_size)
        self.gemv = Launch(load_kernel(*gemv, device=device),
                           LaunchConfig.of(-(-N // ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK), args, device)
        self.device = device
        # int8 activations, then float32 d and sum per 32-block (K % 32 == 0 keeps them aligned)
        self.q_bytes = M * K
        self.f_bytes = 4 * M * q_blocks

    def __call__(self, x: torch.Tensor, bias: int, act: int, out: torch.Tensor) -> None:
        buf = torch.empty(self.q_bytes + 2 * self.f_bytes, dtype=torch.uint8, device=x.device)
        xq = buf.data_ptr()
        xd = xq + self.q_bytes
        xs = xd + self.f_bytes
        stream = raw_stream(self.device)
        self.quant(stream, x=x.data_ptr(), xq=xq, d=xd, sum=xs)
        self.gemv(stream, xq=xq, xd=xd, xsum=xs, bias=bias, D=out.data_ptr(), act=act)
