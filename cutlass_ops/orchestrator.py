"""Scheme 2 (W8A8 quantized per K block): the per-K-block orchestrator and its literal variant.

For K block i (block_size = bs columns of A and of B):

    C_fp += sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB        (row m, column n)

``path="orchestrator"``: QuantA once over all blocks, then one CUTLASS int8 GEMM per block whose
``kblock_accumulate`` epilogue adds that block's 4-term result to the running fp32 output
(D = C + accum*r1*c1 + r2*c2 + r3*c3; see ``epilogues/kblock.py``), so neither atomics nor a
separate dequantization kernel are needed; bias and activation last (one pass that also
converts to the output dtype).

``path="literal"``: the documents' sequence, one block at a time: QuantA of the block,
a plain int32 CUTLASS GEMM into C_q, DequantAndAcc (atomicAdd) into the fp32 output, and
BiasAndActivation at the end. Kept so the two can be compared.

``path="fused"``: one kernel (``cutlass_ops.ops.w8a8_fused``).

Per weight (cached on the QuantizedWeight): B regrouped block-major [G, Np, bs] so each block's
operand is a contiguous int8 matrix, the per-block column vectors, and sum_B_q. N is padded to
Np (a multiple of 8) with zero columns so every store of D stays aligned; the pad is sliced off
by the final bias/activation pass. Nothing here synchronizes; a call can be captured in a CUDA
graph once its kernels are loaded. The per-block paths keep their buffers on the weight (one
set per M), so one weight should not run on two streams at once through them.
"""
from __future__ import annotations

import torch

from cutlass_ops.gemm import int8_gemm
from cutlass_ops.ops.quant import (
    bias_and_activation_gpu, dequant_and_acc_gpu, quantize_activation_block_gpu, quantize_activation_gpu,
    sum_bq_gpu,
)
from cutlass_ops.ops.w8a8_fused import linear_w8a8_fused

__all__ = ["linear_w8a8", "prepare_weight_blocks", "PATHS"]

PATHS = ("fused", "orchestrator", "literal")
_PREP_ATTR = "_w8a8_blocks_prep"
N_PAD = 8  # int32 / fp32 rows of D padded to 32 bytes: aligned stores on every kernel generation


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def prepare_weight_blocks(qw) -> dict:
    """Per-weight tensors of the per-block paths (built once, cached on ``qw``)."""
    key = (qw.qweight.data_ptr(), qw.scale.data_ptr(), qw.offset.data_ptr(), qw.qweight._version,
           qw.scale._version, qw.offset._version)
    prep = getattr(qw, _PREP_ATTR, None)
    if prep is not None and prep["key"] == key:
        return prep
    N, K, bs = qw.N, qw.K, qw.block_size
    G, Np = K // bs, _round_up(qw.N, N_PAD)
    dev = qw.qweight.device
    B = torch.zeros((Np, K), dtype=torch.int8, device=dev)
    B[:N] = qw.qweight
    sum_B = sum_bq_gpu(B, bs)  # [Np, G] int32 (zero for the pad rows)
    sB = torch.zeros((Np, G), dtype=torch.float32, device=dev)
    oB = torch.zeros((Np, G), dtype=torch.float32, device=dev)
    sB[:N], oB[:N] = qw.scale, qw.offset
    prep = {
        "key": key, "G": G, "Np": Np,
        "B_blocks": B.view(Np, G, bs).transpose(0, 1).contiguous(),  # [G, Np, bs]
        # kblock_accumulate's per-column vectors, block-major so each block's is contiguous
        "c1": sB.T.contiguous(),
        "c2": oB.T.contiguous(),
        "c3": (sB * sum_B.float() + bs * oB).T.contiguous(),
        # DequantAndAcc reads the B parameters [Np, G] column by column
        "sB": sB, "oB": oB, "sum_B": sum_B,
        "workspaces": {},
    }
    setattr(qw, _PREP_ATTR, prep)
    return prep


