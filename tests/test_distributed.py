"""Tensor parallelism on CPUs: exact shards of QuantizedWeight and BlockScaledWeight, their refusals, and column -> row parallel
QuantLinears (every mode) and a Llama-style layer split over 2 gloo processes against the unsharded layers."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from cutlass_ops.distributed import (
    ColumnParallelQuantLinear, RowParallelQuantLinear, shard_column, shard_perm, shard_row, tensor_parallel_llama_,
)
from cutlass_ops.formats import quantize_conv_weight, quantize_weight
from cutlass_ops.nn import QuantLinear
from cutlass_ops.quantize_model import (W8A8BlockConfig, W8A8BlockScaledConfig, W8A8ChannelConfig,
                                        WeightOnlyConfig, quantize_)
from cutlass_ops.w8a8.block_scaled import quantize_weight_block_scaled

N, K = 24, 512
BLOCKS = {"b32": 32, "b64": 64, "b128": 128, "per_channel": None}


def _qw(bits, block_size, symmetric, n=N, k=K, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return quantize_weight(w, bits=bits, block_size=block_size, symmetric=symmetric)


# --------------------------------------------------------------------------------------------
# shards: shapes and bit-exact slices
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("block", BLOCKS, ids=list(BLOCKS))
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", [4, 8], ids=["int4", "int8"])
@pytest.mark.parametrize("world", [2, 4])
def test_shards_are_exact_slices(bits, symmetric, block, world):
    qw = _qw(bits, BLOCKS[block], symmetric)
    w = qw.dequantize()
    Ns, Ks = N // world, K // world
    for rank in range(world):
        col = shard_column(qw, rank, world)
        assert (col.N, col.K, col.block_size, col.bits) == (Ns, K, qw.block_size, bits)
        assert col.qweight.shape == (Ns, qw.qweight.shape[1]) and col.scale.shape == (Ns, qw.num_groups)
        assert torch.equal(col.dequantize(), w[rank * Ns:(rank + 1) * Ns])

        row = shard_row(qw, rank, world)
        G = 1 if BLOCKS[block] is None else Ks // qw.block_size
        assert (row.N, row.K, row.block_size) == (N, Ks, Ks if BLOCKS[block] is None else qw.block_size)
        assert row.qweight.shape == (N, Ks if bits == 8 else Ks // 2) and row.offset.shape == (N, G)
        assert row.symmetric == symmetric
        assert torch.equal(row.dequantize(), w[:, rank * Ks:(rank + 1) * Ks])


def test_row_shards_rebuild_the_product_with_act_order():
    qw, perm = _qw(4, 64, False), torch.randperm(K, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, K, dtype=torch.float64)
    ref = x[:, perm] @ qw.dequantize(torch.float64).T  # QuantLinear's act-order product: W stored as W[:, perm]
    parts = [x[:, shard_perm(perm, r, 4)] @ shard_row(qw, r, 4).dequantize(torch.float64).T for r in range(4)]
    torch.testing.assert_close(sum(parts), ref, rtol=1e-12, atol=1e-12)
    assert shard_perm(None, 0, 2) is None
    assert torch.equal(torch.cat([shard_perm(perm, r, 4) for r in range(4)]), perm)


def test_conv_weight_splits_output_channels():
    qw = quantize_conv_weight(torch.randn(8, 16, 3, 3), bits=4, block_size=16)
    s = shard_column(qw, 1, 2)
    assert s.conv_shape == (4, 3, 3, 16) and torch.equal(s.dequantize(), qw.dequantize()[4:])
    with pytest.raises(ValueError, match="conv weight"):
        shard_row(qw, 0, 2)


@pytest.mark.parametrize("bits, block_size, n, k, world, match", [
    (8, 128, N, 384, 2, r"K / world = 384/2 = 192 .*block_size=128"),     # cuts a quantization block
    (8, 64, N, 512, 16, r"K / world = 512/16 = 32 .*block_size=64"),
    (4, None, N, 48, 4, r"K / world = 48/4 = 12 .*multiple of 8"),       # cuts a packed int4 word
    (8, None, N, 510, 4, r"world=4 must divide K=510"),
    (8, 64, 10, 512, 4, r"world=4 must divide N=10"),
], ids=["block", "block_w16", "int4_word", "K", "N"])
def test_refuses_splits_that_break_the_format(bits, block_size, n, k, world, match):
    qw = _qw(bits, block_size, True, n=n, k=k)
    with pytest.raises(ValueError, match=match):
        (shard_column if "N=" in match else shard_row)(qw, 0, world)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("block_size", [64, 128])
def test_block_scaled_shards_are_exact_tiles(block_size, world):
    w = torch.randn(4 * 128, 1024, generator=torch.Generator().manual_seed(1))
    qw = quantize_weight_block_scaled(w, block_size)
    full = qw.dequantize(torch.float64)
    Ns, Ks = qw.N // world, qw.K // world
    for rank in range(world):
        col, row = shard_column(qw, rank, world), shard_row(qw, rank, world)
        assert (col.N, col.K, row.N, row.K, col.block_size, row.block_size) == (Ns, qw.K, qw.N, Ks, block_size,
                                                                                block_size)
        assert torch.equal(col.dequantize(torch.float64), full[rank * Ns:(rank + 1) * Ns])
        assert torch.equal(row.dequantize(torch.float64), full[:, rank * Ks:(rank + 1) * Ks])


def test_block_scaled_refuses_splits_that_cut_a_tile():
    qw = quantize_weight_block_scaled(torch.randn(192, 384), 64)
    with pytest.raises(ValueError, match=r"column parallel: N / world = 192/2 = 96 .*block_size=64"):
        shard_column(qw, 0, 2)
    with pytest.raises(ValueError, match=r"row parallel: K / world = 384/4 = 96 .*block_size=64"):
        shard_row(qw, 0, 4)
    with pytest.raises(ValueError, match=r"world=5 must divide K \(in_features\)=384"):
        shard_row(qw, 0, 5)


def test_refuses_bad_rank_world_and_inputs():
    qw = _qw(8, 64, True)
    with pytest.raises(ValueError, match="rank must be < world"):
        shard_column(qw, 2, 2)
    with pytest.raises(ValueError, match="world must be >= 1"):
        shard_row(qw, 0, 0)
    with pytest.raises(TypeError, match="rank must be an int"):
        shard_row(qw, 0.0, 2)
    with pytest.raises(TypeError, match="qw must be a QuantizedWeight or a BlockScaledWeight"):
        shard_row(qw.dequantize(), 0, 2)
    q = QuantLinear.from_float(nn.Linear(K, N), WeightOnlyConfig(bits=4, block_size=64))
    q.set_perm(torch.randperm(K))
    with pytest.raises(ValueError, match="input_is_parallel=False"):
        RowParallelQuantLinear(q, 0, 2)


@pytest.mark.parametrize("mode", ["w4", "w8a8_block", "w8a8_channel", "w8a8_block_scaled"])
def test_world_one_is_the_unsharded_layer(mode):
    config = {"w4": WeightOnlyConfig(bits=4, block_size=64), "w8a8_block": W8A8BlockConfig(block_size=64),
              "w8a8_channel": W8A8ChannelConfig(), "w8a8_block_scaled": W8A8BlockScaledConfig(block_size=64)}[mode]
    q = QuantLinear.from_float(nn.Linear(K, 32), config)
    x = torch.randn(3, K)
    assert torch.equal(ColumnParallelQuantLinear(q, 0, 1)(x), q(x))
    torch.testing.assert_close(RowParallelQuantLinear(q, 0, 1)(x), q(x), rtol=1e-6, atol=1e-6)  # bias after


# --------------------------------------------------------------------------------------------
# 2 processes over gloo
# --------------------------------------------------------------------------------------------

class TinyLlamaLayer(nn.Module):
    """A Llama-style decoder layer (no KV cache): RMSNorm, GQA attention with RoPE-free heads, SwiGLU MLP."""

    def __init__(self, d=128, heads=4, kv_heads=2, mlp=256):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.q_proj, self.o_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(d, kv_heads * self.hd, bias=False) for _ in range(2))
        self.gate_proj, self.up_proj = (nn.Linear(d, mlp, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(mlp, d, bias=False)
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        q, k, v = (p(h).view(B, T, n, self.hd).transpose(1, 2) for p, n in
                   ((self.q_proj, self.heads), (self.k_proj, self.kv_heads), (self.v_proj, self.kv_heads)))
        k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, self.heads * self.hd))
        h = self.n2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


MLP_CASES = {  # name: (config, relative tolerance against the unsharded layers)
    "w4": (WeightOnlyConfig(bits=4, block_size=64, symmetric=False), 1e-5),
    "w8": (WeightOnlyConfig(bits=8, block_size=None), 1e-5),
    "w8a8_block": (W8A8BlockConfig(block_size=64), 1e-5),  # the shard's activation blocks are the unsharded ones
    "w8a8_channel": (W8A8ChannelConfig(), 3e-2),  # per-token activation scale over K / world instead of K
    "w8a8_block_scaled": (W8A8BlockScaledConfig(block_size=64), 1e-5),  # whole tiles: the same blocks
}


def _close(got, ref, rtol, what):
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err <= rtol, f"{what}: max |tp - unsharded| / max |unsharded| = {err:.3g} > {rtol}"


def _worker(rank, world, init_method):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same float layers and inputs on every rank
        up, down, x = nn.Linear(128, 256), nn.Linear(256, 96), torch.randn(2, 5, 128)
        for name, (config, rtol) in MLP_CASES.items():
            q_up, q_down = QuantLinear.from_float(up, config), QuantLinear.from_float(down, config)
            ref = q_down(F.gelu(q_up(x)))
            col = ColumnParallelQuantLinear(q_up, rank, world)
            row = RowParallelQuantLinear(q_down, rank, world)
            _close(row(F.gelu(col(x))), ref, rtol, f"{name} column -> row")
            full = ColumnParallelQuantLinear(q_up, rank, world, gather_output=True)(x)
            assert torch.equal(full, q_up(x)), f"{name}: gathered column output differs"
        # act-order: the row shard gathers its scattered input columns from the full input
        q = QuantLinear.from_float(down, WeightOnlyConfig(bits=4, block_size=32))
        perm = torch.randperm(256)
        q.set_weight(quantize_weight(down.weight.detach()[:, perm], bits=4, block_size=32))
        q.set_perm(perm)
        h = torch.randn(3, 256)
        _close(RowParallelQuantLinear(q, rank, world, input_is_parallel=False)(h), q(h), 1e-5, "act-order row")
        # a Llama-style layer: heads split, q/k/v/gate/up column, o/down row
        layer = TinyLlamaLayer()
        config = WeightOnlyConfig(bits=4, block_size=32)
        ref_layer = copy.deepcopy(layer)
        quantize_(ref_layer, config)
        names = tensor_parallel_llama_(layer, config, rank, world)
        assert len(names) == 7 and (layer.heads, layer.kv_heads) == (2, 1)
        x = torch.randn(2, 6, 128)
        with torch.no_grad():
            y, ref = layer(x), ref_layer(x)
        _close(y, ref, 1e-5, "llama layer")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_match_the_unsharded_layers(tmp_path):
    init_method = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_worker, args=(2, init_method), nprocs=2, join=True)


def test_llama_split_refuses_heads_that_do_not_divide():
    layer = TinyLlamaLayer(heads=4, kv_heads=2)
    with pytest.raises(ValueError, match=r"kv_heads=2 is not divisible by world=4"):
        tensor_parallel_llama_(layer, WeightOnlyConfig(bits=4, block_size=32), 0, 4)
    assert type(layer.q_proj) is nn.Linear  # refused before any change
