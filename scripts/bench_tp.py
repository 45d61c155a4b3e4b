"""Tensor parallelism: a Llama-style decoder on 1 GPU against N GPUs, fp16 and quantized, all-reduce time apart.

    torchrun --nproc-per-node 2 scripts/bench_tp.py [--mode fp16 W4A16] [--layers 4] [--quick] [--out PATH]

Model: hidden 4096, 32 query / 8 KV heads of 128, SwiGLU MLP 14336 (Llama-3-8B's layer), ``--layers``
layers, fp16 activations, no KV cache (attention over the tokens of the call only): the linears and the
all-reduces, which are what tensor parallelism splits, dominate; attention over a long cache does not
appear. Modes: ``fp16`` (plain ``nn.Linear`` shards, the same Megatron split, the same all-reduce) and
the ``cutlass_ops`` configs (``tensor_parallel_llama_``). Per mode and shape (times per forward from
CUDA-graph replays, the all-reduces captured too, as serving engines run decode; TP times are the
slowest rank's; eager columns: Python calls, host launch cost included):
  1 GPU           rank 0 alone runs the unsharded model (the other ranks wait at a barrier);
  N GPU           every rank runs its shard: column-parallel q/k/v/gate/up, row-parallel o/down;
  N GPU compute   the same with the all-reduce replaced by the identity (wrong numbers, the compute alone);
  all-reduce      2 * layers all-reduces of the [tokens, 4096] fp16 output alone (NCCL), per forward;
  efficiency      speed-up / N (1.0: perfect scaling).
Decode: batch 1 and 16, one token; prefill: 1 x 2048 tokens (512 with --quick).
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _timing import call_us, graph_us, table, write_report
from torch import nn

import cutlass_ops
import cutlass_ops.distributed.modules as tp_modules
from cutlass_ops.distributed import tensor_parallel_llama_
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8ChannelConfig, WeightOnlyConfig

MODES = {"fp16": None, "W4A16": WeightOnlyConfig(bits=4, block_size=128), "W8A16": WeightOnlyConfig(bits=8, block_size=128),
         "W8A8 per channel": W8A8ChannelConfig(), "W8A8 per K block": W8A8BlockConfig(block_size=128)}
D, HEADS, KV_HEADS, MLP = 4096, 32, 8, 14336


class Layer(nn.Module):
    """One Llama decoder layer with Hugging Face's linear names (what tensor_parallel_llama_ splits)."""

    def __init__(self):
        super().__init__()
        self.heads, self.kv_heads, self.hd = HEADS, KV_HEADS, D // HEADS
        self.q_proj, self.o_proj = nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(D, KV_HEADS * self.hd, bias=False) for _ in range(2))
        self.gate_proj, self.up_proj = (nn.Linear(D, MLP, bias=False) for _ in range(2))
        self.down_proj = nn.Linear(MLP, D, bias=False)
        self.n1, self.n2 = nn.RMSNorm(D, eps=1e-5), nn.RMSNorm(D, eps=1e-5)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.n1(x)
        q = self.q_proj(h).view(B, T, self.heads, self.hd).transpose(1, 2)  # heads: the local count under TP
        k = self.k_proj(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, self.heads * self.hd))
        h = self.n2(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def build(layers: int) -> nn.Sequential:
    torch.manual_seed(0)  # the same float weights on every rank: each quantizes them whole, keeps its shard
    with torch.device("cuda"):
        model = nn.Sequential(*(Layer() for _ in range(layers))).half().eval()
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    return model


@contextlib.contextmanager
def all_reduce_disabled():
    """RowParallelQuantLinear.forward looks ``all_reduce_sum`` up in its module: make it the identity."""
    saved = tp_modules.all_reduce_sum
    tp_modules.all_reduce_sum = lambda y, group=None: y
    try:
        yield
    finally:
        tp_modules.all_reduce_sum = saved


class _RowParallelLinear(nn.Module):
    """fp16 baseline: this rank's K columns of an nn.Linear, then the all-reduce (looked up in the
    cutlass_ops module at call time, so ``all_reduce_disabled`` removes it here too)."""

    def __init__(self, linear: nn.Linear, rank: int, world: int):
        super().__init__()
        k = linear.in_features // world
        self.linear = nn.Linear(k, linear.out_features, bias=False, device=linear.weight.device,
                                dtype=linear.weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight[:, rank * k:(rank + 1) * k])

    def forward(self, x):
        return tp_modules.all_reduce_sum(self.linear(x))


def _column_shard(linear: nn.Linear, rank: int, world: int) -> nn.Linear:
    n = linear.out_features // world
    shard = nn.Linear(linear.in_features, n, bias=False, device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        shard.weight.copy_(linear.weight[rank * n:(rank + 1) * n])
    return shard


def fp16_tensor_parallel_(layer: Layer, rank: int, world: int) -> None:
    """The same Megatron split as ``tensor_parallel_llama_``, on the float layer (the fp16 baseline)."""
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        setattr(layer, name, _column_shard(getattr(layer, name), rank, world))
    for name in ("o_proj", "down_proj"):
        setattr(layer, name, _RowParallelLinear(getattr(layer, name), rank, world))
    layer.heads, layer.kv_heads = layer.heads // world, layer.kv_heads // world


def parallelize_(model: nn.Sequential, config, rank: int, world: int) -> None:
    for layer in model:
        if config is None:
            fp16_tensor_parallel_(layer, rank, world)
        else:
            tensor_parallel_llama_(layer, config, rank, world)


def slowest_ms(us: float) -> float:
    """The largest of the ranks' times, in ms (a TP step is as slow as its slowest rank)."""
    t = torch.tensor([us / 1e3], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def shapes(args) -> dict[str, tuple[int, int]]:
    return {"decode b1": (1, 1), "decode b16": (16, 1), f"prefill {args.prefill}": (1, args.prefill)}


def time_calls(model, args, barrier: bool = True) -> dict[str, dict[str, float]]:
    """{"graph" | "eager": {shape: us per forward on this rank}}: CUDA-graph replays (what a serving engine
    does for decode: no host time) and eager calls (host launch cost included)."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = {"graph": {}, "eager": {}}
    with torch.no_grad():
        for name, (B, T) in shapes(args).items():
            x = torch.randn(B, T, D, device="cuda", dtype=torch.float16, generator=gen)
            prefill = T > 1
            if barrier:
                dist.barrier()
            out["graph"][name] = graph_us(lambda: model(x), reps=2 if prefill else 10, iters=args.iters_graph)
            if barrier:
                dist.barrier()
            out["eager"][name] = call_us(lambda: model(x), iters=args.iters_prefill if prefill else args.iters,
                                         warmup=3)
    return out


def all_reduce_ms(args, layers: int) -> dict[str, float]:
    """2 * layers all-reduces (o_proj, down_proj) of [B*T, D] fp16, timed alone in a CUDA graph."""
    out = {}
    for name, (B, T) in shapes(args).items():
        y = torch.randn(B * T, D, device="cuda", dtype=torch.float16)
        dist.barrier()
        us = graph_us(lambda: dist.all_reduce(y), reps=10, iters=args.iters_graph)
        out[name] = slowest_ms(us) * 2 * layers
    return out


def one_gpu_ms(config, args) -> dict[str, dict[str, float]]:
    """The unsharded model alone on this GPU (rank 0), ms per forward, graph and eager."""
    model = build(args.layers)
    if config is not None:
        cutlass_ops.quantize_(model, config)
    out = {kind: {k: v / 1e3 for k, v in times.items()} for kind, times in time_calls(model, args, False).items()}
    del model
    torch.cuda.empty_cache()
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", nargs="+", choices=list(MODES), default=["fp16", "W4A16"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="prefill 512, fewer iterations")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_tp.md")
    args = parser.parse_args()
    args.prefill, args.iters, args.iters_prefill, args.iters_graph = ((512, 10, 2, 3) if args.quick
                                                                       else (2048, 50, 5, 10))
    if "LOCAL_RANK" not in os.environ:
        parser.error("launch with torchrun --nproc-per-node N scripts/bench_tp.py")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    try:
        reduce = all_reduce_ms(args, args.layers)  # the same for every mode: fp16 outputs of the same shape
        for mode in args.mode:
            config = MODES[mode]
            one = one_gpu_ms(config, args) if rank == 0 else {}
            dist.barrier()
            model = build(args.layers)
            parallelize_(model, config, rank, world)
            total = {kind: {k: slowest_ms(v) for k, v in times.items()}
                     for kind, times in time_calls(model, args).items()}
            with all_reduce_disabled():
                compute = {k: slowest_ms(v) for k, v in time_calls(model, args)["graph"].items()}
            del model
            torch.cuda.empty_cache()
            if rank == 0:
                for name in compute:
                    speedup = one["graph"][name] / total["graph"][name]
                    rows.append([mode, name, f"{one['graph'][name]:.3f}", f"{total['graph'][name]:.3f}",
                                 f"{compute[name]:.3f}", f"{reduce[name]:.3f}", f"{speedup:.2f}x",
                                 f"{speedup / world:.0%}", f"{one['eager'][name]:.3f}",
                                 f"{total['eager'][name]:.3f}"])
        if rank == 0:
            header = ["mode", "shape", "1 GPU ms", f"{world} GPU ms", f"{world} GPU compute ms", "all-reduce ms",
                      "speed-up", "efficiency", "1 GPU eager ms", f"{world} GPU eager ms"]
            lines = [f"Tensor parallelism, {args.layers} Llama-3-8B layers (hidden {D}, {HEADS}/{KV_HEADS} heads, MLP "
                     f"{MLP}), no KV cache, fp16 activations, {world} GPUs over NCCL. Times per forward from CUDA-graph "
                     f"replays (the all-reduces captured too; TP: the slowest rank); compute: the all-reduce replaced "
                     f"by the identity; all-reduce: the {2 * args.layers} all-reduces of a forward timed alone; "
                     f"efficiency: speed-up / {world}; eager: Python calls, host launch cost included.", "",
                     table(header, rows)]
            write_report(lines, out=args.out, bench="bench_tp")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
