"""Grouped / depthwise conv2d and the int4 stem on the GPU, against the float64 reference.

Shapes: the ResNet stem (Ci = 3, 7x7, stride 2, pad 3; int4 K = 147 stored padded to 152), Ci = 48
and Ci = 256 with groups 1, 2, 4 and Ci (depthwise, also with a channel multiplier), each under a
rotation of stride 1/2, padding 0/1, dilation 1/2, NCHW / channels_last, batch 1 / 7, int4 / int8
and fp16 / bf16 / fp32. Case, operands and tolerance: tests/_conv_cases.py (as in tests/gpu/test_conv_gpu.py:
with S = conv(|x|, |q*scale| + |offset|, groups) + |bias| and K = Kh*Kw*Ci/groups,
  |y - ref| <= (3 u + K 2^-23) S + u |ref|,   u = 2^-11 (fp16), 2^-8 (bf16), 2^-24 (fp32)).
"""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_ops
from cutlass_ops.conv import conv2d_weight_only
from cutlass_ops.nn import QuantConv2d
from cutlass_ops.quantize_model import WeightOnlyConfig
from _conv_cases import Case, check_strategy, make

pytestmark = pytest.mark.gpu

# (Ci, Co, groups, k, H, W, block_size): block None = one block per (co, kh, kw) over Ci/groups
SHAPES = [
    (3, 16, 1, 7, 23, 21, None),      # stem, blocks of Ci = 3
    (3, 16, 1, 7, 19, 20, 21),        # stem, blocks of 7 taps
    (3, 8, 1, 7, 17, 17, 147),        # stem, one block per output channel
    (48, 40, 1, 3, 9, 9, 16),
    (48, 40, 2, 3, 9, 10, 24),        # Ci/groups = 24: direct
    (48, 32, 2, 1, 7, 9, 8),          # grouped 1x1
    (48, 48, 48, 3, 11, 10, 9),       # depthwise, one block per channel
    (48, 96, 48, 3, 10, 11, None),    # depthwise, channel multiplier 2, a block per tap
    (48, 48, 48, 5, 13, 12, 25),      # depthwise 5x5
    (256, 64, 1, 3, 7, 7, 64),        # igemm
    (256, 128, 2, 3, 6, 7, 128),      # grouped igemm: Ci/groups = 128, Co/groups = 64
    (256, 96, 2, 3, 6, 6, 64),        # Co/groups = 48: igemm excluded, direct
    (256, 256, 4, 3, 6, 6, 192),      # grouped igemm, blocks of 3 taps
    (256, 256, 256, 3, 8, 8, 9),      # depthwise
]
# (stride, padding, dilation, channels_last, batch, bits, dtype, act); the stem keeps stride 2, pad 3.
VARIANTS = [
    (1, 1, 1, True, 1, 4, torch.float16, 1),
    (2, 0, 1, False, 7, 8, torch.bfloat16, 0),
    (1, 1, 2, False, 1, 4, torch.bfloat16, 2),
    (2, 1, 2, True, 7, 8, torch.float16, 0),
    (1, 0, 1, True, 1, 4, torch.float32, 1),
    (2, 1, 1, False, 7, 4, torch.float16, 2),
]


def _cases() -> list[Case]:
    cases = []
    for i, (Ci, Co, groups, k, H, W, block_size) in enumerate(SHAPES):
        for j in range(3):
            stride, padding, dilation, cl, batch, bits, dtype, act = VARIANTS[(i + j) % len(VARIANTS)]
            if k == 7:  # the stem's own geometry
                stride, padding, dilation = 2, 3, 1
            cases.append(Case(batch, Ci, H, W, Co, k, stride, padding, dilation, groups, bits, block_size, dtype,
                              cl, act))
    return cases


CASES = _cases()


