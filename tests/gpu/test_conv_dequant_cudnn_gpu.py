"""conv2d with strategy "dequant_cudnn" (conv_dequant.cu, then cuDNN) on the GPU, against the float64 reference.

The dequantized weight itself (both layouts, int4 rows padded to whole words, block sizes that split taps),
then whole convs: the ResNet-50 layers and the stem at batch 32 (where "auto" picks this strategy), and
ragged shapes: batch 1 / 7, Ci 3 / 48 / 4096, Co 13 / 24 / 40 (the NHWC bias / activation epilogue and its
fallback), groups 2 and depthwise, strides (2, 1), padding (0, 2), dilation 2,
a 3x5 kernel, NCHW and channels_last, fp32 / fp16 / bf16, int4 / int8, act 0 / 1 / 2, bias present and
None, with ``out`` and without (the output keeps x's memory format). fp32 runs with TF32 off (cuDNN
follows ``torch.backends.cudnn.allow_tf32`` like any fp32 conv). Tolerance: tests/_conv_cases.py.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from cutlass_ops.conv import DEQUANT_CUDNN_MIN_MACS, auto_strategy, conv2d_weight_only, macs, plan_for
from cutlass_ops.conv.igemm import igemm_problem
from _conv_cases import Case, check_against_reference, check_strategy, kernel_geometry, make, output_hw

pytestmark = pytest.mark.gpu

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def no_tf32():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


# Case(batch, Ci, H, W, Co, k, stride, padding, dilation, groups, bits, block_size, dtype, channels_last, act)
CASES = [
    # ResNet-50 layers and the stem at batch 32 (what "auto" sends here)
    Case(32, 64, 56, 56, 64, 3, 1, 1, 1, 1, 4, 64, F16, True, 1),
    Case(32, 256, 56, 56, 64, 1, 1, 0, 1, 1, 8, 64, BF16, True, 0),
    Case(32, 512, 7, 7, 512, 3, 1, 1, 1, 1, 4, 128, F16, False, 2),
    Case(32, 3, 224, 224, 64, 7, 2, 3, 1, 1, 4, 49, F16, True, 1),   # K = 147: int4 rows padded to 152
    Case(32, 3, 224, 224, 64, 7, 2, 3, 1, 1, 8, 21, BF16, False, 0),
    # ragged
    Case(1, 48, 17, 23, 40, 3, 1, 1, 1, 1, 4, 48, F32, True, 0),
    Case(7, 48, 17, 23, 40, (3, 5), (2, 1), (0, 2), 1, 1, 8, 30, F16, False, 1, bias=False),
    Case(7, 48, 17, 23, 40, 3, 1, 2, 2, 2, 4, 8, BF16, True, 2),     # groups 2, dilation 2; blocks split taps
    Case(2, 96, 30, 30, 96, 7, 1, 3, 1, 96, 8, 49, F16, True, 0),    # depthwise 7x7
    Case(2, 96, 30, 30, 96, 7, 1, 3, 1, 96, 4, 7, F32, False, 1),
    Case(3, 3, 19, 21, 13, 5, 2, 2, 1, 1, 4, 75, F32, False, 2),     # K = 75: int4 rows padded to 80
    Case(7, 4096, 3, 3, 40, 3, 1, 1, 1, 1, 8, 128, BF16, False, 1),  # Ci = 4096: K = 36,864
    # NHWC epilogue: Co % 8 != 0 (torch's add / relu instead of conv_bias_act), and nothing to apply
    Case(3, 3, 19, 21, 13, 5, 2, 2, 1, 1, 8, 75, F16, True, 1),
    Case(2, 64, 14, 14, 24, 3, 1, 1, 1, 1, 4, 64, BF16, True, 0, bias=False),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_dequant_cudnn_matches_float64_reference(case):
    check_strategy(case, "dequant_cudnn")


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[7]], ids=str)
def test_without_out_the_output_keeps_x_memory_format(case):
    x, qw, bias = make(case)
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    y = conv2d_weight_only(x.cuda().contiguous(memory_format=fmt), qw.to("cuda"), None if bias is None else bias.cuda(),
                           case.stride, case.padding, case.dilation, case.act, case.groups, strategy="dequant_cudnn")
    assert y.dtype == case.dtype and y.is_contiguous(memory_format=fmt)
    check_against_reference(y, case, x, qw, bias, str(case))


def _dense(case: Case, qw, channels_last: bool) -> torch.Tensor:
    g = kernel_geometry(case, qw.block_size)
    plan = plan_for("dequant_cudnn", case.dtype, qw.bits, channels_last, tuple(g.kernel_fields().values()), None,
                    torch.cuda.current_device())
    w = plan.dequantize(qw, case.dtype, torch.device("cuda"))
    torch.cuda.synchronize()
    return w


# the 8-wide kernel (K % 8 == 0, block_size % 8 == 0: cases 0, 1, 2, 5, 7) and the per-element one (3, 6, 9)
@pytest.mark.parametrize("case", [CASES[i] for i in (0, 1, 2, 3, 5, 6, 7, 9)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
def test_dense_weight_is_the_dequantized_weight(case, channels_last):
    """The plan's dense weight: every element at its [Co, Cg, Kh, Kw] place, q * scale + offset (one fp32 fma)
    rounded once to the dtype (relative u, or half a subnormal step near zero)."""
    _, qw, _ = make(case)
    w = _dense(case, qw.to("cuda"), channels_last)
    assert w.shape == (case.Co, case.Ci // case.groups, *((case.k,) * 2 if isinstance(case.k, int) else case.k))
    assert w.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    Co, Kh, Kw, Cg = qw.conv_shape
    q = qw.int_values().double().reshape(Co, qw.num_groups, qw.block_size)
    ref = (q * qw.scale.double()[..., None] + qw.offset.double()[..., None]).reshape(Co, Kh, Kw, Cg).permute(0, 3, 1, 2)
    u = {F16: 2.0 ** -11, BF16: 2.0 ** -8, F32: 2.0 ** -24}[case.dtype]
    mag = (q.abs() * qw.scale.double().abs()[..., None] + qw.offset.double().abs()[..., None])
    mag = mag.reshape(Co, Kh, Kw, Cg).permute(0, 3, 1, 2)
    err = (w.double().cpu() - ref).abs()
    subnormal = torch.finfo(case.dtype).smallest_normal * u  # half the spacing of the dtype's subnormals
    assert bool((err <= u * ref.abs() + 2.0 ** -23 * mag + subnormal).all()), f"max err {err.max():.3e}"


@pytest.mark.parametrize("case", [CASES[0], CASES[1]], ids=str)
def test_misaligned_qweight_takes_the_per_element_kernel(case):
    """A qweight 2 bytes past a 4-byte boundary (a view into a larger buffer) cannot take the 8-wide kernel's
    32-bit loads: the per-element kernel runs and gives the same weight, bit for bit."""
    from cutlass_ops.conv.dequant_cudnn import chunked

    _, qw, _ = make(case)
    assert chunked(kernel_geometry(case, qw.block_size))
    qg = qw.to("cuda")
    buf = torch.empty(qg.qweight.numel() + 2, dtype=torch.uint8, device="cuda")
    shifted = buf[2:].view(qg.qweight.dtype).view(qg.qweight.shape)
    shifted.copy_(qg.qweight)
    assert shifted.data_ptr() % 4 == 2
    moved = dataclasses.replace(qg, qweight=shifted)
    for channels_last in (False, True):
        assert torch.equal(_dense(case, moved, channels_last), _dense(case, qg, channels_last))


def test_auto_runs_dequant_cudnn_from_the_threshold_on(monkeypatch):
    """"auto" runs dequant_cudnn at batch 32 (>= DEQUANT_CUDNN_MIN_MACS multiply-adds), igemm at batch 1: the
    plans it builds are recorded (the real ones, launched), and the outputs checked."""
    import cutlass_ops.conv as conv

    ran = []

    def spy(strategy, *args):
        ran.append(strategy)
        return plan_for(strategy, *args)

    monkeypatch.setattr(conv, "plan_for", spy)
    for batch, expected in ((32, "dequant_cudnn"), (1, "igemm")):
        case = Case(batch, 64, 56, 56, 64, 3, 1, 1, 1, 1, 4, 64, F16, True, 1)
        g = kernel_geometry(case, 64)
        assert (macs(g) >= DEQUANT_CUDNN_MIN_MACS) == (batch == 32)
        assert auto_strategy(g, F16, igemm_problem(F16, 64, 64, 1, 64)) == expected
        x, qw, bias = make(case)
        ran.clear()
        y = conv2d_weight_only(x.cuda().contiguous(memory_format=torch.channels_last), qw.to("cuda"), bias.cuda(),
                               1, 1, 1, 1)
        assert ran == [expected]
        assert y.is_contiguous(memory_format=torch.channels_last)
        check_against_reference(y, case, x, qw, bias, f"{case} [auto]")
