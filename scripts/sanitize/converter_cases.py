"""converters_test.cu cases: the int4 / int8 to half / bfloat16 converters, and the planted out-of-bounds
write that shows memcheck instruments the project's kernels (--plant-oob)."""
from __future__ import annotations

import torch

from sanitize.inputs import _cuda
from sanitize.registry import _add, _ref


def _launch_converter(kname: str, blocks: int, words: torch.Tensor, out: torch.Tensor, n: int) -> None:
    """One launch of a converters_test.cu kernel (words, out, n) with 256-thread blocks."""
    from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

    class ConverterArgs(KernelArgs):
        _fields_ = [("words", Ptr), ("out", Ptr), ("n", I32)]

    device = words.device.index
    Launch(load_kernel("converters_test.cu", kname, device=device), LaunchConfig.of(blocks, 256),
           ConverterArgs(words=words.data_ptr(), out=out.data_ptr(), n=n), device)()


def _build_converter_cases() -> None:
    entries = [(f"test_{s}{w}s_to_{t}", 4 if w == "int4" else 2)
               for w in ("int4", "int8") for s in ("", "u")
               for t in (("half2x4", "bf162x4") if w == "int4" else ("half2x2", "bf162x2"))]
    for kname, pairs in entries:
        def run(kname=kname, pairs=pairs):
            n = 4099  # not a multiple of the 256-thread block; 7 blocks: the grid-stride loop runs
            g = torch.Generator().manual_seed(n)
            w = torch.randint(0, 2 ** 32, (n,), generator=g, dtype=torch.int64)
            words = torch.where(w >= 2 ** 31, w - 2 ** 32, w).to(torch.int32).to(_cuda())
            out = torch.empty((n, pairs), dtype=torch.int32, device=_cuda())
            _launch_converter(kname, 7, words, out, n)
            return out
        _add(f"converters/{kname}-n4099", "converters_test", [_ref("converters_test.cu", kname)], run)

    for short_rows in (2, 500):  # 16 bytes (a tail-sized overrun) and 4000 bytes past the output
        def run_planted(short_rows=short_rows):
            n = 1000
            words = torch.zeros(n, dtype=torch.int32, device=_cuda())
            out = torch.empty((n - short_rows, 2), dtype=torch.int32, device=_cuda())  # rows of 8 bytes
            _launch_converter("test_int8s_to_half2x2", 4, words, out, n)
            return out
        _add(f"selftest/planted-oob-write-{8 * short_rows}B-test_int8s_to_half2x2", "converters_test",
             [_ref("converters_test.cu", "test_int8s_to_half2x2")], run_planted, selftest=True,
             note="writes past its output on purpose: memcheck must report it (--plant-oob)")
