"""``cutlass_ops.load_quantized`` on whole checkpoints, on the CPU: a tiny Llama-style model (HF names) is
written in each on-disk format by the writers of tests/_quant_writers.py, loaded into a freshly built float
model, and compared with the model whose linears hold the source's own dequantized weights. On the CPU a
QuantLinear runs the float64 reference rounded to float32, so outputs agree to float32 rounding."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_ops
from cutlass_ops.importers import Imported, llama_gguf_names, read_gguf, read_gguf_file
from cutlass_ops.importers.gguf_file import _rope_unpermute
from cutlass_ops.nn import QuantLinear
from _quant_writers import (
    awq_reference, ct_config, gptq_reference, make_awq, make_ct_packed, make_gptq, write_checkpoint,
    write_gguf,
)

HIDDEN, INTER, VOCAB, N_HEAD, N_KV, LAYERS = 64, 96, 80, 4, 2, 2
HEAD_DIM = HIDDEN // N_HEAD


def _proj(inter: int = INTER) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each linear of a block."""
    return {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (N_KV * HEAD_DIM, HIDDEN),
            "self_attn.v_proj": (N_KV * HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
            "mlp.gate_proj": (inter, HIDDEN), "mlp.up_proj": (inter, HIDDEN), "mlp.down_proj": (HIDDEN, inter)}


LINEARS = [f"model.layers.{i}.{p}" for i in range(LAYERS) for p in _proj()]


def _rope(x: torch.Tensor) -> torch.Tensor:
    """HF Llama's rotary embedding (rotate_half layout) on [B, heads, T, HEAD_DIM]: what makes llama.cpp's
    Q/K row order (interleaved pairs) differ from HF's, so the GGUF test sees whether it is undone."""
    T = x.shape[2]
    inv = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    ang = torch.cat([torch.outer(torch.arange(T, dtype=torch.float32), inv)] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * ang.cos() + torch.cat((-x2, x1), dim=-1) * ang.sin()


class Block(nn.Module):
    def __init__(self, attn_bias: bool, inter: int):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.self_attn, self.mlp = nn.Module(), nn.Module()
        for name, (n, k) in _proj(inter).items():
            part, _, leaf = name.partition(".")
            bias = attn_bias and leaf in ("q_proj", "k_proj", "v_proj")
            setattr(getattr(self, part), leaf, nn.Linear(k, n, bias=bias))

    def forward(self, h):
        a, m = self.self_attn, self.mlp
        x = self.input_layernorm(h)
        B, T, _ = x.shape
        q = _rope(a.q_proj(x).view(B, T, N_HEAD, HEAD_DIM).transpose(1, 2))
        k, v = (p(x).view(B, T, N_KV, HEAD_DIM).transpose(1, 2).repeat_interleave(N_HEAD // N_KV, 1)
                for p in (a.k_proj, a.v_proj))
        k = _rope(k)
        h = h + a.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1))
        x = self.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))


class TinyLlama(nn.Module):
    """HF LlamaForCausalLM's module names: model.embed_tokens, model.layers.N.*, model.norm, lm_head."""

    def __init__(self, seed: int, attn_bias: bool = False, inter: int = INTER):
        super().__init__()
        torch.manual_seed(seed)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList(Block(attn_bias, inter) for _ in range(LAYERS))
        self.model.norm = nn.RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():  # non-trivial norm weights, so that loading them is visible
            for m in self.modules():
                if isinstance(m, nn.RMSNorm):
                    m.weight.uniform_(0.5, 1.5)

    def forward(self, ids):
        h = self.model.embed_tokens(ids)
        for block in self.model.layers:
            h = block(h)
        return self.lm_head(self.model.norm(h))


IDS = torch.tensor([[1, 7, 3, 60, 22, 5], [9, 0, 41, 2, 79, 13]])