def _igemm_applies(case: Case) -> bool:
    Cig, bs = case.Ci // case.groups, case.block_size or case.Ci // case.groups
    return (case.dtype != torch.float32 and Cig % 32 == 0 and bs % 32 == 0
            and (case.groups == 1 or (case.Co // case.groups) % 64 == 0)
            and torch.cuda.get_device_capability()[0] >= 8)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_auto_matches_float64_reference(case):
    check_strategy(case, "auto")


# Grouped cases igemm can take (auto picks it on sm_80+): both strategies forced.
IGEMM_GROUPED = [c for c in CASES if c.groups > 1 and c.Ci == 256 and c.Co // c.groups % 64 == 0
                 and c.dtype != torch.float32]


@pytest.mark.parametrize("strategy", ["direct", "igemm"])
@pytest.mark.parametrize("case", IGEMM_GROUPED, ids=str)
def test_grouped_strategies_match_float64_reference(case, strategy):
    if strategy == "igemm" and not _igemm_applies(case):
        pytest.skip("igemm needs sm_80+")
    check_strategy(case, strategy)


def test_igemm_refuses_the_groups_it_cannot_run():
    """igemm refuses the groups it cannot run (auto then runs depthwise or direct)."""
    for Ci, Co, groups, block_size, reason in ((256, 96, 2, 64, "(Co / groups) % 64"),
                                               (48, 48, 48, 9, "Ci / groups % 32")):
        case = Case(1, Ci, 6, 6, Co, 3, 1, 1, 1, groups, 4, block_size, torch.float16, True, 0)
        x, qw, bias = make(case)
        with pytest.raises(ValueError, match=f"strategy='igemm' cannot run this conv: .*{re.escape(reason)}"):
            conv2d_weight_only(x.cuda().contiguous(memory_format=torch.channels_last), qw.to("cuda"), bias.cuda(),
                               1, 1, 1, 0, groups, strategy="igemm")


@pytest.mark.parametrize("Ci, Co, groups, k, stride, padding, bits, block_size, dtype", [
    (3, 64, 1, 7, 2, 3, 4, None, torch.float16),       # ResNet stem, int4 (was refused: K = 147)
    (3, 64, 1, 7, 2, 3, 8, 21, torch.bfloat16),        # ResNet stem, int8
    (32, 32, 32, 3, 1, 1, 4, 9, torch.float16),        # depthwise
    (64, 128, 2, 3, 2, 1, 8, 32, torch.bfloat16),      # grouped (K = 288), igemm under auto
])
def test_quant_conv2d_forward_equals_conv2d(Ci, Co, groups, k, stride, padding, bits, block_size, dtype):
    torch.manual_seed(0)
    conv = nn.Conv2d(Ci, Co, k, stride=stride, padding=padding, groups=groups).to(dtype).cuda()
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=bits, block_size=block_size))
    assert q.groups == groups
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, Ci, 15, 14, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
        y = q(x)
        assert torch.equal(y, cutlass_ops.conv2d(x, q.weight(), q.bias, stride, padding, 1, None, groups))
        assert torch.equal(y, torch.ops.cutlass_ops.conv2d(x, q.qweight, q.scale, q.offset, bits, q.block_size,
                                                           list(q._conv_shape), q.bias, [stride] * 2, [padding] * 2,
                                                           [1, 1], 0, groups))
        ref = F.conv2d(x.double(), q.dequantize(torch.float64), q.bias.double(), stride, padding, 1, groups)
        torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("Ci, Co, groups, k, bits", [(16, 16, 16, 3, 4), (3, 8, 1, 7, 4), (32, 64, 2, 3, 8)])
def test_backward_with_groups(Ci, Co, groups, k, bits):
    """grad_x = conv2d_input(W_deq, grad, groups) (padded int4 rows included), grad_bias = sum(grad)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(Ci, Co, k, padding=k // 2, groups=groups).cuda()
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=bits, block_size=None))
    q.bias.requires_grad_(True)
    x = torch.randn(2, Ci, 9, 10, device="cuda", requires_grad=True)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # fp32 grad_x in full fp32 (cuDNN's default is TF32)
        y = q(x)
        g = torch.randn_like(y)
        y.backward(g)
    x2 = x.detach().double().requires_grad_(True)
    F.conv2d(x2, q.dequantize(torch.float64), None, 1, k // 2, 1, groups).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q.bias.grad, g.sum((0, 2, 3)), rtol=1e-4, atol=1e-4)


def test_quantized_mobile_block_runs_every_layer():
    """quantize_ converts the stem (int4), a depthwise, a grouped and a pointwise conv; the GPU output
    equals the CPU modules (the float64 references) within the fp16 tolerance."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 7, stride=2, padding=3), nn.ReLU(),
                        nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(),
                        nn.Conv2d(32, 64, 1, groups=2), nn.ReLU(), nn.Conv2d(64, 16, 1))
    summary = cutlass_ops.quantize_(net, WeightOnlyConfig(bits=4, block_size=None))
    assert len(summary.converted) == 4 and not summary.skipped
    x = torch.randn(2, 3, 32, 30)
    ref = copy.deepcopy(net).float()(x)
    with torch.no_grad():
        y = net.half().cuda()(x.half().cuda().contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2e-2, atol=2e-2)
