"""Small-Cg conv2d (strategy "small_ci", conv_small_ci.cu) on the GPU, against the float64 reference.

The ResNet stem (Ci = 3, 7x7, stride 2, pad 3) at 224x224, batch 1 and 32, and ragged shapes: images
1x1, 5x4, 17x23 and wider than one 64-column tile; Ci 1 / 3 / 4 / 8; Co 1 / 8 / 13 / 64 / 96 (a ragged
second channel tile) and grouped (Co / groups = 96 and 12); kernels 1 / 3 / 5 / 7; strides 1 / 2 / 3;
padding 0 / 1 / 3; dilation 1 / 2; NCHW and channels_last (16-byte vector stores when Co / groups is a
multiple of 8 and out is aligned, scalar stores otherwise); fp32 / fp16 / bf16; int4 / int8; block sizes
1, a divisor of Ci, whole taps and K; act 0 / 1 / 2; bias present and None. Tolerance as in
tests/_conv_cases.py: with S = conv(|x|, |q*scale| + |offset|) + |bias| and K = Kh*Kw*Ci/groups,
|y - ref| <= (3 u + K 2^-23) S + u |ref|. The kernel's own source also runs on the CPU under sanitizers
(tests/test_conv_small_ci_host_emulation.py); this file checks what only the GPU shows: the NVRTC build,
the launch (dynamic shared memory above 48 KiB, the occupancy query), the compiled code itself.
"""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.conv import conv2d_output_shape, conv2d_weight_only
from cutlass_ops.conv.geometry import ConvGeometry, conv_kernel
from cutlass_ops.conv.small_ci import BLOCKS_PER_SM, THREADS, SmallCiPlan, launch_config, smem_bytes
from cutlass_ops.reference import conv2d_reference
from custom_kernels.device import sm_count, target_arch
from _conv_cases import Case, check_strategy, make, tolerance

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def stem(batch, H, W, Co, bits, block_size, dtype, channels_last, act) -> Case:
    """The stem's conv (Ci 3, 7x7, stride 2, pad 3) on an H x W image."""
    return Case(batch, 3, H, W, Co, 7, 2, 3, 1, 1, bits, block_size, dtype, channels_last, act)


# Case(batch, Ci, H, W, Co, k, stride, padding, dilation, groups, bits, block_size, dtype, channels_last, act)
CASES = [
    # the stem at 224x224: the benchmark layer
    stem(1, 224, 224, 64, 4, None, F16, True, 1),
    stem(1, 224, 224, 64, 8, 21, BF16, False, 0),
    stem(1, 224, 224, 64, 8, 147, F32, True, 2),
    stem(32, 224, 224, 64, 4, 49, F16, True, 0),
    # the stem on ragged images and channel counts
    stem(2, 17, 23, 64, 4, 147, F32, False, 0),
    stem(2, 17, 23, 13, 8, 3, F16, True, 2),            # Co 13: scalar NHWC stores, an idle channel warp
    stem(1, 40, 150, 70, 8, None, F16, True, 1),        # Ow 75: two column tiles; Co 70: a 6-channel tile
    stem(3, 5, 4, 96, 4, 49, BF16, True, 2),
    stem(3, 5, 4, 96, 4, 7, BF16, False, 1),
    stem(1, 1, 1, 8, 4, 7, F32, False, 1),              # one pixel: all taps but the centre ones padded
    stem(7, 17, 23, 1, 8, 21, F16, False, 0),           # Co 1
    # Ci 1 / 4 / 8, kernels 1 / 3 / 5, strides 1 / 3, dilation 2
    Case(1, 1, 19, 70, 8, 3, 1, 1, 1, 1, 4, 9, F32, False, 0),
    Case(2, 1, 9, 11, 1, 1, 1, 0, 1, 1, 8, 1, F16, True, 0),
    Case(2, 1, 1, 1, 13, 1, 1, 0, 1, 1, 4, 1, BF16, False, 2),
    Case(1, 4, 21, 67, 13, 5, 3, 1, 1, 1, 4, 4, F16, False, 1),
    Case(1, 4, 21, 67, 13, 5, 3, 1, 1, 1, 8, 100, BF16, True, 1),
    Case(2, 4, 17, 23, 96, 3, 1, 1, 2, 1, 8, 36, F32, True, 2),
    Case(1, 4, 5, 4, 64, 3, 2, 0, 1, 1, 4, 12, F16, False, 0),
    Case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, F32, True, 2),
    Case(3, 8, 5, 4, 96, 3, 3, 3, 1, 1, 8, 24, BF16, False, 2),
    Case(1, 8, 33, 130, 8, 1, 1, 0, 1, 1, 4, 8, F16, True, 1),
    Case(1, 8, 33, 130, 13, 1, 2, 0, 1, 1, 8, 4, BF16, False, 1),
    Case(2, 3, 12, 13, 8, 5, 1, 0, 2, 1, 4, 75, BF16, True, 0),
    Case(1, 3, 17, 23, 64, 3, 2, 1, 1, 1, 4, None, F32, True, 1),
    Case(7, 4, 224, 224, 64, 7, 2, 3, 1, 1, 4, 28, F16, True, 1),  # the stem with a fourth input channel
    # groups: each channel tile inside one group
    Case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F32, True, 1),    # 96 per group: tiles of 64 + 32
    Case(2, 4, 21, 70, 192, 3, 1, 1, 1, 2, 4, 2, F16, False, 1),
    Case(2, 4, 17, 30, 24, 3, 2, 1, 1, 2, 8, 2, F16, True, 0),     # 12 per group: scalar NHWC stores
    Case(1, 6, 30, 70, 12, 3, 3, 1, 2, 3, 8, 6, BF16, False, 1),
    Case(1, 6, 11, 9, 6, 3, 1, 1, 1, 6, 4, 1, F32, True, 2),       # depthwise
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_small_ci_matches_float64_reference(case):
    check_strategy(case, "small_ci")


