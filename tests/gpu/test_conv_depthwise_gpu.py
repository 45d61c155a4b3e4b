"""Depthwise conv2d (strategy "depthwise", conv_depthwise.cu) on the GPU, against the float64 reference.

Every kernel of the module is reached: NHWC with 4 channels per thread through the register-window
kernels (Kw = 3 / 5 / 7, stride and dilation 1 along W) and the generic one (stride 2, dilation 2, 1x1,
rectangular kernels), NHWC with 2 channels (Ci = 130) and 1 (odd Ci, a channel multiplier, a misaligned
x or out), and NCHW. Shapes are ragged (Ci 1, 3, 8, 48, 96, 130; images 1x1, 2x3, odd sizes, 56x56;
batch 1, 7, 32) under fp32 / fp16 / bf16, int4 / int8, block sizes 1, a divisor of K and K, act 0 / 1 / 2,
with and without bias. Tolerance as in tests/_conv_cases.py: with S = conv(|x|, |q*scale| + |offset|)
+ |bias| and K = Kh*Kw, |y - ref| <= (3 u + K 2^-23) S + u |ref|.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cutlass_ops.conv import conv2d_output_shape, conv2d_weight_only
from cutlass_ops.conv.depthwise import DepthwisePlan
from cutlass_ops.conv.geometry import ConvGeometry
from cutlass_ops.formats import quantize_conv_weight
from cutlass_ops.reference import conv2d_reference
from custom_kernels.device import target_arch
from _conv_cases import UNIT_ROUNDOFF, Case, check_strategy

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def dw(batch, Ci, H, W, k, stride, padding, dilation, bits, block_size, dtype, channels_last, act, m=1) -> Case:
    """A depthwise Case: groups = Ci, Co = m * Ci."""
    return Case(batch, Ci, H, W, m * Ci, k, stride, padding, dilation, Ci, bits, block_size, dtype, channels_last,
                act)


# [kernel each case reaches] (batch, Ci, H, W, k, stride, padding, dilation, bits, block_size, dtype, NHWC, act)
CASES = [
    # NHWC, 4 channels per thread, register window
    dw(1, 128, 56, 56, 3, 1, 1, 1, 4, 9, F16, True, 0),         # [v4_k3] the benchmark layer, batch 1
    dw(32, 128, 56, 56, 3, 1, 1, 1, 8, 3, BF16, True, 1),       # [v4_k3] the benchmark layer, batch 32
    dw(7, 96, 56, 56, 7, 1, 3, 1, 4, 49, F16, True, 2),         # [v4_k7] the 7x7 benchmark layer, batch 7
    dw(2, 8, 13, 11, 5, 1, 2, 1, 8, 5, F32, True, 0),           # [v4_k5] fp32: 16-byte loads
    dw(1, 48, 9, 7, 7, 1, 0, 1, 4, 7, BF16, True, 1),           # [v4_k7] no padding: Ow = 1
    dw(7, 96, 11, 10, 5, 1, 1, 1, 4, 1, F32, True, 2),          # [v4_k5] padding < Kw / 2, ragged last strip
    dw(1, 8, 2, 3, 3, 1, 1, 1, 8, 9, F16, True, 0),             # [v4_k3] 2x3 image
    dw(1, 4, 3, 2, 7, 1, 3, 1, 4, 1, BF16, True, 2),            # [v4_k7] kernel wider than the image
    # NHWC, 4 channels per thread, generic taps
    dw(7, 48, 15, 17, 3, 2, 1, 1, 4, 9, F16, True, 1),          # [v4] stride 2
    dw(1, 96, 12, 13, 3, 1, 2, 2, 8, 3, BF16, True, 0),         # [v4] dilation 2
    dw(2, 8, 9, 9, 1, 1, 0, 1, 4, 1, F32, True, 2),             # [v4] 1x1 kernel
    dw(32, 8, 56, 56, 7, 2, 3, 1, 8, 49, F16, True, 0),         # [v4] 7x7 stride 2, batch 32
    dw(1, 48, 21, 19, 5, 2, 0, 2, 4, 25, F32, True, 1),         # [v4] stride 2, dilation 2, no padding
    # NHWC, 2 channels per thread (Ci % 4 == 2), three channel slices
    dw(1, 130, 9, 11, 3, 1, 1, 1, 4, 9, F16, True, 0),          # [v2]
    dw(7, 130, 7, 8, 5, 2, 3, 1, 8, 5, BF16, True, 2),          # [v2] stride 2, padding 3
    # NHWC, 1 channel per thread
    dw(1, 3, 17, 17, 3, 1, 1, 1, 4, 9, F16, True, 1),           # [v1] Ci = 3
    dw(1, 48, 10, 11, 3, 1, 1, 1, 4, 1, BF16, True, 2, m=2),    # [v1] channel multiplier 2
    dw(7, 8, 9, 9, 7, 2, 3, 2, 8, 7, F16, True, 0, m=2),        # [v1] multiplier 2, stride 2, dilation 2
    dw(7, 1, 9, 10, 5, 1, 2, 1, 8, 25, F32, True, 0),           # Ci = 1: channels_last is NCHW-contiguous
    dw(1, 1, 1, 1, 1, 1, 0, 1, 4, 1, F32, True, 1),             # 1x1 image, 1x1 kernel
    # NCHW
    dw(1, 128, 56, 56, 3, 1, 1, 1, 8, 9, BF16, False, 1),       # the benchmark layer, batch 1
    dw(7, 96, 23, 21, 7, 1, 3, 1, 4, 7, F16, False, 2),
    dw(32, 8, 56, 56, 3, 2, 1, 1, 4, 3, F32, False, 0),         # batch 32, stride 2
    dw(1, 3, 1, 1, 3, 1, 1, 1, 8, 9, F16, False, 0),            # 1x1 image, 3x3 kernel: 8 planes a block
    dw(7, 130, 2, 3, 3, 1, 3, 2, 4, 1, BF16, False, 1),         # 2x3 image, padding 3, dilation 2
    dw(2, 1, 13, 1, 5, 1, 2, 1, 8, 5, F32, False, 2),           # W = 1
    dw(7, 48, 9, 10, 5, 2, 1, 2, 8, 25, F16, False, 0, m=2),    # multiplier 2, stride 2, dilation 2
    dw(1, 96, 7, 7, 7, 1, 3, 1, 4, 49, BF16, False, 1),
    dw(32, 3, 31, 29, 3, 2, 0, 1, 4, 3, BF16, False, 2, m=2),   # multiplier 2, batch 32
    dw(1, 8, 2, 3, 1, 1, 0, 1, 8, 1, F32, False, 0),            # 1x1 kernel on a 2x3 image
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_depthwise_matches_float64_reference(case):
    check_strategy(case, "depthwise")


# ---------------------------------------------------------------------------------------------
# rectangular kernels, per-axis stride / padding / dilation, no bias, misaligned pointers
# ---------------------------------------------------------------------------------------------

def _run(batch, Ci, m, H, W, kernel, stride, padding, dilation, bits, block_size, dtype, channels_last, act,
         with_bias, misalign=False, seed=0):
    """y of strategy "depthwise" (through conv2d_weight_only, or through DepthwisePlan with x and out moved
    off their vector alignment) against the float64 reference, with the tolerance above."""
    Kh, Kw = kernel
    Co = m * Ci
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(Co, 1, Kh, Kw, generator=g) * 0.2
    qw = quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False)
    x = torch.randn(batch, Ci, H, W, generator=g).to(dtype)
    bias = (torch.randn(Co, generator=g) * 0.5).to(dtype) if with_bias else None
    ref = conv2d_reference(x, qw, bias, stride, padding, dilation, act, groups=Ci)
    mag = (qw.int_values().double().reshape(Co, qw.num_groups, qw.block_size).abs()
           * qw.scale.double().abs()[..., None] + qw.offset.double().abs()[..., None]).reshape(Co, 1, Kh, Kw)
    S = F.conv2d(x.double().abs(), mag, None if bias is None else bias.double().abs(), stride, padding, dilation, Ci)
    u = UNIT_ROUNDOFF[dtype]
    tol = (3 * u + Kh * Kw * 2.0 ** -23) * S + u * ref.abs()

    fmt = torch.channels_last if channels_last else torch.contiguous_format
    Oh, Ow = conv2d_output_shape(H, W, Kh, Kw, stride, padding, dilation)
    if misalign:  # one element past a 256-byte aligned allocation: no 4-channel vector is aligned
        xg = _offset_by_one(x.cuda().contiguous(memory_format=fmt))
        out = _offset_by_one(torch.full((batch, Co, Oh, Ow), float("nan"), dtype=dtype, device="cuda")
                             .contiguous(memory_format=fmt))
        geometry = ConvGeometry(batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, *stride, *padding, *dilation, qw.block_size, act,
                                Ci)
        plan = DepthwisePlan(geometry, dtype, bits, channels_last, 0, target_arch(0))
        plan(xg, qw.to("cuda"), None if bias is None else bias.cuda(), out)
        y = out
    else:
        xg = x.cuda().contiguous(memory_format=fmt)
        out = torch.full((batch, Co, Oh, Ow), float("nan"), dtype=dtype, device="cuda").contiguous(memory_format=fmt)
        y = conv2d_weight_only(xg, qw.to("cuda"), None if bias is None else bias.cuda(), stride, padding, dilation,
                               act, Ci, out=out, strategy="depthwise")
        assert y is out
    torch.cuda.synchronize()
    got = y.double().cpu()
    assert bool(torch.isfinite(got).all()), "unwritten (NaN) outputs"
    err = (got - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max():.3e}, max excess {(err - tol).max():.3e}"


def _offset_by_one(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (same shape, strides and values) whose data starts one element into its storage."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf.as_strided(t.shape, t.stride(), storage_offset=1)
    view.copy_(t)
    return view


# (batch, Ci, m, H, W, (Kh, Kw), stride, padding, dilation, bits, block_size, dtype, NHWC, act, bias)
GENERAL = [
    (1, 48, 1, 11, 13, (3, 5), (1, 1), (1, 2), (1, 1), 4, 15, F16, True, 0, False),   # [v4_k5] Kh != Kw, no bias
    (7, 96, 1, 12, 9, (5, 3), (2, 1), (2, 1), (2, 1), 8, 5, BF16, True, 1, False),    # [v4_k3] s, d 2 along H
    (2, 8, 1, 9, 16, (1, 7), (1, 1), (0, 3), (1, 1), 4, 7, F32, True, 2, True),       # [v4_k7] 1x7
    (1, 48, 1, 10, 12, (3, 3), (1, 2), (1, 1), (1, 1), 8, 9, F16, True, 0, False),    # [v4] stride 2 along W only
    (1, 130, 1, 7, 8, (3, 5), (1, 1), (1, 2), (1, 2), 4, 3, BF16, True, 2, False),    # [v2] dilation 2 along W
    (7, 3, 2, 9, 9, (5, 3), (2, 1), (0, 1), (1, 1), 8, 1, F16, True, 1, False),       # [v1] multiplier 2, no bias
    (1, 96, 1, 14, 15, (3, 5), (2, 1), (1, 2), (1, 1), 4, 15, F16, False, 0, False),  # NCHW, no bias
    (7, 8, 3, 10, 11, (7, 1), (1, 2), (3, 0), (2, 1), 8, 7, F32, False, 2, False),    # NCHW 7x1, multiplier 3
]


@pytest.mark.parametrize("params", GENERAL, ids=str)
def test_depthwise_rectangular_kernels_and_no_bias(params):
    _run(*params)


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("kernel, bias", [((3, 3), True), ((3, 3), False), ((5, 5), True)])
def test_misaligned_x_and_out_take_the_one_channel_kernel(dtype, kernel, bias):
    _run(2, 48, 1, 9, 10, kernel, (1, 1), (1, 1), (1, 1), 4, kernel[1], dtype, True, 1, bias, misalign=True)
    _run(2, 48, 1, 9, 10, kernel, (2, 2), (1, 1), (1, 1), 8, 1, dtype, True, 0, bias, misalign=True)


@pytest.mark.parametrize("Ci, m, kernel, stride, dilation, channels_last, expected", [
    (128, 1, (3, 3), 1, 1, True, "conv_depthwise_f16_w4_nhwc_v4_k3"),
    (96, 1, (7, 7), 1, 1, True, "conv_depthwise_f16_w4_nhwc_v4_k7"),
    (96, 1, (3, 5), 1, 1, True, "conv_depthwise_f16_w4_nhwc_v4_k5"),
    (96, 1, (3, 3), 2, 1, True, "conv_depthwise_f16_w4_nhwc_v4"),
    (96, 1, (3, 3), 1, 2, True, "conv_depthwise_f16_w4_nhwc_v4"),
    (130, 1, (3, 3), 1, 1, True, "conv_depthwise_f16_w4_nhwc_v2"),
    (48, 2, (3, 3), 1, 1, True, "conv_depthwise_f16_w4_nhwc_v1"),
    (96, 1, (3, 3), 1, 1, False, "conv_depthwise_f16_w4_nchw"),
])
def test_plan_picks_the_kernel(Ci, m, kernel, stride, dilation, channels_last, expected):
    Kh, Kw = kernel
    Oh, Ow = conv2d_output_shape(20, 20, Kh, Kw, (stride,) * 2, (1, 1), (dilation,) * 2)
    g = ConvGeometry(2, 20, 20, Ci, Oh, Ow, m * Ci, Kh, Kw, stride, stride, 1, 1, dilation, dilation, Kh * Kw, 0, Ci)
    plan = DepthwisePlan(g, F16, 4, channels_last, 0, target_arch(0))
    assert plan.launch.shape.name == expected
    assert (plan.fallback is not None) == (channels_last and Ci % 2 == 0 and m == 1)
    smem = plan.launch.shape.smem
    assert 0 < smem <= 48 * 1024
