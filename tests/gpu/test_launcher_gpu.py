"""The NVRTC runtime on a GPU: compile, load, launch on a torch stream, errors surfaced."""
from __future__ import annotations

import pytest
import torch

from custom_kernels import nvrtc
from custom_kernels.launcher import CudaDriverError, Module

pytestmark = pytest.mark.gpu

SRC = r"""
#include "common.cuh"
extern "C" __global__ void axpy_half(const __half* x, __half* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(a * __half2float(x[i]) + __half2float(y[i]));
}
"""


def _kernel():
    from cutlass_ops.ops._loader import target_arch

    cubin = nvrtc.compile_source(SRC, target_arch(), name="axpy_half.cu")
    return Module(cubin.data, "axpy_half").kernel("axpy_half", "PPfi")


def test_launch_on_side_stream_matches_torch():
    k = _kernel()
    n = 10_007
    x = torch.randn(n, device="cuda", dtype=torch.half)
    y = torch.randn(n, device="cuda", dtype=torch.half)
    expected = (2.5 * x.float() + y.float()).half()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # a long op queued first on the same stream: the launch must be ordered after it
        big = torch.randn(4096, 4096, device="cuda")
        _ = big @ big
        k.launch(((n + 255) // 256,), (256,), (x, y, 2.5, n))
    side.synchronize()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_launch_is_graph_capturable():
    k = _kernel()
    n = 4096
    x = torch.randn(n, device="cuda", dtype=torch.half)
    y = torch.zeros(n, device="cuda", dtype=torch.half)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            k.launch((n // 256,), (256,), (x, y, 1.0, n))
    torch.cuda.current_stream().wait_stream(s)
    y.zero_()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (2 * x.float()).half(), rtol=0, atol=0)


def test_bad_launch_raises_named_error():
    k = _kernel()
    x = torch.zeros(1, device="cuda", dtype=torch.half)
    with pytest.raises(CudaDriverError, match="cuLaunchKernel"):
        k.launch((1,), (4096,), (x, x, 1.0, 1))  # 4096 threads per block is over the limit


def test_wrong_argument_count_is_a_type_error():
    k = _kernel()
    with pytest.raises(TypeError, match="4 arguments"):
        k.launch((1,), (1,), (None, None, 1.0))

