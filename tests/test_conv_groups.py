"""Grouped / depthwise conv2d and the int4 stem (padded K), on the CPU: packing, validation, the
float64 reference, the custom op and its gradient, QuantConv2d and quantize_, and the conv kernels'
NVRTC builds. The GPU kernels are checked in tests/gpu/test_conv_groups_gpu.py."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_ops
from cutlass_ops import quantizers
from cutlass_ops.conv.geometry import ConvGeometry
from cutlass_ops.conv.igemm import igemm_unsupported
from cutlass_ops.formats import QuantizedWeight, packed_K, quantize_conv_weight, unpack_int4
from cutlass_ops.nn import QuantConv2d
from cutlass_ops.nn.modules import from_spec
from cutlass_ops.quantize_model import WeightOnlyConfig
from cutlass_ops.reference import conv2d_reference
from custom_kernels import nvrtc

ops = torch.ops.cutlass_ops


# ---------------------------------------------------------------------------------------------
# int4 rows padded to whole words
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, block_size", [
    ((8, 3, 7, 7), None),    # ResNet stem: K = 147 -> 152, blocks of Ci = 3 per (kh, kw)
    ((8, 3, 7, 7), 21),      # blocks of 7 taps
    ((6, 1, 3, 3), 9),       # depthwise 3x3: K = 9 -> 16, one block per output channel
    ((5, 3, 3, 3), 27),      # K = 27 -> 32, per output channel
])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_conv_rows_are_padded_with_zeros(shape, block_size, symmetric, seeded):
    w = torch.randn(*shape, generator=seeded)
    Co, Ci, Kh, Kw = shape
    K = Kh * Kw * Ci
    qw = quantize_conv_weight(w, bits=4, block_size=block_size, symmetric=symmetric)
    Kp = packed_K(K, 4, conv=True)
    assert Kp % 8 == 0 and Kp - K < 8 and qw.K_packed == Kp
    assert (qw.N, qw.K, qw.conv_shape) == (Co, K, (Co, Kh, Kw, Ci))
    assert qw.qweight.shape == (Co, Kp // 2) and qw.scale.shape == (Co, K // qw.block_size)
    # the padding holds q = 0 (u = 8) and belongs to no block: scale / offset cover exactly K
    assert bool((unpack_int4(qw.qweight)[:, K:] == 0).all())
    # the integers, scales and offsets are the quantizer's on the unpadded [Co, K] rows
    q, scale, offset = quantizers.quantize(w.permute(0, 2, 3, 1).reshape(Co, K), bits=4, block_size=qw.block_size,
                                           symmetric=symmetric)
    assert torch.equal(qw.int_values(), q.to(torch.int32))
    assert torch.equal(qw.scale, scale) and torch.equal(qw.offset, offset)
    deq = qw.dequantize(torch.float64)
    assert deq.shape == shape
    expected = (q.double().reshape(Co, -1, qw.block_size) * scale.double()[..., None]
                + offset.double()[..., None]).reshape(Co, Kh, Kw, Ci).permute(0, 3, 1, 2)
    assert torch.equal(deq, expected)
    assert qw.dequantize(flat=True).shape == (Co, K)


def test_padded_width_is_validated():
    qw = quantize_conv_weight(torch.randn(4, 3, 7, 7), bits=4)
    with pytest.raises(ValueError, match=r"QuantizedWeight.qweight must have shape \(4, 76\)"):
        QuantizedWeight(qw.qweight[:, :-4].contiguous(), qw.scale, qw.offset, 4, qw.block_size, 4, 147, qw.conv_shape)
    # a linear int4 weight still needs K % 8 == 0: its kernels read whole words of real K
    with pytest.raises(ValueError, match="K % 8 == 0"):
        QuantizedWeight(qw.qweight, qw.scale, qw.offset, 4, qw.block_size, 4, 147)
    # int8 rows are never padded
    assert quantize_conv_weight(torch.randn(4, 3, 7, 7), bits=8).qweight.shape == (4, 147)


@pytest.mark.parametrize("bits", [4, 8])
def test_blocks_run_along_K_across_taps(bits, seeded):
    """block_size a multiple of Ci: one block covers whole (kh, kw) taps of the stored K order."""
    w = torch.randn(6, 4, 3, 3, generator=seeded)
    for block_size in (2, 12, 36):  # inside a tap, 3 taps, the whole row
        qw = quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False)
        q, scale, offset = quantizers.quantize(w.permute(0, 2, 3, 1).reshape(6, 36), bits=bits,
                                               block_size=block_size, symmetric=False)
        assert torch.equal(qw.int_values(), q.to(torch.int32)) and torch.equal(qw.scale, scale)
    with pytest.raises(ValueError, match=r"block_size=8 does not divide Kh\*Kw\*Ci=36"):
        quantize_conv_weight(w, bits=bits, block_size=8)


@pytest.mark.parametrize("shape, groups, block_size", [((8, 3, 7, 7), 1, None), ((12, 1, 3, 3), 12, 9),
                                                       ((8, 2, 3, 3), 2, 6)])
def test_quant_conv2d_state_dict_round_trip(shape, groups, block_size, seeded):
    Co, Cig, Kh, Kw = shape
    conv = nn.Conv2d(Cig * groups, Co, (Kh, Kw), padding=1, groups=groups)
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=4, block_size=block_size))
    assert q.groups == groups and q.qweight.shape == (Co, packed_K(Kh * Kw * Cig, 4, conv=True) // 2)
    fresh = from_spec(q.spec())
    assert fresh.groups == groups and fresh.qweight.shape == q.qweight.shape
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh.dequantize(torch.float32), q.dequantize(torch.float32))
    assert fresh.dequantize(torch.float32).shape == conv.weight.shape
    for clone in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert torch.equal(clone.dequantize(torch.float32), q.dequantize(torch.float32)) and clone.groups == groups
    assert ("groups" in q.spec()) == (groups != 1)  # specs written before groups existed still load
    assert (f"groups={groups}" in repr(q)) == (groups != 1)


# ---------------------------------------------------------------------------------------------
# groups: validation and geometry
# ---------------------------------------------------------------------------------------------

def test_groups_validation_names_groups():
    qw = quantize_conv_weight(torch.randn(8, 4, 3, 3), bits=8)  # [Co=8, Ci/groups=4, 3, 3]
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(ValueError, match=r"groups=3 must divide the weight's Co=8"):
        cutlass_ops.conv2d(torch.randn(1, 12, 6, 6), qw, groups=3)
    with pytest.raises(ValueError, match=r"groups \* Ci = 4 \* 4 = 16 channels.*groups=4"):
        cutlass_ops.conv2d(x, qw, groups=4)
    with pytest.raises(ValueError, match="groups must be >= 1"):
        cutlass_ops.conv2d(x, qw, groups=0)
    with pytest.raises(TypeError, match="groups must be an int"):
        cutlass_ops.conv2d(x, qw, groups=2.0)
    with pytest.raises(TypeError, match="groups must be an int"):
        cutlass_ops.conv2d(x, qw, groups=True)
    with pytest.raises(RuntimeError, match="needs an NVIDIA GPU"):  # groups=2 is valid: past the checks
        cutlass_ops.conv2d(x, qw, groups=2)
    with pytest.raises(ValueError, match=r"groups=4 must divide in_channels=6 and out_channels=8"):
        QuantConv2d(6, 8, 3, groups=4)
    with pytest.raises(ValueError, match=r"block_size=4 must divide Kh\*Kw\*in_channels/groups=9"):
        QuantConv2d(8, 8, 3, groups=8, block_size=4)


def test_geometry_and_dispatch_of_groups():
    g = ConvGeometry(2, 9, 9, 256, 9, 9, 128, 3, 3, 1, 1, 1, 1, 1, 1, 64, 0, groups=2)
    assert (g.Cg, g.K, g.M) == (128, 3 * 3 * 128, 2 * 81)
    x = torch.randn(1, 48, 5, 5, dtype=torch.float16)

    def reason(Co, Cig, groups, block_size):
        qw = quantize_conv_weight(torch.randn(Co, Cig, 3, 3), bits=4, block_size=block_size)
        return igemm_unsupported(x, False, qw, Cig, 0, groups)

    assert "Ci / groups % 32 == 0, got Ci / groups = 24 (groups=2)" in reason(40, 24, 2, None)
    assert "Ci / groups % 32 == 0, got Ci / groups = 1" in reason(48, 1, 48, 9)  # depthwise: not igemm
    assert "(Co / groups) % 64 == 0 for groups > 1, got Co=96, groups=2" in reason(96, 64, 2, 64)
    assert "block_size % 32 == 0" in reason(128, 64, 2, 16)


@pytest.mark.parametrize("Ci, Co, groups, k, block_size, smem_limit, expected", [
    (64, 64, 1, 3, 64, None, "igemm"),         # igemm applies: it wins whatever else could run
    (48, 48, 48, 3, 9, None, "depthwise"),     # groups = Ci
    (24, 48, 24, 7, 49, None, "depthwise"),    # channel multiplier 2
    (3, 64, 1, 7, 49, None, "small_ci"),       # the ResNet stem
    (4, 32, 1, 3, 9, None, "small_ci"),        # RGBA
    (3, 64, 1, 7, 49, 32 * 1024, "direct"),    # the stem's 52.7 KB of shared memory over the GPU's limit
    (5, 64, 1, 3, 9, None, "direct"),          # more input channels than a stem: not measured, direct
    (8, 8, 2, 3, 9, None, "direct"),           # grouped, not depthwise
])
def test_auto_strategy(Ci, Co, groups, k, block_size, smem_limit, expected):
    """fp32 as listed; fp16 / bf16 the same for igemm and depthwise, else dequant_cudnn (below the MACs
    threshold too: cuDNN on the dequantized weight beats small_ci and direct for the half types)."""
    from cutlass_ops.conv import auto_strategy

    g = ConvGeometry(2, 56, 56, Ci, 56, 56, Co, k, k, 1, 1, k // 2, k // 2, 1, 1, block_size, 0, groups)
    igemm_reason = None if expected == "igemm" else "igemm does not apply"
    assert auto_strategy(g, torch.float32, igemm_reason, smem_limit) == expected
    half = expected if expected in ("igemm", "depthwise") else "dequant_cudnn"
    for dtype in (torch.float16, torch.bfloat16):
        assert auto_strategy(g, dtype, igemm_reason, smem_limit) == half


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_auto_strategy_at_batch_is_dequant_cudnn_for_half_types(dtype):
    """From DEQUANT_CUDNN_MIN_MACS multiply-adds on, fp16 / bf16 convs run dequant_cudnn whatever else could
    run them; fp32 never (cuDNN would take TF32 where the user allows it); one below, the other rules hold."""
    from cutlass_ops.conv import DEQUANT_CUDNN_MIN_MACS, auto_strategy, macs

    def geometry(batch, Ci, Co, k, groups):
        return ConvGeometry(batch, 56, 56, Ci, 56, 56, Co, k, k, 1, 1, k // 2, k // 2, 1, 1, k * k, 0, groups)

    half = dtype != torch.float32
    big = geometry(32, 64, 64, 3, 1)  # ResNet-50 64 -> 64 3x3 at batch 32: 3.7 G
    assert macs(big) == 32 * 56 * 56 * 64 * 9 * 64 >= DEQUANT_CUDNN_MIN_MACS
    assert auto_strategy(big, dtype, None) == ("dequant_cudnn" if half else "igemm")
    assert auto_strategy(geometry(32, 3, 64, 7, 1), dtype, "no igemm") == ("dequant_cudnn" if half else "small_ci")
    assert auto_strategy(geometry(1, 3, 64, 7, 1), dtype, "no igemm") == ("dequant_cudnn" if half else "small_ci")
    assert auto_strategy(geometry(32, 96, 96, 7, 96), dtype, "no igemm") == ("dequant_cudnn" if half else "depthwise")
    # depthwise 3x3 at batch 32 (115.6 M) stays depthwise; the threshold itself is inclusive
    assert auto_strategy(geometry(32, 128, 128, 3, 128), dtype, "no igemm") == "depthwise"
    edge = ConvGeometry(1, 1, 1, 1, 1, 1, DEQUANT_CUDNN_MIN_MACS, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1)
    assert macs(edge) == DEQUANT_CUDNN_MIN_MACS and auto_strategy(edge, dtype, None) == ("dequant_cudnn" if half
                                                                                         else "igemm")
    below = ConvGeometry(1, 1, 1, 1, 1, 1, DEQUANT_CUDNN_MIN_MACS - 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1)
    assert auto_strategy(below, dtype, None) == "igemm"


# ---------------------------------------------------------------------------------------------
# the float64 reference with groups
# ---------------------------------------------------------------------------------------------

def _naive_grouped_conv(x, w, stride, padding, dilation, groups):
    """Loops over the definition: output channel co reads input channels of group co // (Co / groups)."""
    B, Ci, H, W = x.shape
    Co, Cig, Kh, Kw = w.shape
    Cog = Co // groups
    Oh = (H + 2 * padding - dilation * (Kh - 1) - 1) // stride + 1
    Ow = (W + 2 * padding - dilation * (Kw - 1) - 1) // stride + 1
    out = torch.zeros(B, Co, Oh, Ow, dtype=torch.float64)
    for co in range(Co):
        c0 = (co // Cog) * Cig
        for fy in range(Kh):
            for fx in range(Kw):
                for oy in range(Oh):
                    iy = oy * stride - padding + fy * dilation
                    if not 0 <= iy < H:
                        continue
                    for ox in range(Ow):
                        ix = ox * stride - padding + fx * dilation
                        if 0 <= ix < W:
                            out[:, co, oy, ox] += x[:, c0:c0 + Cig, iy, ix].double() @ w[co, :, fy, fx].double()
    return out


@pytest.mark.parametrize("Ci, Co, groups, k, stride, padding, dilation", [
    (6, 4, 1, 3, 1, 1, 1),
    (6, 4, 2, 3, 2, 0, 1),
    (6, 6, 6, 3, 1, 1, 2),     # depthwise
    (4, 8, 4, 3, 2, 1, 1),     # depthwise, channel multiplier 2
    (3, 4, 1, 7, 2, 3, 1),     # stem geometry (int4 padded K)
])
def test_conv2d_reference_with_groups_matches_loops(Ci, Co, groups, k, stride, padding, dilation, seeded):
    x = torch.randn(2, Ci, 9, 8, generator=seeded)
    qw = quantize_conv_weight(torch.randn(Co, Ci // groups, k, k, generator=seeded), bits=4, symmetric=False)
    bias = torch.randn(Co, generator=seeded)
    y = conv2d_reference(x, qw, bias, stride, padding, dilation, "relu6", groups=groups)
    w = qw.dequantize(torch.float64)
    ref = (_naive_grouped_conv(x, w, stride, padding, dilation, groups) + bias.double()[:, None, None]).clamp(0, 6)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, F.conv2d(x.double(), w, bias.double(), stride, padding, dilation, groups).clamp(0, 6),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the custom op, its gradient, QuantConv2d and quantize_ (CPU kernels = the float64 reference)
# ---------------------------------------------------------------------------------------------

def _op_args(x, qw, bias, stride, padding, dilation, act, groups):
    return (x, qw.qweight, qw.scale, qw.offset, qw.bits, qw.block_size, list(qw.conv_shape), bias, [stride] * 2,
            [padding] * 2, [dilation] * 2, act, groups)


@pytest.mark.parametrize("Ci, Co, groups, k, bits", [(8, 6, 2, 3, 8), (8, 8, 8, 3, 4), (3, 4, 1, 7, 4)])
def test_op_opcheck_and_gradcheck_with_groups(Ci, Co, groups, k, bits, seeded):
    qw = quantize_conv_weight(torch.randn(Co, Ci // groups, k, k, generator=seeded), bits=bits, symmetric=False)
    x = torch.randn(2, Ci, 9, 9, generator=seeded, dtype=torch.float64)
    bias = torch.randn(Co, generator=seeded, dtype=torch.float64)
    args = _op_args(x, qw, bias, 2, 1, 1, 0, groups)
    torch.library.opcheck(ops.conv2d, args)
    xg, bg = x.clone().requires_grad_(True), bias.clone().requires_grad_(True)

    def f(x, b):
        return ops.conv2d(*_op_args(x, qw, b, 2, 1, 1, 0, groups))
    assert torch.autograd.gradcheck(f, (xg, bg), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("Ci, Co, groups, k, block_size", [(8, 12, 4, 3, None), (16, 16, 16, 3, 9),
                                                           (3, 8, 1, 7, None)])
def test_quant_conv2d_forward_and_backward_with_groups(Ci, Co, groups, k, block_size, seeded):
    torch.manual_seed(0)
    conv = nn.Conv2d(Ci, Co, k, stride=2, padding=k // 2, groups=groups)
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=4, block_size=block_size))
    q.bias.requires_grad_(True)  # an adapter-style trainable bias
    x = torch.randn(2, Ci, 11, 10, generator=seeded, requires_grad=True)
    y = q(x)
    w = q.dequantize(torch.float64)
    ref = F.conv2d(x.detach().double(), w, q.bias.double(), 2, k // 2, 1, groups)
    torch.testing.assert_close(y, ref.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y, conv(x), rtol=0.1, atol=0.1)  # int4 of the float weight
    g = torch.randn_like(y)
    y.backward(g)
    x2 = x.detach().double().requires_grad_(True)
    F.conv2d(x2, w, None, 2, k // 2, 1, groups).backward(g.double())
    torch.testing.assert_close(x.grad, x2.grad.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q.bias.grad, g.sum((0, 2, 3)), rtol=1e-5, atol=1e-5)


class MobileBlock(nn.Module):
    """A stem, a depthwise 3x3, a grouped 1x1 and a pointwise 1x1."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.grouped = nn.Conv2d(16, 32, 1, groups=4)
        self.pw = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.grouped(torch.relu(self.dw(torch.relu(self.stem(x)))))))


def test_quantize_converts_grouped_depthwise_and_stem():
    torch.manual_seed(0)
    net = MobileBlock()
    summary = cutlass_ops.quantize_(copy.deepcopy(net), WeightOnlyConfig(bits=4, block_size=None))
    assert summary.converted == ["stem", "dw", "grouped", "pw"] and not summary.skipped
    # block 128: K <= 128 takes one block per output channel (dw K = 9, grouped K = 4, pw K = 32);
    # the stem's K = 147 is longer than a block and 128 does not divide it
    q = copy.deepcopy(net)
    summary = cutlass_ops.quantize_(q, WeightOnlyConfig(bits=4, block_size=128))
    assert summary.converted == ["dw", "grouped", "pw"]
    assert "block_size=128 does not divide Kh*Kw*in_channels/groups=147" in summary.skipped["stem"]
    assert (q.dw.block_size, q.dw.groups, q.grouped.block_size, q.grouped.groups) == (9, 16, 4, 4)
    q = copy.deepcopy(net)
    cutlass_ops.quantize_(q, WeightOnlyConfig(bits=4, block_size=21))  # 21 | 147: blocks of 7 stem taps
    x = torch.randn(1, 3, 20, 18)
    torch.testing.assert_close(q(x), net(x), rtol=0.1, atol=0.1)


def test_save_and_load_quantized_with_groups_and_padded_rows(tmp_path):
    torch.manual_seed(0)
    net = MobileBlock()
    cutlass_ops.quantize_(net, WeightOnlyConfig(bits=4, block_size=None))
    path = tmp_path / "mobile-w4.safetensors"
    cutlass_ops.save_quantized(net, path)
    torch.manual_seed(1)
    fresh = cutlass_ops.load_quantized_state(MobileBlock(), path)
    assert (fresh.stem.qweight.shape, fresh.dw.groups, fresh.grouped.groups) == ((16, 76), 16, 4)
    x = torch.randn(1, 3, 12, 13)
    assert torch.equal(fresh(x), net(x))


# ---------------------------------------------------------------------------------------------
# kernels: NVRTC builds of the (dtype, bits) modules the plans load
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["80", "90a"])
@pytest.mark.parametrize("t_code, bits", [(1, 4), (2, 4), (3, 8)])
def test_conv_modules_build_for_the_plans(arch, t_code, bits):
    """Each plan's module (CUOPS_CONV_T / CUOPS_CONV_BITS) builds for sm_80 and sm_90a with its entry points."""
    defines = {"CUOPS_CONV_T": t_code, "CUOPS_CONV_BITS": bits}
    tag = {1: "f32", 2: "f16", 3: "bf16"}[t_code]
    direct = nvrtc.compile_file("conv_direct.cu", arch, defines=defines).data
    for layout in ("nchw", "nhwc"):
        assert f"conv_direct_{tag}_w{bits}_{layout}".encode() + b"\x00" in direct
    if t_code != 1:
        igemm = nvrtc.compile_file("conv_igemm.cu", arch, defines=defines).data
        for layout in ("nchw", "nhwc"):
            assert f"conv_igemm_{tag}_w{bits}_{layout}".encode() + b"\x00" in igemm
