"""The NVRTC runtime on a GPU: compile, load, launch on a torch stream, errors surfaced."""
from __future__ import annotations

import pytest
import torch

from custom_kernels import nvrtc
from custom_kernels.device import target_arch
from custom_kernels.launch import F32, I32, CudaDriverError, KernelArgs, Launch, LaunchConfig, Module, Ptr

pytestmark = pytest.mark.gpu

SRC = r"""
#include "common.cuh"
extern "C" __global__ void axpy_half(const __half* x, __half* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(a * __half2float(x[i]) + __half2float(y[i]));
}
"""


class AxpyArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("y", Ptr), ("a", F32), ("n", I32)]


def _kernel():
    cubin = nvrtc.compile_source(SRC, target_arch(), name="axpy_half.cu")
    return Module(cubin.data, "axpy_half").kernel("axpy_half")


def _launch(grid, block, x, y, a, n) -> Launch:
    return Launch(_kernel(), LaunchConfig.of(grid, block), AxpyArgs(x=x.data_ptr(), y=y.data_ptr(), a=a, n=n))


def test_launch_on_side_stream_matches_torch():
    n = 10_007
    x = torch.randn(n, device="cuda", dtype=torch.half)
    y = torch.randn(n, device="cuda", dtype=torch.half)
    expected = (2.5 * x.float() + y.float()).half()
    launch = _launch(((n + 255) // 256,), (256,), x, y, 2.5, n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # a long op queued first on the same stream: the launch must be ordered after it
        big = torch.randn(4096, 4096, device="cuda")
        _ = big @ big
        launch()
    side.synchronize()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_launch_writes_the_named_fields():
    n = 4096
    x = torch.randn(n, device="cuda", dtype=torch.half)
    y = torch.zeros(n, device="cuda", dtype=torch.half)
    y2 = torch.zeros(n, device="cuda", dtype=torch.half)
    launch = _launch((n // 256,), (256,), x, y, 1.0, n)
    launch()
    launch(y=y2.data_ptr(), a=3.0)  # the other fields keep their values
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x, rtol=0, atol=0)
    torch.testing.assert_close(y2, (3 * x.float()).half(), rtol=0, atol=0)


def test_launch_is_graph_capturable():
    n = 4096
    x = torch.randn(n, device="cuda", dtype=torch.half)
    y = torch.zeros(n, device="cuda", dtype=torch.half)
    launch = _launch((n // 256,), (256,), x, y, 1.0, n)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            launch()
    torch.cuda.current_stream().wait_stream(s)
    y.zero_()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, (2 * x.float()).half(), rtol=0, atol=0)


def test_bad_launch_raises_named_error():
    x = torch.zeros(1, device="cuda", dtype=torch.half)
    launch = _launch((1,), (4096,), x, x, 1.0, 1)  # 4096 threads per block is over the limit
    with pytest.raises(CudaDriverError, match="cuLaunchKernel"):
        launch()


def test_wrong_argument_count_is_a_type_error():
    with pytest.raises(TypeError, match="too many initializers"):
        AxpyArgs(0, 0, 1.0, 4, 5)
