"""The streaming-read floor: the best time of a bare kernel that reads ``nbytes`` once
(scripts/kernels/read_bandwidth.cu), launch and ramp included - what a GEMV reading that many
weight bytes cannot beat. Shared by the weight-only benchmarks (not a test module)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch

_SOURCE = Path(__file__).resolve().parent / "kernels" / "read_bandwidth.cu"
UNROLLS = (4, 8, 16)
BLOCKS_PER_SM = (1, 2, 4, 8)


@functools.lru_cache(maxsize=None)
def _kernel(unroll: int):
    from custom_kernels.launcher import Module
    from custom_kernels.nvrtc import compile_source
    from cutlass_ops.ops._loader import target_arch

    cubin = compile_source(_SOURCE.read_text(), target_arch(), name="read_bandwidth.cu", defines={"UNROLL": unroll})
    return Module(cubin.data, name=f"read_bandwidth_u{unroll}").kernel("read_bandwidth", "PqP")


def empty_kernel_us(bench_us) -> float:
    """The timed cost of launching the read kernel on no data (timer and launch overhead)."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(256 * 8 * sm, dtype=torch.int32, device="cuda")
    return bench_us(lambda: _kernel(8).launch((sm,), (256,), [sink, 0, sink]), rep_ms=30)


def read_floor_us(nbytes: int, bench_us, copies: int = 3) -> tuple[float, int, int]:
    """(best us, blocks per SM, UNROLL) over the launch shapes, reading ``nbytes`` once per call
    (``copies`` buffers rotated, so nothing stays in L2)."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(256 * max(BLOCKS_PER_SM) * sm, dtype=torch.int32, device="cuda")
    words = nbytes // 16
    buffers = [torch.empty(words * 16, dtype=torch.uint8, device="cuda") for _ in range(copies)]
    best = (float("inf"), 0, 0)
    for unroll in UNROLLS:
        kernel = _kernel(unroll)
        for per_sm in BLOCKS_PER_SM:
            i = [0]

            def run(kernel=kernel, per_sm=per_sm):
                i[0] = (i[0] + 1) % copies
                kernel.launch((per_sm * sm,), (256,), [buffers[i[0]], words, sink])
            best = min(best, (bench_us(run, rep_ms=30), per_sm, unroll))
    return best
