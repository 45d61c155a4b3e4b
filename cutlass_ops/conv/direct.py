"""The conv strategy "direct" (``conv_direct.cu``): one thread per output element, fp32 accumulation.

Any dtype, NCHW or NHWC, any Ci and block size, any GPU: the correctness baseline.
"""
from __future__ import annotations

import math

import torch

from custom_kernels.launch import KernelArgs, Launch, LaunchConfig, Ptr

from .geometry import DTYPE_CODES, GEOMETRY_ARGS, ConvGeometry, conv_defines, conv_kernel

__all__ = ["DirectArgs", "DirectPlan"]

THREADS = 256


class DirectArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("qweight", Ptr), ("scale", Ptr), ("offset", Ptr), ("bias", Ptr), ("out", Ptr),
                *GEOMETRY_ARGS]


class DirectPlan:
    """conv_direct_<dtype>_w<bits>_<layout> for one geometry on one device; ``plan(x, qw, bias, out)``."""

    strategy = "direct"

    @staticmethod
    def kernels(dtype: torch.dtype, bits: int, channels_last: bool) -> tuple:
        """(source, kernel, defines) of the kernel the plan loads."""
        name = f"conv_direct_{DTYPE_CODES[dtype][1]}_w{bits}_{'nhwc' if channels_last else 'nchw'}"
        return (("conv_direct.cu", name, conv_defines(dtype, bits)),)

    def __init__(self, geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool, device: int,
                 arch: str):
        self.geometry = geometry
        ((source, name, _),) = self.kernels(dtype, bits, channels_last)
        kernel = conv_kernel(source, name, dtype, bits, arch)
        total = geometry.batch * geometry.Co * geometry.Oh * geometry.Ow
        config = LaunchConfig.of(math.ceil(total / THREADS), THREADS)
        self.launch = Launch(kernel, config, DirectArgs(**geometry.kernel_fields()), device)

    def __call__(self, x: torch.Tensor, qw, bias: torch.Tensor | None, out: torch.Tensor) -> None:
        self.launch(x=x.data_ptr(), qweight=qw.qweight.data_ptr(), scale=qw.scale.data_ptr(),
                    offset=qw.offset.data_ptr(), bias=0 if bias is None else bias.data_ptr(), out=out.data_ptr())
