"""GGUF tensors in the ggml block formats Q8_0, Q4_0 and Q4_1 -> QuantizedWeight.

A GGUF tensor of shape (ne0 = K, ne1 = N) (ggml order, ``ReaderTensor.shape``) is N rows of
K // 32 blocks along K; each block of 32 elements is stored as
- Q8_0 (34 bytes): fp16 d, 32 int8 q;                      w = d * q
- Q4_0 (18 bytes): fp16 d, 16 bytes of nibbles u in [0, 15]; w = d * (u - 8)
- Q4_1 (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles;      w = d * u + m
where byte j of the nibbles holds element j in its low nibble and element j + 16 in its high
nibble. The reference is ``gguf.quants.dequantize`` (numpy float32: d and m widened to float32).

Mapping (block_size 32): Q8_0: q' = q, scale = d, offset = -0.0; Q4_0: q' = u - 8, scale = d,
offset = -0.0; Q4_1: q' = u - 8, scale = d, offset = m + 8 * d (float32).
Rounding: x + (-0.0) == x for every float32 x (signed zeros included), so Q8_0 and Q4_0
dequantize bit for bit like gguf. For Q4_1, q' * d is exact and, when m + 8 * d is exact in
float32, q' * d + offset is one rounding of d * u + m, exactly gguf's (d * u is exact there too).
m + 8 * d is exact unless m and d lie more than 12 binades apart (a block whose range is tiny
against its minimum); there the result can differ from gguf's by one float32 ulp.
"""
from __future__ import annotations

import numpy as np
import torch

from cutlass_ops.importers._common import Imported, UnsupportedFormatError, build_weight

# ggml type ids (gguf.GGMLQuantizationType values) -> (name, bytes per block of 32).
GGML_TYPES = {8: ("Q8_0", 34), 2: ("Q4_0", 18), 3: ("Q4_1", 20)}
QK = 32  # elements per block


def _type_id(tensor_type) -> int:
    if isinstance(tensor_type, str):
        for tid, (name, _) in GGML_TYPES.items():
            if name == tensor_type.upper():
                return tid
        raise UnsupportedFormatError(f"tensor_type={tensor_type} is not supported: GGUF import "
                                     f"handles {[n for n, _ in GGML_TYPES.values()]}")
    tid = int(tensor_type)
    if tid not in GGML_TYPES:
        name = getattr(tensor_type, "name", str(tid))
        raise UnsupportedFormatError(f"tensor_type={name} is not supported: GGUF import handles "
                                     f"{[n for n, _ in GGML_TYPES.values()]}")
    return tid


def _blocks(data, tid: int, shape) -> tuple[np.ndarray, int, int]:
    """(uint8 blocks [N, K // 32, bytes], N, K) from raw bytes and a ggml-order shape."""
    dims = [int(d) for d in np.asarray(shape).reshape(-1).tolist()]
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    if len(dims) != 2:
        raise UnsupportedFormatError(f"shape={tuple(dims)} (ggml order ne0, ne1, ...) is not a "
                                     "2-D weight; GGUF import handles [ne0 = K, ne1 = N]")
    K, N = dims
    name, nbytes = GGML_TYPES[tid]
    if K % QK != 0:
        raise ValueError(f"shape: ne0 = K = {K} must be a multiple of the {name} block size {QK}")
    raw = np.ascontiguousarray(np.asarray(data)).view(np.uint8).reshape(-1)
    if raw.size != N * (K // QK) * nbytes:
        raise ValueError(f"data holds {raw.size} bytes; {name} shape (K={K}, N={N}) needs "
                         f"{N * (K // QK) * nbytes}")
    return raw.reshape(N, K // QK, nbytes), N, K


def _f16(b: np.ndarray) -> torch.Tensor:
    """Two bytes per block (little-endian fp16) -> float32 [N, G]."""
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32))


def _nibbles(b: np.ndarray) -> torch.Tensor:
    """16 bytes per block -> u int32 [N, G, 32]: low nibbles are elements 0..15, high 16..31."""
    u = torch.from_numpy(np.ascontiguousarray(b)).to(torch.int32)
    return torch.cat((u & 0xF, u >> 4), dim=-1)


def from_gguf(tensor=None, *, data=None, tensor_type=None, shape=None) -> Imported:
    """Import one GGUF tensor: a ``gguf.ReaderTensor`` (or anything with ``.data``,
    ``.tensor_type`` and ``.shape``), a ``(data, tensor_type, shape)`` triple, or the three as
    keywords. ``shape`` is in ggml order (ne0 = K first), as ``ReaderTensor.shape`` gives it;
    ``tensor_type`` is a ``gguf.GGMLQuantizationType``, its int value or its name ("Q4_0").
    ``perm`` of the result is always None.
    """
    if tensor is not None:
        if hasattr(tensor, "tensor_type"):  # gguf.ReaderTensor (itself a NamedTuple)
            data, tensor_type, shape = tensor.data, tensor.tensor_type, tensor.shape
        else:
            data, tensor_type, shape = tensor
    if data is None or tensor_type is None or shape is None:
        raise ValueError("from_gguf needs a tensor, or data, tensor_type and shape")
    tid = _type_id(tensor_type)
    blocks, N, K = _blocks(data, tid, shape)
    G = K // QK
    d = _f16(blocks[..., 0:2])
    neg_zero = torch.full((N, G), -0.0)
    if tid == 8:  # Q8_0
        q = torch.from_numpy(np.ascontiguousarray(blocks[..., 2:]).view(np.int8)).to(torch.int32)
        return Imported(build_weight(q.reshape(N, K), d, neg_zero, 8, QK), None)
    if tid == 2:  # Q4_0
        u = _nibbles(blocks[..., 2:])
        return Imported(build_weight((u - 8).reshape(N, K), d, neg_zero, 4, QK), None)
    m = _f16(blocks[..., 2:4])  # Q4_1
    u = _nibbles(blocks[..., 4:])
    offset = m + 8.0 * d  # 8 * d is exact; the sum is exact unless m, d are > 12 binades apart
    return Imported(build_weight((u - 8).reshape(N, K), d, offset, 4, QK), None)

