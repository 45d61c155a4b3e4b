"""Checkpoint importers: each source format written by a small writer that follows the source's
own packer, imported, and compared with the source's own dequantization (bit for bit in float32;
in fp16 where the source dequantizes in fp16). Writers and references (tests/_quant_writers.py) are
transcribed from AutoGPTQ (qlinear_cuda_old.pack / forward), AutoAWQ (WQLinear_GEMM.from_linear,
utils/packing_utils.dequantize_gemm) and compressed-tensors / gguf (their installed packages)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cutlass_ops.importers import (
    UnsupportedFormatError, apply_perm, bits_per_weight, from_awq, from_compressed_tensors,
    from_gguf, from_gptq, import_layer, quantization_config,
)
from _quant_writers import (  # noqa: F401 - the writers and references, shared with test_load_quantized.py
    AWQ_ORDER, awq_reference, bits_equal, fp16_scales, gptq_reference, make_gptq, pack_awq, pack_ct,
)


# ------------------------------------------------------------------------------ GPTQ
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("gs", [32, -1])
def test_gptq_matches_autogptq_dequant(bits, fmt, sym, gs):
    gen = torch.Generator().manual_seed(bits * 7 + sym)
    K, N = 128, 24
    group = K if gs == -1 else gs
    qweight, qzeros, scales, g_idx = make_gptq(gen, K, N, bits, group, fmt, sym)
    imp = from_gptq(qweight, qzeros, scales, g_idx, bits=bits, group_size=gs, sym=sym,
                    checkpoint_format=fmt)
    assert imp.perm is None and imp.weight.symmetric == sym and imp.weight.bits == bits
    w = imp.weight.dequantize()
    assert bits_equal(w, gptq_reference(qweight, qzeros, scales, g_idx, bits, fmt, torch.float32))
    assert bits_equal(w.half(), gptq_reference(qweight, qzeros, scales, g_idx, bits, fmt, torch.float16))


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_act_order(bits):
    gen = torch.Generator().manual_seed(3)
    K, N, gs = 256, 16, 32
    qweight, qzeros, scales, g_idx = make_gptq(gen, K, N, bits, gs, "gptq", False, act_order=True)
    imp = from_gptq(qweight, qzeros, scales, g_idx, bits=bits, group_size=gs, sym=False)
    perm = imp.perm
    assert perm is not None and torch.equal(torch.sort(perm).values, torch.arange(K))
    assert bool((g_idx[perm].long() == torch.arange(K) // gs).all())  # groups now contiguous
    w_src = gptq_reference(qweight, qzeros, scales, g_idx, bits, "gptq", torch.float32)
    w_perm = imp.weight.dequantize()
    assert bits_equal(w_perm, w_src[:, perm].contiguous())
    x = torch.randn(3, K, generator=gen, dtype=torch.float64)
    y = apply_perm(x, perm) @ w_perm.double().t()
    torch.testing.assert_close(y, x @ w_src.double().t(), rtol=1e-12, atol=1e-12)


def test_gptq_refusals():
    gen = torch.Generator().manual_seed(0)
    qweight, qzeros, scales, g_idx = make_gptq(gen, 64, 16, 4, 32, "gptq", True)
    with pytest.raises(UnsupportedFormatError, match="bits=3"):
        from_gptq(qweight, qzeros, scales, bits=3, group_size=32)
    with pytest.raises(UnsupportedFormatError, match="bits=2"):
        from_gptq(qweight, qzeros, scales, bits=2, group_size=32)
    with pytest.raises(UnsupportedFormatError, match="group_size=48 does not divide K=64"):
        from_gptq(qweight, qzeros, scales, bits=4, group_size=48)
    with pytest.raises(UnsupportedFormatError, match="checkpoint_format"):
        from_gptq(qweight, qzeros, scales, bits=4, group_size=32, checkpoint_format="marlin")
    with pytest.raises(ValueError, match="sym=True but the zero points"):  # v1 read as v2
        from_gptq(qweight, qzeros, scales, bits=4, group_size=32, checkpoint_format="gptq_v2")
    with pytest.raises(UnsupportedFormatError, match="N=12 must be a multiple of 8"):
        from_gptq(qweight[:, :12], qzeros, scales[:, :12], bits=4, group_size=32)
    with pytest.raises(ValueError, match="scales must have shape"):
        from_gptq(qweight, qzeros, scales[:1], bits=4, group_size=32)
    unbalanced = (torch.arange(64) // 32).int()
    unbalanced[0] = 1  # group 0 now has 31 channels, group 1 has 33
    with pytest.raises(UnsupportedFormatError, match="g_idx puts 31 channels in group 0"):
        from_gptq(qweight, qzeros, scales, unbalanced, bits=4, group_size=32)


def test_bits_per_weight_g128():
    gen = torch.Generator().manual_seed(0)
    qweight, qzeros, scales, _ = make_gptq(gen, 256, 32, 4, 128, "gptq", True)
    qw = from_gptq(qweight, qzeros, scales, bits=4, group_size=128).weight
    assert bits_per_weight(qw) == 4.5  # float32 scale + offset: 4 + 64 / 128


# ------------------------------------------------------------------------------ AWQ
@pytest.mark.parametrize("gs", [32, 128])
def test_awq_matches_autoawq_dequant(gs):
    gen = torch.Generator().manual_seed(gs)
    K, N = 128, 40
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.randint(0, 16, (K // gs, N), generator=gen)
    scales = fp16_scales(gen, K // gs, N)
    qweight, qzeros = pack_awq(q), pack_awq(z)
    imp = from_awq(qweight, qzeros, scales, group_size=gs)
    w = imp.weight.dequantize()
    assert bits_equal(w.half(), awq_reference(qweight, qzeros, scales, gs))  # AutoAWQ: fp16
    exact = (q - z.repeat_interleave(gs, 0)).float() * scales.float().repeat_interleave(gs, 0)
    assert bits_equal(w, exact.t().contiguous())


def test_awq_refusals():
    qweight, qzeros = torch.zeros(64, 2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(UnsupportedFormatError, match="bits=8"):
        from_awq(qweight, qzeros, torch.ones(2, 16).half(), group_size=32, bits=8)
    with pytest.raises(UnsupportedFormatError, match="group_size=40 does not divide K=64"):
        from_awq(qweight, qzeros, torch.ones(2, 16).half(), group_size=40)


# ------------------------------------------------------------------------------ compressed-tensors
PACKED = "pack-quantized"
CT_CASES = [(4, "group", True, PACKED), (4, "group", False, PACKED), (4, "channel", True, PACKED),
            (4, "channel", False, PACKED), (4, "tensor", True, PACKED), (8, "group", False, PACKED),
            (8, "channel", True, PACKED), (8, "channel", True, "int-quantized"),
            (8, "channel", False, "int-quantized"), (8, "group", True, "naive-quantized"),
            (8, "tensor", True, "naive-quantized")]


@pytest.mark.parametrize("bits,strategy,sym,fmt", CT_CASES)
def test_compressed_tensors(bits, strategy, sym, fmt):
    gen = torch.Generator().manual_seed(bits + len(strategy) + sym)
    N, K, gs = 20, 96, 32
    G = {"group": K // gs, "channel": 1, "tensor": 1}[strategy]
    h = 1 << (bits - 1)
    q = torch.randint(-h, h, (N, K), generator=gen, dtype=torch.int8)
    scale = fp16_scales(gen, *((1,) if strategy == "tensor" else (N, G)))
    zp = None if sym else torch.randint(-h, h, (N, G), generator=gen, dtype=torch.int8)
    sd = {"weight_scale": scale}
    if fmt == "pack-quantized":
        sd.update(weight_packed=pack_ct(q, bits), weight_shape=torch.tensor([N, K]))
        if zp is not None:
            sd["weight_zero_point"] = pack_ct(zp, bits, dim=0)
    else:
        sd["weight"] = q
        if zp is not None:
            sd["weight_zero_point"] = zp
    imp = from_compressed_tensors(**sd, num_bits=bits, strategy=strategy, group_size=gs, format=fmt)
    w = imp.weight.dequantize()
    s_full = scale.float().reshape(-1, G).expand(N, G).repeat_interleave(K // G, 1)
    z_full = 0 if zp is None else zp.float().repeat_interleave(K // G, 1)
    assert bits_equal(w, (q.float() - z_full) * s_full)  # exact in float32
    assert imp.weight.symmetric == sym

    ct = pytest.importorskip("compressed_tensors")  # its own packer and decompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    if fmt == "pack-quantized":
        assert torch.equal(sd["weight_packed"], pack_to_int32(q, bits))
        if zp is not None:
            assert torch.equal(sd["weight_zero_point"], pack_to_int32(zp, bits, packed_dim=0))
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy,
                            group_size=gs if strategy == "group" else None)
    compressor = ct.compressors.BaseCompressor.load_from_registry(fmt)
    ref = compressor.decompress(dict(sd), QuantizationScheme(targets=["Linear"], weights=args))["weight"]
    assert bits_equal(w.to(ref.dtype), ref)  # the source dequantizes in the scale's dtype (fp16)


def test_compressed_tensors_legacy_g_idx():
    gen = torch.Generator().manual_seed(9)
    N, K, gs = 8, 64, 16
    q = torch.randint(-8, 8, (N, K), generator=gen, dtype=torch.int8)
    s = fp16_scales(gen, N, K // gs)
    g_idx = (torch.arange(K) // gs)[torch.randperm(K, generator=gen)]
    imp = from_compressed_tensors(s, num_bits=4, strategy="group", group_size=gs, weight_g_idx=g_idx,
                                  weight_packed=pack_ct(q, 4), weight_shape=torch.tensor([N, K]))
    w_src = q.float() * s.float()[:, g_idx]
    assert bits_equal(imp.weight.dequantize(), w_src[:, imp.perm].contiguous())


def test_compressed_tensors_refusals():
    s = torch.ones(8, 2).half()
    packed, shape = torch.zeros(8, 8, dtype=torch.int32), torch.tensor([8, 64])
    with pytest.raises(UnsupportedFormatError, match="num_bits=2"):
        from_compressed_tensors(s, num_bits=2, strategy="group", group_size=32,
                                weight_packed=packed, weight_shape=shape)
    with pytest.raises(UnsupportedFormatError, match="strategy='block'"):
        from_compressed_tensors(s, num_bits=4, strategy="block", weight_packed=packed, weight_shape=shape)
    with pytest.raises(UnsupportedFormatError, match="format='marlin-24'"):
        from_compressed_tensors(s, num_bits=4, strategy="group", group_size=32, format="marlin-24")
    with pytest.raises(ValueError, match="symmetric=False needs weight_zero_point"):
        from_compressed_tensors(s, num_bits=4, strategy="group", group_size=32, symmetric=False,
                                weight_packed=packed, weight_shape=shape)
    with pytest.raises(UnsupportedFormatError, match="K % 8 == 0"):
        from_compressed_tensors(torch.ones(8, 1).half(), num_bits=4, strategy="channel",
                                weight_packed=torch.zeros(8, 2, dtype=torch.int32),
                                weight_shape=torch.tensor([8, 12]))


# ------------------------------------------------------------------------------ GGUF
def test_gguf_roundtrip_file(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    T = gguf.GGMLQuantizationType
    w = {"q8": rng.standard_normal((24, 96)).astype(np.float32),
         "q40": rng.standard_normal((16, 128)).astype(np.float32),
         "q41": (rng.standard_normal((8, 64)) + 2.0).astype(np.float32)}
    types = {"q8": T.Q8_0, "q40": T.Q4_0, "q41": T.Q4_1}
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, a in w.items():
        writer.add_tensor(name, gguf.quants.quantize(a, types[name]), raw_dtype=types[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for t in gguf.GGUFReader(str(path)).tensors:
        ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
        for imp in (from_gguf(t), from_gguf((np.asarray(t.data).reshape(-1), t.tensor_type.name, t.shape))):
            assert imp.perm is None and imp.weight.block_size == 32
            assert tuple(ref.shape) == (imp.weight.N, imp.weight.K) == w[t.name].shape
            assert bits_equal(imp.weight.dequantize(), ref)  # signed zeros included


def test_gguf_q4_1_far_apart_min_and_scale():
    """m + 8 d not exact in float32 (m = 1000, d ~ 3e-5): within one float32 ulp of gguf."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(1)
    n_blocks = 8
    d = (rng.random((n_blocks, 1)) * 5e-5 + 1e-5).astype(np.float16)
    m = np.full((n_blocks, 1), 1000.0, np.float16)
    nib = rng.integers(0, 256, (n_blocks, 16), dtype=np.uint8)
    data = np.concatenate([d.view(np.uint8), m.view(np.uint8), nib], axis=1)
    ref = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q4_1).reshape(1, -1)
    w = from_gguf((data, "Q4_1", (32 * n_blocks, 1))).weight.dequantize().numpy()
    assert np.all(np.abs(w - ref) <= np.spacing(np.abs(ref)))
    assert not np.array_equal(w, ref)  # the case the module docstring warns about does occur


