"""Tensor parallelism on 2 and 4 GPUs over NCCL: column -> row parallel QuantLinears (every mode, the real
kernels) and a gathered column output against the unsharded layers on one GPU. Each world size skips with
fewer GPUs. The CPU twin is tests/test_distributed.py (gloo, the float references).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from cutlass_ops.distributed import ColumnParallelQuantLinear, RowParallelQuantLinear
from cutlass_ops.nn import QuantLinear
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8ChannelConfig, WeightOnlyConfig

pytestmark = pytest.mark.gpu

D, MLP = 1024, 3072  # MLP / 4 = 768: a multiple of every block size below and of the kernels' alignments
CASES = {  # name: (config, relative tolerance of the TP output against the unsharded layers, fp16)
    "w4": (WeightOnlyConfig(bits=4, block_size=128), 2e-3),
    "w8": (WeightOnlyConfig(bits=8, block_size=None), 2e-3),
    "w8a8_block": (W8A8BlockConfig(block_size=64, path="fused"), 2e-3),
    "w8a8_channel": (W8A8ChannelConfig(), 3e-2),  # per-token activation scale over K / world instead of K
}


def _close(got, ref, rtol, what):
    err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert err <= rtol, f"{what}: max |tp - unsharded| / max |unsharded| = {err:.3g} > {rtol}"


def _worker(rank, world, init_method, M):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        torch.manual_seed(0)  # the same float layers and inputs on every rank
        with torch.device("cuda"):
            up, down = nn.Linear(D, MLP).half(), nn.Linear(MLP, D).half()
            x = torch.randn(M, D, dtype=torch.float16)
        with torch.no_grad():
            for name, (config, rtol) in CASES.items():
                q_up, q_down = QuantLinear.from_float(up, config), QuantLinear.from_float(down, config)
                ref = q_down(F.silu(q_up(x)))
                col = ColumnParallelQuantLinear(q_up, rank, world)
                row = RowParallelQuantLinear(q_down, rank, world)
                _close(row(F.silu(col(x))), ref, rtol, f"{name} M={M} column -> row")
                full = ColumnParallelQuantLinear(q_up, rank, world, gather_output=True)(x)
                _close(full, q_up(x), 2e-3, f"{name} M={M} gathered column")  # other tiles: not bit-exact
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("M", [1, 17, 256])
def test_tensor_parallel_matches_the_unsharded_layers(tmp_path, M, world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices (NCCL, {world} ranks), found {torch.cuda.device_count()}")
    mp.spawn(_worker, args=(world, f"file://{tmp_path / 'rendezvous'}", M), nprocs=world, join=True)
