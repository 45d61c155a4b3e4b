"""Drives tests/host_emu/run_conv.cpp: a conv entry point of conv_depthwise.cu or conv_small_ci.cu, its own
CUDA source, run on the CPU (tests/host_emu/cuda_host_shim.h: one std::thread per CUDA thread of a block,
blocks one after another, __syncthreads a std::barrier) under a sanitizer.

The harness copies every operand into a heap block of exactly its size (x and out shifted by launch's
shifts), poisons the kernel's shared-memory array past the launch's bytes and NaN-fills those bytes before
each block; emulate() NaN-fills out. Under "address" (AddressSanitizer and UBSan) any access outside a
buffer, misaligned vector access or signed overflow aborts the run; under "thread" (ThreadSanitizer) a data
race between the emulated threads does (a missing __syncthreads). The builds come from the session fixture
conv_emulator (tests/conftest.py): each sanitizer's once per session.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from custom_kernels.cuda_paths import cuda_include_dirs
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops.conv.geometry import ConvGeometry

HARNESS = Path(__file__).resolve().parent / "host_emu" / "run_conv.cpp"
SANITIZERS = {  # g++ flags of each harness build
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "thread": ["-fsanitize=thread"],  # data races between the emulated threads: a missing __syncthreads
}


class HarnessBuilds:
    """sanitizer -> the harness built with g++ under it, built on first use (skips without g++ or the CUDA
    headers)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp_path_factory = tmp_path_factory
        self._built: dict[str, Path] = {}

    def __call__(self, sanitizer: str) -> Path:
        if sanitizer not in self._built:
            gxx = shutil.which("g++")
            if gxx is None:
                pytest.skip("g++ not installed")
            try:
                includes = cuda_include_dirs()
            except RuntimeError as exc:
                pytest.skip(f"no CUDA headers: {exc}")
            if not any((Path(d) / "cuda_fp16.h").exists() for d in includes):
                pytest.skip("needs the CUDA headers (cuda_fp16.h)")
            exe = self._tmp_path_factory.mktemp(f"host_emu_{sanitizer}") / "run_conv"
            cmd = [gxx, "-std=c++20", "-O1", "-g", *SANITIZERS[sanitizer], "-fno-strict-aliasing", "-pthread",
                   f"-I{HARNESS.parent}", f"-I{KERNEL_DIR}", *[f"-I{d}" for d in includes], str(HARNESS),
                   "-o", str(exe)]
            result = subprocess.run(cmd, capture_output=True, text=True)
            assert result.returncode == 0, result.stderr[-4000:]
            self._built[sanitizer] = exe
        return self._built[sanitizer]


@dataclass(frozen=True)
class Launch:
    """The launch the plan would make: the harness's launch.txt."""
    name: str               # the extern "C" entry point
    grid: tuple[int, int]
    block: tuple[int, int]
    smem: int               # dynamic shared memory, bytes
    x_shift: int = 0        # elements: x starts this far past its heap block (off every vector alignment)
    out_shift: int = 0      # the same for out


def _write(path: Path, t: torch.Tensor) -> None:
    path.write_bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def emulate(exe: Path, tmp_path: Path, launch: Launch, geometry: ConvGeometry, x: torch.Tensor, qw,
            bias: torch.Tensor | None, channels_last: bool) -> torch.Tensor:
    """out (NCHW, x's dtype) of the entry point run by the harness ``exe`` on x (NCHW, stored NHWC if
    channels_last), the quantized weight and bias, into an out NaN-filled beforehand; asserts the run
    succeeded (no sanitizer report)."""
    folder = Path(tempfile.mkdtemp(prefix="run", dir=tmp_path))  # fresh: no bias.bin left by an earlier run
    _write(folder / "x.bin", x.permute(0, 2, 3, 1) if channels_last else x)
    for field in ("qweight", "scale", "offset"):
        _write(folder / f"{field}.bin", getattr(qw, field))
    if bias is not None:
        _write(folder / "bias.bin", bias)
    g = geometry
    out_shape = (g.batch, g.Oh, g.Ow, g.Co) if channels_last else (g.batch, g.Co, g.Oh, g.Ow)
    _write(folder / "out.bin", torch.full(out_shape, float("nan"), dtype=x.dtype))
    fields = [launch.name, *launch.grid, *launch.block, launch.smem, launch.x_shift, launch.out_shift,
              *geometry.kernel_fields().values()]
    (folder / "launch.txt").write_text(" ".join(map(str, fields)) + "\n")
    run = subprocess.run([str(exe), str(folder)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{launch.name}: the emulated kernel failed:\n{run.stderr[-4000:]}"
    y = torch.frombuffer(bytearray((folder / "out.bin").read_bytes()), dtype=x.dtype).reshape(out_shape)
    return y.permute(0, 3, 1, 2) if channels_last else y
