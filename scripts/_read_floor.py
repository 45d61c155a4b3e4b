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


def _args_type():
    from custom_kernels.launch import I64, KernelArgs, Ptr

    class ReadArgs(KernelArgs):  # read_bandwidth(const uint4* src, long long words, uint32_t* sink)
        _fields_ = [("src", Ptr), ("words", I64), ("sink", Ptr)]

    return ReadArgs


@functools.lru_cache(maxsize=None)
def _kernel(unroll: int):
    from custom_kernels.device import target_arch
    from custom_kernels.launch import Module
    from custom_kernels.nvrtc import compile_source

    cubin = compile_source(_SOURCE.read_text(), target_arch(), name="read_bandwidth.cu", defines={"UNROLL": unroll})
    return Module(cubin.data, name=f"read_bandwidth_u{unroll}").kernel("read_bandwidth")


def _launch(unroll: int, blocks: int, src: int, words: int, sink: torch.Tensor):
    """A Launch of the read kernel over ``blocks`` blocks of 256 threads (src and words per call)."""
    from custom_kernels.launch import Launch, LaunchConfig

    args = _args_type()(src=src, words=words, sink=sink.data_ptr())
    return Launch(_kernel(unroll), LaunchConfig.of(blocks, 256), args)


def empty_kernel_us(bench_us) -> float:
    """The timed cost of launching the read kernel on no data (timer and launch overhead)."""
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(256 * 8 * sm, dtype=torch.int32, device="cuda")
    launch = _launch(8, sm, sink.data_ptr(), 0, sink)
    return bench_us(lambda: launch(), rep_ms=30)


def read_floor_us(nbytes: int, time_us, copies: int = 3) -> tuple[float, int, int]:
    """(best us, blocks per SM, UNROLL) over the launch shapes, reading ``nbytes`` once per call, each shape
    timed by ``time_us(call)`` with ``call`` rotating over ``copies`` buffers (``_timing.Rotating``, so nothing
    stays in L2; captured in a CUDA graph, its launches keep the rotation): e.g. ``lambda f: bench_us(f,
    rep_ms=30)``, or ``_timing.graph_us`` to time the floor as the weight-only benchmarks time a GEMV."""
    from _timing import Rotating

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(256 * max(BLOCKS_PER_SM) * sm, dtype=torch.int32, device="cuda")
    words = nbytes // 16
    buffers = [torch.empty(words * 16, dtype=torch.uint8, device="cuda") for _ in range(copies)]
    pointers = [b.data_ptr() for b in buffers]
    best = (float("inf"), 0, 0)
    for unroll in UNROLLS:
        for per_sm in BLOCKS_PER_SM:
            launch = _launch(unroll, per_sm * sm, pointers[0], words, sink)
            call = Rotating(lambda i, launch=launch: launch(src=pointers[i]), copies)
            best = min(best, (time_us(call), per_sm, unroll))
    return best
