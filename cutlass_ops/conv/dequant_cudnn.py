"""The conv strategy "dequant_cudnn": dequantize the weight (``conv_dequant.cu``), then one cuDNN conv.

At batch a conv is bound by its multiply-adds, not by the weight's bytes: a ResNet-50 layer at batch 32
does 1.6-3.7 G multiply-adds on a weight of 0.1-2.4 M elements, so reading int4 instead of fp16 saves
nothing that shows and cuDNN's NHWC tensor-core kernels set the pace. The plan dequantizes the weight
into a transient dense tensor of the activation type (a fresh torch allocation the caching allocator
recycles; no dense copy is kept), in the layout of the input (channels_last for an NHWC input, so torch
runs cuDNN's NHWC kernels and returns a channels_last output; contiguous for NCHW), and calls
``torch.nn.functional.conv2d``; relu / relu6 are applied in place after it. The same trade as the
linears' "dequant_cublas" (section 4 of docs/design.md); "auto" picks it from
``DEQUANT_CUDNN_MIN_MACS`` multiply-adds on (``conv.auto_strategy``).

Any dtype, layout, kernel size, stride, padding, dilation, groups and block size. fp32 activations
follow ``torch.backends.cudnn.allow_tf32`` like any fp32 ``nn.Conv2d`` ("auto" never picks this
strategy for fp32).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from custom_kernels.device import sm_count
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr

from .geometry import DTYPE_CODES, ConvGeometry, conv_defines, conv_kernel

__all__ = ["DequantConvArgs", "DequantCudnnPlan"]

SOURCE = "conv_dequant.cu"
THREADS = 256
MAX_GRID_Y = 65535  # the kernels stride over the output channels past it
CHUNK = 8  # K elements per thread of the conv_dequant8 kernels
BLOCKS_PER_SM = 8  # conv_dequant8's grid cap: 8 x 256 threads = an SM's 2048 (it strides over the rest)
INT32_MAX = 2 ** 31 - 1


class BiasActArgs(KernelArgs):
    _fields_ = [("y", Ptr), ("bias", Ptr), ("M", I32), ("Co", I32), ("act", I32)]


class DequantConvArgs(KernelArgs):
    _fields_ = [("qweight", Ptr), ("scale", Ptr), ("offset", Ptr), ("W", Ptr), ("Co", I32), ("K", I32),
                ("Cg", I32), ("taps", I32), ("block_size", I32)]


def chunked(geometry: ConvGeometry) -> bool:
    """Whether the 8-wide kernel (``conv_dequant8_*``: one thread per 8 k, 32-bit weight loads, 16-byte
    stores) takes the geometry: K % 8 == 0 and block_size % 8 == 0. Pure."""
    return geometry.K % CHUNK == 0 and geometry.block_size % CHUNK == 0


def _activation(y: torch.Tensor, act: int) -> None:
    """relu (1) / relu6 (2) in place."""
    if act == 1:
        y.relu_()
    elif act == 2:
        y.clamp_(0, 6)


class DequantCudnnPlan:
    """conv_dequant{,8}_<dtype>_w<bits>_<layout> + cuDNN for one geometry on one device;
    ``plan(x, qw, bias, out)`` returns the output (``out`` when given, else a new tensor)."""

    strategy = "dequant_cudnn"

    @staticmethod
    def kernels(dtype: torch.dtype, bits: int, channels_last: bool) -> tuple:
        """(source, kernel, defines) of the kernels the plan may load (the conv is cuDNN's): the two
        dequantizations, and for NHWC the bias / activation epilogue."""
        tag = f"{DTYPE_CODES[dtype][1]}_w{bits}_{'nhwc' if channels_last else 'nchw'}"
        defines = conv_defines(dtype, bits)
        epilogue = ((SOURCE, f"conv_bias_act_{DTYPE_CODES[dtype][1]}_nhwc", defines),) if channels_last else ()
        return (SOURCE, f"conv_dequant_{tag}", defines), (SOURCE, f"conv_dequant8_{tag}", defines), *epilogue

    def __init__(self, geometry: ConvGeometry, dtype: torch.dtype, bits: int, channels_last: bool, device: int,
                 arch: str):
        g = self.geometry = geometry
        (source, scalar, _), (_, wide, _), *epilogue = self.kernels(dtype, bits, channels_last)
        if g.Co * g.K > INT32_MAX:  # the kernels index the weight in 32 bits
            raise ValueError(f"the conv weight [{g.Co}, {g.K}] has more than 2^31-1 elements")
        dims = dict(Co=g.Co, K=g.K, Cg=g.Cg, taps=g.Kh * g.Kw, block_size=g.block_size)
        # any K, block size and alignment: grid (x over a row, y over the output channels)
        config = LaunchConfig.of((math.ceil(g.K / THREADS), min(g.Co, MAX_GRID_Y)), THREADS)
        self.scalar = Launch(conv_kernel(source, scalar, dtype, bits, arch), config, DequantConvArgs(**dims), device)
        self.wide = None
        if chunked(g):  # flat over the Co * K / 8 chunks, at most a wave of full SMs
            blocks = min(math.ceil(g.Co * g.K // CHUNK / THREADS), BLOCKS_PER_SM * sm_count(device))
            self.wide = Launch(conv_kernel(source, wide, dtype, bits, arch), LaunchConfig.of(blocks, THREADS),
                               DequantConvArgs(**dims), device)
        self.bias_act = None  # bias and activation in one vectorized pass over an NHWC output
        if epilogue and g.Co % CHUNK == 0:
            M = g.batch * g.Oh * g.Ow
            blocks = max(1, min(math.ceil(M * g.Co // CHUNK / THREADS), BLOCKS_PER_SM * sm_count(device)))
            self.bias_act = Launch(conv_kernel(source, epilogue[0][1], dtype, bits, arch),
                                   LaunchConfig.of(blocks, THREADS), BiasActArgs(M=M, Co=g.Co, act=g.act), device)
        # W's stored shape: [Co, Kh, Kw, Cg] (nhwc; permuted to the channels_last [Co, Cg, Kh, Kw]) or [Co, Cg, Kh, Kw]
        self.w_shape = (g.Co, g.Kh, g.Kw, g.Cg) if channels_last else (g.Co, g.Cg, g.Kh, g.Kw)
        self.channels_last = channels_last
        self.conv_args = ((g.sh, g.sw), (g.ph, g.pw), (g.dh, g.dw), g.groups)

    def dequantize(self, qw, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The dense weight [Co, Cg, Kh, Kw] (channels_last for an NHWC plan), in a fresh tensor."""
        w = torch.empty(self.w_shape, dtype=dtype, device=device)
        qweight = qw.qweight.data_ptr()
        launch = self.wide if self.wide is not None and qweight % 4 == 0 else self.scalar  # 32-bit weight loads
        launch(qweight=qweight, scale=qw.scale.data_ptr(), offset=qw.offset.data_ptr(), W=w.data_ptr())
        return w.permute(0, 3, 1, 2) if self.channels_last else w

    def __call__(self, x: torch.Tensor, qw, bias: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
        w = self.dequantize(qw, x.dtype, x.device)
        stride, padding, dilation, groups = self.conv_args
        with torch.no_grad():  # like the raw kernels: the op's autograd formula owns the gradients
            act = self.geometry.act
            if self.bias_act is not None:
                y = F.conv2d(x, w, None, stride, padding, dilation, groups)
                if (bias is not None or act) and y.is_contiguous(memory_format=torch.channels_last) \
                        and y.data_ptr() % 16 == 0:
                    self.bias_act(y=y.data_ptr(), bias=0 if bias is None else bias.data_ptr())
                elif bias is not None or act:  # an unexpected output layout: torch's ops
                    if bias is not None:
                        y.add_(bias.view(1, -1, 1, 1))
                    _activation(y, act)
            else:
                y = F.conv2d(x, w, bias, stride, padding, dilation, groups)
                _activation(y, act)
            if out is None:
                return y
            out.copy_(y)
        return out