def _floats(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a quantized checkpoint keeps in float: everything but the layers' linear weights."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if not (k.endswith(".weight") and k[: -len(".weight")] in LINEARS)}


def _expected(src: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    with torch.no_grad():
        for name, w in weights.items():
            src.get_submodule(name).weight.copy_(w)
    return src


def _check(summary, fresh, expected, replaced=LINEARS):
    assert sorted(summary.replaced) == sorted(replaced) and not summary.unused and not summary.missing
    assert all(isinstance(fresh.get_submodule(n), QuantLinear) for n in replaced)
    with torch.no_grad():
        y, ref = fresh(IDS), expected(IDS)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)  # float64 sums vs float32 ones


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act_order"])
@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_checkpoint(tmp_path, act_order, bits):
    gen = torch.Generator().manual_seed(bits + act_order)
    src, tensors, weights = TinyLlama(0, attn_bias=True), {}, {}
    tensors.update(_floats(src))
    for name in LINEARS:
        n, k = src.get_submodule(name).weight.shape
        qweight, qzeros, scales, g_idx = make_gptq(gen, k, n, bits, 32, "gptq", False, act_order=act_order)
        scales = (scales.float() / 2 ** (bits - 4)).half()  # 8-bit: weights as small as the 4-bit ones
        tensors.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": scales,
                        f"{name}.g_idx": g_idx})
        weights[name] = gptq_reference(qweight, qzeros, scales, g_idx, bits, "gptq", torch.float32)
    path = write_checkpoint(tmp_path / "gptq", tensors, {"quant_method": "gptq", "bits": bits, "group_size": 32,
                                                          "desc_act": act_order, "sym": False})
    fresh = TinyLlama(1, attn_bias=True)
    summary = cutlass_ops.load_quantized(fresh, path)
    _check(summary, fresh, _expected(src, weights))
    q = fresh.model.layers[1].self_attn.q_proj
    assert (q.perm is not None) == act_order and q.bias is not None
    assert summary.bits_per_weight == bits + 2.0  # float32 scale + offset per group of 32
    assert "model.norm.weight" in summary.loaded and "lm_head.weight" in summary.loaded
    assert torch.equal(q.dequantize(torch.float32), weights["model.layers.1.self_attn.q_proj"])

    # the act-order layers survive save_quantized / load_quantized_state (perm in the state dict)
    cutlass_ops.save_quantized(fresh, tmp_path / "re.safetensors")
    again = TinyLlama(2, attn_bias=True)
    cutlass_ops.load_quantized_state(again, tmp_path / "re.safetensors")
    with torch.no_grad():
        assert torch.equal(again(IDS), fresh(IDS))
    assert (again.model.layers[0].mlp.down_proj.perm is not None) == act_order


