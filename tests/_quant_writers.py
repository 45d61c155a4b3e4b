"""Writers and reference dequantizations of the quantized checkpoint formats (not a test module).

Each writer follows the source's own packer, each reference its own dequantization, transcribed from
AutoGPTQ (qlinear_cuda_old.pack / forward), AutoAWQ (WQLinear_GEMM.from_linear,
utils/packing_utils.dequantize_gemm) and compressed-tensors / gguf (their installed packages). Used by
tests/test_importers.py (layer by layer), tests/test_load_quantized.py (whole checkpoints) and
tests/gpu/test_importers_gpu.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bit patterns (signed zeros included)."""
    itype = {torch.float32: torch.int32, torch.float16: torch.int16}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(itype), b.contiguous().view(itype))


def fp16_scales(gen, *shape):
    return (torch.rand(*shape, generator=gen) * 0.05 + 1e-3).half()


# ------------------------------------------------------------------------------ GPTQ
def pack_gptq(intweight, zeros, bits, fmt):
    """AutoGPTQ's QuantLinear.pack: intweight [K, N] along K, zeros [G, N] along N (v1: z - 1)."""
    f = 32 // bits
    iw = intweight.numpy().astype(np.uint32)
    qweight = np.zeros((iw.shape[0] // f, iw.shape[1]), dtype=np.uint32)
    for j in range(f):
        qweight |= iw[j::f] << np.uint32(bits * j)
    z = (zeros - 1 if fmt == "gptq" else zeros).numpy().astype(np.uint32)
    qzeros = np.zeros((z.shape[0], z.shape[1] // f), dtype=np.uint32)
    for j in range(f):
        qzeros |= z[:, j::f] << np.uint32(bits * j)
    return torch.from_numpy(qweight.view(np.int32)), torch.from_numpy(qzeros.view(np.int32))


def gptq_reference(qweight, qzeros, scales, g_idx, bits, fmt, dtype):
    """AutoGPTQ's torch dequantization: scales[g_idx] * (weight - zeros[g_idx]), W^T [K, N]."""
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    zeros = (qzeros[:, :, None] >> wf[None, None, :]) & (2 ** bits - 1)
    zeros = zeros.reshape(qzeros.shape[0], -1) + (1 if fmt == "gptq" else 0)
    weight = (qweight[:, None, :] >> wf[None, :, None]) & (2 ** bits - 1)
    weight = weight.reshape(-1, qweight.shape[1])
    g = g_idx.long()
    return (scales.to(dtype)[g] * (weight - zeros[g]).to(dtype)).t()  # [N, K]


def make_gptq(gen, K, N, bits, gs, fmt, sym, act_order=False):
    G = K // gs
    hi = 2 ** bits
    q = torch.randint(0, hi, (K, N), generator=gen)
    z = (torch.full((G, N), hi // 2) if sym else
         torch.randint(1, hi + 1, (G, N), generator=gen) if fmt == "gptq"  # v1 stores z - 1
         else torch.randint(0, hi, (G, N), generator=gen))
    g_idx = (torch.arange(K) // gs).int()
    if act_order:
        g_idx = g_idx[torch.randperm(K, generator=gen)]
    qweight, qzeros = pack_gptq(q, z, bits, fmt)
    return qweight, qzeros, fp16_scales(gen, G, N), g_idx


# ------------------------------------------------------------------------------ AWQ
def pack_awq(intweight):
    """AutoAWQ WQLinear_GEMM.from_linear: int [R, C] packed along C in AWQ_ORDER."""
    out = torch.zeros(intweight.shape[0], intweight.shape[1] // 8, dtype=torch.int32)
    for col in range(intweight.shape[1] // 8):
        for i in range(8):
            out[:, col] |= intweight[:, col * 8 + AWQ_ORDER[i]].int() << (i * 4)
    return out


def awq_reference(qweight, qzeros, scales, gs):
    """AutoAWQ packing_utils.dequantize_gemm (unpack_awq + reverse_awq_order), transposed to [N, K]."""
    shifts = torch.arange(0, 32, 4)
    iw = (qweight[:, :, None] >> shifts[None, None, :]).to(torch.int8).view(qweight.shape[0], -1)
    iz = (qzeros[:, :, None] >> shifts[None, None, :]).to(torch.int8).view(qzeros.shape[0], -1)
    order = torch.arange(iz.shape[-1]).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)
    iw, iz = iw[:, order] & 15, iz[:, order] & 15
    return ((iw - iz.repeat_interleave(gs, dim=0)) * scales.repeat_interleave(gs, dim=0)).t()


def make_awq(gen, K, N, gs):
    """(qweight, qzeros, scales) of a random AutoAWQ GEMM layer [N, K]."""
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.randint(0, 16, (K // gs, N), generator=gen)
    return pack_awq(q), pack_awq(z), fp16_scales(gen, K // gs, N)


# ------------------------------------------------------------------------------ compressed-tensors
def pack_ct(q, bits, dim=1):
    """compressed-tensors pack_to_int32: q + 2^(b-1) packed along ``dim``, low bits first."""
    f = 32 // bits
    u = (q.long() + (1 << (bits - 1))).movedim(dim, -1)
    pad = (-u.shape[-1]) % f
    u = torch.nn.functional.pad(u, (0, pad)).reshape(*u.shape[:-1], -1, f)
    words = (u << (torch.arange(f) * bits)).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def make_ct_packed(gen, N, K, bits, gs, sym):
    """({suffix: tensor} of a pack-quantized group layer, reference float32 W [N, K]); the scales
    shrink with the bit width (weights of about the same size for 4 and 8 bits)."""
    h = 1 << (bits - 1)
    G = K // gs
    q = torch.randint(-h, h, (N, K), generator=gen, dtype=torch.int8)
    s = (fp16_scales(gen, N, G).float() / (h // 8)).half()
    sd = {"weight_packed": pack_ct(q, bits), "weight_shape": torch.tensor([N, K]), "weight_scale": s}
    z = torch.zeros(N, G, dtype=torch.int8)
    if not sym:
        z = torch.randint(-h, h, (N, G), generator=gen, dtype=torch.int8)
        sd["weight_zero_point"] = pack_ct(z, bits, dim=0)
    w = (q.float() - z.float().repeat_interleave(gs, 1)) * s.float().repeat_interleave(gs, 1)
    return sd, w


def ct_config(bits, gs, sym) -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": bits, "type": "int", "symmetric": sym, "strategy": "group", "group_size": gs}}}}


# ------------------------------------------------------------------------------ files
def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], quantization_config: dict) -> Path:
    """An HF-style checkpoint directory: model.safetensors + config.json["quantization_config"]."""
    from safetensors.torch import save_file
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"quantization_config": quantization_config}))
    return directory


def write_gguf(path: Path, tensors: dict, metadata: dict | None = None, arch: str = "llama") -> Path:
    """A GGUF file through gguf's own writer: ``tensors`` name -> float32 numpy array (written as F32)
    or (float32 array [N, K], "Q8_0" | "Q4_0" | "Q4_1") quantized by gguf.quants.quantize."""
    import gguf
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (metadata or {}).items():
        writer.add_uint32(key, value)
    for name, t in tensors.items():
        if isinstance(t, tuple):
            a, type_name = t
            qtype = gguf.GGMLQuantizationType[type_name]
            writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(a, np.float32), qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(t, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