def test_gguf_refusals():
    with pytest.raises(UnsupportedFormatError, match="tensor_type=Q4_K"):
        from_gguf(data=np.zeros(144, np.uint8), tensor_type="Q4_K", shape=(256, 1))
    with pytest.raises(UnsupportedFormatError, match="tensor_type=14"):
        from_gguf(data=np.zeros(144, np.uint8), tensor_type=14, shape=(256, 1))
    with pytest.raises(UnsupportedFormatError, match="not a 2-D weight"):
        from_gguf(data=np.zeros(34 * 4, np.uint8), tensor_type="Q8_0", shape=(32, 2, 2))
    with pytest.raises(ValueError, match="data holds 10 bytes"):
        from_gguf(data=np.zeros(10, np.uint8), tensor_type="Q8_0", shape=(32, 1))


# ------------------------------------------------------------------------------ checkpoint files
def test_checkpoint_config_and_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    gen = torch.Generator().manual_seed(5)
    qweight, qzeros, scales, g_idx = make_gptq(gen, 128, 16, 4, 32, "gptq", False, act_order=True)
    prefix = "model.layers.0.mlp.down_proj"
    st.save_file({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": scales,
                  f"{prefix}.g_idx": g_idx}, str(tmp_path / "model.safetensors"))
    (tmp_path / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 32, "desc_act": True, "sym": False, "checkpoint_format": "gptq"}))
    cfg = quantization_config(tmp_path)
    assert (cfg.method, cfg.bits, cfg.group_size, cfg.sym, cfg.desc_act) == ("gptq", 4, 32, False, True)
    from cutlass_ops.importers import load_safetensors
    imp = import_layer(load_safetensors(tmp_path), prefix, cfg)
    ref = gptq_reference(qweight, qzeros, scales, g_idx, 4, "gptq", torch.float32)
    assert bits_equal(imp.weight.dequantize(), ref[:, imp.perm].contiguous())
    with pytest.raises(KeyError, match="no 'other.qweight'"):
        import_layer({}, "other", cfg)