def test_awq_checkpoint_file(tmp_path):
    gen = torch.Generator().manual_seed(3)
    src, tensors, weights = TinyLlama(0), {}, {}
    tensors.update(_floats(src))
    for name in LINEARS:
        n, k = src.get_submodule(name).weight.shape
        qweight, qzeros, scales = make_awq(gen, k, n, 32)
        tensors.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": scales})
        weights[name] = awq_reference(qweight, qzeros, scales.float(), 32)  # exact in float32
    write_checkpoint(tmp_path, tensors, {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm",
                                         "zero_point": True})
    fresh = TinyLlama(1)
    _check(cutlass_ops.load_quantized(fresh, tmp_path / "model.safetensors"), fresh, _expected(src, weights))


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, False)])
def test_compressed_tensors_checkpoint(tmp_path, bits, sym):
    gen = torch.Generator().manual_seed(bits + sym)
    src, tensors, weights = TinyLlama(0), {}, {}
    tensors.update(_floats(src))
    for name in LINEARS:
        n, k = src.get_submodule(name).weight.shape
        sd, weights[name] = make_ct_packed(gen, n, k, bits, 32, sym)
        tensors.update({f"{name}.{s}": t for s, t in sd.items()})
    write_checkpoint(tmp_path, tensors, ct_config(bits, 32, sym))
    fresh = TinyLlama(1)
    _check(cutlass_ops.load_quantized(fresh, tmp_path), fresh, _expected(src, weights))


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: the rotary row order llama.cpp stores Q and K in."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_gguf_checkpoint_with_llama_names(tmp_path):
    gguf = pytest.importorskip("gguf")
    src = TinyLlama(0)
    sd = {k: v.numpy() for k, v in src.state_dict().items()}
    gguf_names = {v: k for k, v in ((g, llama_gguf_names(g)) for g in
                  ["token_embd.weight", "output_norm.weight", "output.weight"]
                  + [f"blk.{i}.{p}.weight" for i in range(LAYERS) for p in llama_gguf_names.BLOCK])}
    types = ["Q8_0", "Q4_0", "Q4_1"]
    tensors, weights = {}, {}
    for i, (key, a) in enumerate(sd.items()):
        gname, name = gguf_names[key], key[: -len(".weight")]
        if a.ndim == 1:
            tensors[gname] = a
            continue
        qtype = types[i % 3]
        ref = gguf.quants.dequantize(gguf.quants.quantize(a, gguf.GGMLQuantizationType[qtype]),
                                     gguf.GGMLQuantizationType[qtype])
        weights[name] = torch.from_numpy(ref.copy())
        n_head = {"q_proj": N_HEAD, "k_proj": N_KV}.get(name.rsplit(".", 1)[-1])
        tensors[gname] = (a if n_head is None else _llama_cpp_permute(a, n_head), qtype)
    tensors["rope_freqs.weight"] = np.ones(HEAD_DIM // 2, np.float32)  # no model counterpart
    path = write_gguf(tmp_path / "tiny.gguf", tensors, {"llama.attention.head_count": N_HEAD,
                                                        "llama.attention.head_count_kv": N_KV})
    fresh = TinyLlama(1)
    summary = cutlass_ops.load_quantized(fresh, path, name_map=llama_gguf_names)
    assert summary.dequantized == ["model.embed_tokens.weight"] and summary.unused == ["rope_freqs.weight"]
    summary.unused = []
    with torch.no_grad():
        src.model.embed_tokens.weight.copy_(weights.pop("model.embed_tokens"))
    _check(summary, fresh, _expected(src, weights), replaced=LINEARS + ["lm_head"])
    contents = read_gguf_file(path)
    assert set(read_gguf(path)) == set(contents.imported) and "output_norm.weight" in contents.floats
    assert contents.metadata["llama.attention.head_count"] == N_HEAD


def test_read_gguf_skips_other_types(tmp_path, caplog):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("q4k", np.zeros((2, 144), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.add_tensor("q8", gguf.quants.quantize(np.ones((3, 64), np.float32), gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file,
                 writer.close):
        step()
    with caplog.at_level("INFO", logger="cutlass_ops.importers.gguf_file"):
        imported = read_gguf(path)
    assert list(imported) == ["q8"] and isinstance(imported["q8"], Imported) and imported["q8"].weight.N == 3
    assert "skipped q4k: tensor type Q4_K is not imported" in caplog.text


def test_rope_unpermute_inverts_llama_cpp():
    w = np.arange(32 * 3, dtype=np.float32).reshape(32, 3)
    rows = _rope_unpermute(32, 4).numpy()
    assert np.array_equal(_llama_cpp_permute(w, 4)[rows], w)


def _gptq_dir(tmp_path, inter=INTER):
    gen = torch.Generator().manual_seed(0)
    src, tensors = TinyLlama(0, inter=inter), {}
    tensors.update(_floats(src))
    for name in LINEARS:
        n, k = src.get_submodule(name).weight.shape
        qweight, qzeros, scales, g_idx = make_gptq(gen, k, n, 4, 32, "gptq", True)
        tensors.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": scales})
    return write_checkpoint(tmp_path / f"gptq{inter}", tensors, {"quant_method": "gptq", "bits": 4, "group_size": 32})


def test_refusals_name_the_layer(tmp_path):
    path = _gptq_dir(tmp_path)
    fresh = TinyLlama(1, inter=128)
    with pytest.raises(ValueError, match=r"checkpoint layer 'model.layers.0.mlp.down_proj' \(gptq\) is 64 x 96 "
                                         r"\(out_features x in_features\) but the model's nn.Linear "
                                         r"model.layers.0.mlp.down_proj is 64 x 128"):
        cutlass_ops.load_quantized(fresh, path)
    assert not any(isinstance(m, QuantLinear) for m in fresh.modules())  # refused before any change
    fresh = TinyLlama(1)
    fresh.model.layers[1].mlp.up_proj = nn.Identity()
    with pytest.raises(ValueError, match="'model.layers.1.mlp.up_proj' .* is a Identity, not a float nn.Linear"):
        cutlass_ops.load_quantized(fresh, path)
    with pytest.raises(ValueError, match="needs name_map="):
        (tmp_path / "x.gguf").write_bytes(b"")
        cutlass_ops.load_quantized(fresh, tmp_path / "x.gguf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cutlass_ops.load_quantized(fresh, tmp_path / "nowhere")


def test_strict_unused_and_name_map(tmp_path):
    path = _gptq_dir(tmp_path)
    small = TinyLlama(1)
    del small.lm_head  # the checkpoint's lm_head.weight then has no place in the model
    summary = cutlass_ops.load_quantized(small, path)
    assert summary.unused == ["lm_head.weight"] and len(summary.replaced) == len(LINEARS)
    assert "1 checkpoint tensors unused" in str(summary)
    with pytest.raises(ValueError, match=r"strict=True: .*lm_head.weight"):
        bare = TinyLlama(1)
        del bare.lm_head
        cutlass_ops.load_quantized(bare, path, strict=True)
    assert not any(isinstance(m, QuantLinear) for m in bare.modules())  # refused before any change
    # name_map renames checkpoint tensors (here: a model that holds the decoder directly)
    decoder = TinyLlama(1).model
    summary = cutlass_ops.load_quantized(decoder, path, name_map=lambda k: k.removeprefix("model.")
                                         if k.startswith("model.") else None)
    assert summary.unused == ["lm_head.weight"] and isinstance(decoder.layers[0].mlp.up_proj, QuantLinear)


def test_act_order_module_gradients_and_moves():
    gen = torch.Generator().manual_seed(4)
    from cutlass_ops.importers import from_gptq
    qweight, qzeros, scales, g_idx = make_gptq(gen, 128, 24, 4, 32, "gptq", False, act_order=True)
    imp = from_gptq(qweight, qzeros, scales, g_idx, bits=4, group_size=32, sym=False)
    bias = torch.randn(24, generator=gen)
    q = QuantLinear.from_imported(imp, bias)
    w = gptq_reference(qweight, qzeros, scales, g_idx, 4, "gptq", torch.float32)
    assert torch.equal(q.dequantize(torch.float32), w)  # nn.Linear K order, act-order undone
    x = torch.randn(3, 5, 128, generator=gen, requires_grad=True)
    q.bias.requires_grad_(True)
    q(x).square().sum().backward()
    x2 = x.detach().clone().requires_grad_(True)
    F.linear(x2, w, bias).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-5, atol=1e-5)
    assert q.to("meta").perm.device.type == "meta" and q.half().perm.dtype == torch.int64
    with pytest.raises(ValueError, match=r"x must have shape \[..., K\] with K=128"):
        QuantLinear.from_imported(imp)(torch.randn(2, 127))
    with pytest.raises(ValueError, match="perm must be a permutation"):
        QuantLinear.from_imported(Imported(imp.weight, torch.zeros(128, dtype=torch.long)))