def _run(case: Case, bias: torch.Tensor | None, out: torch.Tensor | None = None):
    x, qw, _ = make(case)
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    y = conv2d_weight_only(x.cuda().contiguous(memory_format=fmt), qw.to("cuda"), bias, case.stride, case.padding,
                           case.dilation, case.act, case.groups, out=out, strategy="small_ci")
    torch.cuda.synchronize()
    return y


def _assert_close(y: torch.Tensor, case: Case, bias_used: torch.Tensor | None) -> None:
    x, qw, bias = make(case)
    ref = conv2d_reference(x, qw, bias_used, case.stride, case.padding, case.dilation, case.act, groups=case.groups)
    # no bias: the tolerance of a zero bias
    tol = tolerance(x, qw, torch.zeros_like(bias) if bias_used is None else bias_used, case, ref)
    got = y.double().cpu()
    assert bool(torch.isfinite(got).all()), f"{case}: unwritten (NaN) outputs"
    err = (got - ref).abs()
    assert bool((err <= tol).all()), f"{case}: max err {err.max():.3e}"


@pytest.mark.parametrize("case", [
    stem(2, 17, 23, 64, 4, 21, F16, True, 1),
    stem(2, 17, 23, 13, 8, 147, BF16, False, 0),
    Case(2, 4, 21, 70, 96, 3, 1, 1, 1, 2, 8, 2, F32, True, 2),
    Case(1, 8, 33, 130, 13, 1, 2, 0, 1, 1, 4, 4, F32, False, 1),
], ids=str)
def test_small_ci_without_bias(case):
    _assert_close(_run(case, None), case, None)


@pytest.mark.parametrize("channels_last", [True, False])
def test_small_ci_unaligned_out(channels_last):
    """out one element past an aligned address (a view of a larger buffer): NHWC takes the scalar stores."""
    case = stem(2, 17, 140, 64, 4, 21, F16, channels_last, 0)
    Oh, Ow = conv2d_output_shape(case.H, case.W, 7, 7, (2, 2), (3, 3), (1, 1))
    shape = (case.batch, Oh, Ow, case.Co) if channels_last else (case.batch, case.Co, Oh, Ow)
    base = torch.full((case.batch * case.Co * Oh * Ow + 1,), float("nan"), dtype=F16, device="cuda")
    out = base[1:].view(shape)
    out = out.permute(0, 3, 1, 2) if channels_last else out
    assert out.data_ptr() % 16 != 0
    _, _, bias = make(case)
    y = _run(case, bias.cuda(), out=out)
    assert y is out and bool(torch.isnan(base[0]))  # nothing written before out
    _assert_close(y, case, bias)


def test_small_ci_refuses_what_does_not_fit():
    """K = 3*3*64 = 576 needs 147 KiB of weights in shared memory: the API names the reason."""
    case = Case(1, 64, 9, 9, 64, 3, 1, 1, 1, 1, 4, 64, F16, True, 0)
    x, qw, bias = make(case)
    with pytest.raises(ValueError, match="strategy='small_ci' cannot run this conv: .*shared memory"):
        conv2d_weight_only(x.cuda().contiguous(memory_format=torch.channels_last), qw.to("cuda"), bias.cuda(), 1, 1,
                           strategy="small_ci")


def test_plan_launch_config_on_this_gpu():
    """The stem's plan: 52,712 bytes of dynamic shared memory (above the 48 KiB default: the opt-in
    applied), the grid launch_config gives for this GPU's SM count and occupancy, and on sm_90 the four
    blocks per SM the design counts on (128 registers x 128 threads x 4 = the register file)."""
    device = torch.cuda.current_device()
    g = ConvGeometry(1, 224, 224, 3, 112, 112, 64, 7, 7, 2, 2, 3, 3, 1, 1, 3, 0, 1)
    plan = SmallCiPlan(g, F16, 4, True, device, target_arch())
    config = plan.launch.shape.config
    assert config.smem == smem_bytes(g) == 52712
    ((source, name, _),) = SmallCiPlan.kernels(F16, 4, True)
    occupancy = conv_kernel(source, name, F16, 4, target_arch()).max_active_blocks(THREADS, config.smem, device)
    assert config == launch_config(g, sm_count(device), occupancy)
    if torch.cuda.get_device_capability() == (9, 0):
        assert occupancy == BLOCKS_PER_SM, f"{occupancy} blocks per SM"