def _workspace(prep: dict, name: str, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A buffer kept on the weight's prep and reused by every call of the same shape, so the
    per-block GEMMs see the same pointers each call (their launch parameters stay cached)."""
    key = (name, shape, dtype, device)
    spaces = prep["workspaces"]
    buf = spaces.get(key)
    if buf is None:
        if len(spaces) >= 64:  # many distinct M: start over rather than grow without bound
            spaces.clear()
        buf = spaces[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf


def _orchestrated(x2d: torch.Tensor, qw, prep: dict, bias, act: int) -> torch.Tensor:
    M, bs, G, Np = x2d.shape[0], qw.block_size, prep["G"], prep["Np"]
    dev = x2d.device
    A_q, sA, oA, sum_A = quantize_activation_gpu(x2d, bs)
    A_blocks = _workspace(prep, "A_blocks", (G, M, bs), torch.int8, dev)  # block i contiguous [M, bs]
    A_blocks.copy_(A_q.view(M, G, bs).transpose(0, 1))
    # kblock_accumulate's per-row vectors, block-major; rows padded to 16 bytes so that every
    # block's vector starts aligned (the kernels read them with vector loads)
    r = _workspace(prep, "r", (3, G, _round_up(M, 4)), torch.float32, dev)
    r[0, :, :M] = sA.T
    torch.mul(sA, sum_A, out=r[1, :, :M].T)
    r[2, :, :M] = oA.T
    r1, r2, r3 = (r[j, :, :M] for j in range(3))
    # Two fp32 accumulators used alternately: each GEMM reads C from one and writes D to the other.
    acc = _workspace(prep, "acc", (2, M, Np), torch.float32, dev)
    acc[0].zero_()
    c1, c2, c3, B_blocks = prep["c1"], prep["c2"], prep["c3"], prep["B_blocks"]
    for i in range(G):
        int8_gemm(A_blocks[i], B_blocks[i], "kblock_accumulate", out=acc[(i + 1) % 2],
                  C=acc[i % 2], r1=r1[i], c1=c1[i], r2=r2[i], c2=c2[i], r3=r3[i], c3=c3[i])
    return acc[G % 2]


def _literal(x2d: torch.Tensor, qw, prep: dict, bias, act: int) -> torch.Tensor:
    M, K = x2d.shape
    bs, G, Np, N = qw.block_size, prep["G"], prep["Np"], qw.N
    dev = x2d.device
    A_q = _workspace(prep, "A_q", (M, bs), torch.int8, dev)
    sA = _workspace(prep, "sA", (M, G), torch.float32, dev)
    oA = _workspace(prep, "oA", (M, G), torch.float32, dev)
    sum_A = _workspace(prep, "sum_A", (M, G), torch.int32, dev)
    C_q = _workspace(prep, "C_q", (M, Np), torch.int32, dev)
    out = _workspace(prep, "out", (M, Np), torch.float32, dev)
    out.zero_()
    for i in range(G):
        quantize_activation_block_gpu(x2d, i * bs, bs, A_q, sA, oA, sum_A, group=i)
        int8_gemm(A_q, prep["B_blocks"][i], "none", out=C_q)
        dequant_and_acc_gpu(C_q, out[:, :N], sA, oA, sum_A, prep["sB"][:N], prep["oB"][:N], prep["sum_B"][:N],
                            group=i, block_len=bs)
    return out


def linear_w8a8(x2d: torch.Tensor, qw, bias: torch.Tensor | None = None, act: int = 0, *,
                path: str = "fused") -> torch.Tensor:
    """Scheme 2 on x2d [M, K] (fp16/bf16/fp32) and an int8 per-block weight: [M, N] in x2d.dtype."""
    if path == "fused":
        return linear_w8a8_fused(x2d, qw, bias, act)
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    prep = prepare_weight_blocks(qw)
    acc = (_orchestrated if path == "orchestrator" else _literal)(x2d, qw, prep, bias, act)
    out = torch.empty((x2d.shape[0], qw.N), dtype=x2d.dtype, device=x2d.device)
    bias32 = None if bias is None else bias.to(torch.float32)
    return bias_and_activation_gpu(acc[:, : qw.N], bias32, act, out=out)