@pytest.mark.parametrize("qcfg,match", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits=3"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "checkpoint_format='marlin'"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128, "version": "gemm"}, "bits=8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version='gemv'"),
    ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
        "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 16}}}},
     "weights.type='float'"),
])
def test_quantization_config_refusals(tmp_path, qcfg, match):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qcfg}))
    with pytest.raises(UnsupportedFormatError, match=match):
        quantization_config(tmp_path)


def test_quantization_config_awq_and_compressed(tmp_path):
    (tmp_path / "quant_config.json").write_text(json.dumps(
        {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"}))
    cfg = quantization_config(tmp_path)
    assert (cfg.method, cfg.bits, cfg.group_size, cfg.sym) == ("awq", 4, 64, False)
    gen = torch.Generator().manual_seed(2)
    q, z = torch.randint(0, 16, (128, 16), generator=gen), torch.randint(0, 16, (2, 16), generator=gen)
    tensors = {"l.qweight": pack_awq(q), "l.qzeros": pack_awq(z), "l.scales": fp16_scales(gen, 2, 16)}
    imp = import_layer(tensors, "l", cfg)
    assert bits_equal(imp.weight.dequantize().half(),
                      awq_reference(tensors["l.qweight"], tensors["l.qzeros"], tensors["l.scales"], 64))
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                           "strategy": "group", "group_size": 128}}}}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": ct}))
    cfg = quantization_config(tmp_path)
    assert (cfg.method, cfg.bits, cfg.group_size, cfg.format, cfg.strategy) == (
        "compressed-tensors", 4, 128, "pack-quantized", "group")
    q, s = torch.randint(-8, 8, (8, 256), generator=gen, dtype=torch.int8), fp16_scales(gen, 8, 2)
    tensors = {"l.weight_packed": pack_ct(q, 4), "l.weight_shape": torch.tensor([8, 256]),
               "l.weight_scale": s}
    imp = import_layer(tensors, "l.", cfg)
    assert bits_equal(imp.weight.dequantize(), q.float() * s.float().repeat_interleave(128, 1))


def test_checked_perm_validates_and_caches_per_version():
    from cutlass_ops import act_order, quantize_weight

    qw = quantize_weight(torch.randn(8, 64), bits=4, block_size=32)
    perm = torch.randperm(64)
    p32 = act_order.checked_perm(qw, perm)
    assert p32.dtype == torch.int32 and torch.equal(p32.long(), perm)
    assert act_order.checked_perm(qw, perm) is p32  # cached: no second check
    perm[0], perm[1] = perm[1].item(), perm[0].item()  # in place: a new version, checked and converted again
    assert torch.equal(act_order.checked_perm(qw, perm).long(), perm)
    perm[5] = 64
    with pytest.raises(ValueError, match=r"perm values must lie in \[0, K=64\)"):
        act_order.checked_perm(qw, perm)
    for bad in (torch.arange(63), torch.arange(64).float(), torch.arange(64).reshape(8, 8), [0] * 64):
        with pytest.raises(ValueError, match="perm must be an int32 or int64 tensor"):
            act_order.checked_perm(qw, bad)
