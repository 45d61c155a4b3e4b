"""Tensor parallelism: a quantized Llama-style decoder on 1 GPU against N GPUs, all-reduce time apart.

    torchrun --nproc-per-node 2 scripts/bench_tp.py [--mode W4A16] [--layers 4] [--quick] [--out PATH]

NOT RUN YET: written in a session without a multi-GPU machine; the pieces it uses (cutlass_ops.distributed)
are tested on CPUs over gloo (tests/test_distributed.py) and, where 2 GPUs exist, over NCCL
(tests/gpu/test_distributed_gpu.py). Expect to fix small things on the first real run.

Model: hidden 4096, 32 query / 8 KV heads of 128, SwiGLU MLP 14336 (Llama-3-8B's layer), ``--layers``
layers, fp16 activations, no KV cache (attention over the tokens of the call only): the linears and the
all-reduces, which are what tensor parallelism splits, dominate; attention over a long cache does not
appear. Rows, eager mode (each timing the median of ``call_us`` loops; TP times are the slowest rank's):
  1 GPU           rank 0 alone runs the unsharded quantized model (the other ranks wait at a barrier);
  N GPU total     every rank runs its shard: column-parallel q/k/v/gate/up, row-parallel o/down;
  N GPU compute   the same with the all-reduce replaced by the identity (wrong numbers, the compute alone);
  all-reduce      2 * layers all-reduces of the [tokens, 4096] fp16 output alone (NCCL), per forward.
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
from _timing import call_us, table, write_report
from torch import nn

import cutlass_ops
import cutlass_ops.distributed.modules as tp_modules
from cutlass_ops.distributed import tensor_parallel_llama_
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8ChannelConfig, WeightOnlyConfig

MODES = {"W4A16": WeightOnlyConfig(bits=4, block_size=128), "W8A16": WeightOnlyConfig(bits=8, block_size=128),
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


def slowest_ms(us: float) -> float:
    """The largest of the ranks' times, in ms (a TP step is as slow as its slowest rank)."""
    t = torch.tensor([us / 1e3], device="cuda", dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def shapes(args) -> dict[str, tuple[int, int]]:
    return {"decode b1": (1, 1), "decode b16": (16, 1), f"prefill {args.prefill}": (1, args.prefill)}


def time_calls(model, args) -> dict[str, float]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = {}
    with torch.no_grad():
        for name, (B, T) in shapes(args).items():
            x = torch.randn(B, T, D, device="cuda", dtype=torch.float16, generator=gen)
            iters = args.iters_prefill if T > 1 else args.iters
            dist.barrier()
            out[name] = call_us(lambda: model(x), iters=iters, warmup=3)
    return out


def all_reduce_ms(args, layers: int) -> dict[str, float]:
    """2 * layers all-reduces (o_proj, down_proj) of [B*T, D] fp16, timed alone."""
    out = {}
    for name, (B, T) in shapes(args).items():
        y = torch.randn(B * T, D, device="cuda", dtype=torch.float16)
        dist.barrier()
        us = call_us(lambda: dist.all_reduce(y), iters=args.iters, warmup=5)
        out[name] = slowest_ms(us) * 2 * layers
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=list(MODES), default="W4A16")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="prefill 512, fewer iterations")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_tp.md")
    args = parser.parse_args()
    args.prefill, args.iters, args.iters_prefill = (512, 10, 2) if args.quick else (2048, 50, 5)
    if "LOCAL_RANK" not in os.environ:
        parser.error("launch with torchrun --nproc-per-node N scripts/bench_tp.py")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    config = MODES[args.mode]
    try:
        one_gpu = {}
        if rank == 0:  # the unsharded baseline, alone on GPU 0
            model = build(args.layers)
            cutlass_ops.quantize_(model, config)
            gen = torch.Generator(device="cuda").manual_seed(1)
            with torch.no_grad():
                for name, (B, T) in shapes(args).items():
                    x = torch.randn(B, T, D, device="cuda", dtype=torch.float16, generator=gen)
                    iters = args.iters_prefill if T > 1 else args.iters
                    one_gpu[name] = call_us(lambda: model(x), iters=iters, warmup=3) / 1e3
            del model
            torch.cuda.empty_cache()
        dist.barrier()
        model = build(args.layers)
        for layer in model:
            tensor_parallel_llama_(layer, config, rank, world)
        total = {k: slowest_ms(v) for k, v in time_calls(model, args).items()}
        with all_reduce_disabled():
            compute = {k: slowest_ms(v) for k, v in time_calls(model, args).items()}
        reduce = all_reduce_ms(args, args.layers)
        if rank == 0:
            header = ["shape", "1 GPU ms", f"{world} GPU total ms", f"{world} GPU compute ms",
                      "all-reduce ms", "speed-up"]
            rows = [[name, f"{one_gpu[name]:.3f}", f"{total[name]:.3f}", f"{compute[name]:.3f}",
                     f"{reduce[name]:.3f}", f"{one_gpu[name] / total[name]:.2f}x"] for name in one_gpu]
            lines = [f"Tensor parallelism, {args.mode}, {args.layers} Llama-3-8B layers (hidden {D}, {HEADS}/{KV_HEADS} "
                     f"heads, MLP {MLP}), no KV cache, eager, fp16 activations, {world} GPUs over NCCL. compute: the "
                     "all-reduce replaced by the identity; all-reduce: 2 per layer timed alone.", "",
                     table(header, rows)]
            write_report(lines, out=args.out, bench="bench_tp")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
