"""torch.ops.cutlass_ops.*: schemas, fake kernels, autograd formulas - on the CPU kernels (float64 references).

The GPU kernels of the same ops are checked in tests/gpu/test_torch_integration_gpu.py.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlass_ops
from cutlass_ops import reference, torch_ops
from cutlass_ops.formats import quantize_conv_weight, quantize_weight
from cutlass_ops.w8a8.block_scaled import quantize_weight_block_scaled

ops = torch.ops.cutlass_ops


def _int8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


def _w(qw):
    return (qw.qweight, qw.scale, qw.offset)


def op_cases():
    """(name, op, args) for every registered op, at ragged shapes (M = 3, N = 24, K = 64)."""
    torch.manual_seed(0)
    M, N, K = 3, 24, 64
    qw4 = quantize_weight(torch.randn(N, K), bits=4, block_size=32)
    qw8 = quantize_weight(torch.randn(N, K), bits=8, block_size=32, symmetric=False)
    qch = quantize_weight(torch.randn(N, K), bits=8, block_size=None)
    qconv = quantize_conv_weight(torch.randn(8, 16, 3, 3), bits=4, block_size=8)
    qbs = quantize_weight_block_scaled(torch.randn(N, K), 64)  # N = 24: one short N block
    x = torch.randn(2, M, K)
    bias = torch.randn(N)
    A, B = _int8(M, K), _int8(N, K)
    f32 = dict(dtype=torch.float32)
    return [
        ("dequantize", ops.dequantize, (*_w(qw4), 4, 32, N, K, torch.float32)),
        ("linear", ops.linear, (x, *_w(qw4), 4, 32, N, K, bias, 1)),
        ("linear_int8", ops.linear, (x, *_w(qw8), 8, 32, N, K, None, 0)),
        ("linear_w8a8", ops.linear_w8a8, (x, *_w(qw8), 32, N, K, bias, 2, "fused")),
        ("linear_w8a8_channel", ops.linear_w8a8_channel, (x, qch.qweight, qch.scale, bias, 0)),
        ("linear_w8a8_block_scaled", ops.linear_w8a8_block_scaled, (x, qbs.qweight, qbs.scale, bias, 1, 64)),
        ("conv2d", ops.conv2d, (torch.randn(2, 16, 7, 9), *_w(qconv), 4, 8, [8, 3, 3, 16], torch.randn(8),
                                [2, 1], [1, 1], [1, 1], 1)),
        ("conv2d_channels_last", ops.conv2d, (torch.randn(2, 16, 7, 9).to(memory_format=torch.channels_last),
                                              *_w(qconv), 4, 8, [8, 3, 3, 16], None, [1, 1], [0, 1], [1, 2], 0)),
        ("int8_gemm", ops.int8_gemm, (A, B, None)),
        ("int8_gemm_dequant", ops.int8_gemm_dequant,
         (A, B, torch.rand(M, **f32), torch.rand(N, **f32), torch.randn(N, **f32), 1, torch.float16, "80")),
        ("int8_gemm_requant", ops.int8_gemm_requant, (A, B, torch.rand(N, **f32) / 1000, None, -128, 127, None)),
        ("int8_gemm_requant_clamp", ops.int8_gemm_requant,
         (A, B, torch.rand(N, **f32) / 1000, torch.randn(N, **f32), -10, 20, "90a")),
        ("int8_gemm_kblock_accumulate", ops.int8_gemm_kblock_accumulate,
         (A, B, torch.randn(M, N), *(torch.rand(M) if i % 2 == 0 else torch.rand(N) for i in range(6)), None)),
        ("quantize_activation", ops.quantize_activation, (torch.randn(M, K), 32)),
    ]


CASES = {name: (op, args) for name, op, args in op_cases()}


def test_every_op_has_a_case():
    names = {getattr(ops, n).default.name().split("::")[1] for n in torch_ops.OPS}
    assert names == {op.default.name().split("::")[1] for op, _ in CASES.values()}


@pytest.mark.parametrize("name", list(CASES))
def test_opcheck_cpu(name):
    op, args = CASES[name]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("name", list(CASES))
def test_fake_kernels_give_the_real_shapes_and_dtypes(name):
    op, args = CASES[name]
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,)):
        assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride())


def test_cpu_kernels_are_the_references():
    op, args = CASES["linear"]
    x, q, s, o, bits, bs, N, K, bias, act = args
    qw = torch_ops.weight_view(q, s, o, bits, bs, N, K)
    assert torch.equal(op(*args), reference.linear_reference(x, qw, bias, act).float())
    op, args = CASES["int8_gemm"]
    assert torch.equal(op(*args), reference.int8_gemm_reference(*args[:2]))


@pytest.mark.parametrize("name", ["linear", "linear_int8", "linear_w8a8", "linear_w8a8_channel", "conv2d"])
def test_gradcheck_float64(name):
    op, args = CASES[name]
    args = list(args)
    w8a8 = name in ("linear_w8a8", "linear_w8a8_channel")
    dtype = torch.float32 if w8a8 else torch.float64  # QuantA takes float16/bfloat16/float32 only
    x = args[0].to(dtype).requires_grad_(True)
    bias_at = {"conv2d": 7, "linear_w8a8": 7, "linear_w8a8_channel": 3}.get(name, 8)
    bias = args[bias_at]
    if bias is not None:
        bias = bias.to(dtype).requires_grad_(True)
    if w8a8:
        # W8A8: the activation is quantized (piecewise constant), so the formula is the straight-through
        # one: grad_x = grad @ W_deq. Check it against the float64 linear through the same weight.
        y = op(*(x if i == 0 else bias if i == bias_at else a for i, a in enumerate(args)))
        g = torch.randn_like(y)
        gx, *gb = torch.autograd.grad(y, [x] + ([bias] if bias is not None else []), g)
        if name == "linear_w8a8":
            W = torch_ops.weight_view(args[1], args[2], args[3], 8, *args[4:7]).dequantize(dtype)
        else:
            W = args[1].to(dtype) * args[2]
        mask = g if args[bias_at + 1] == 0 else g * ((y > 0) & (y < 6))
        torch.testing.assert_close(gx, mask @ W)
        if gb:
            torch.testing.assert_close(gb[0], mask.reshape(-1, W.shape[0]).sum(0))
        return

    def f(x, bias):
        return op(*(x if i == 0 else bias if i == bias_at else a for i, a in enumerate(args)))
    assert torch.autograd.gradcheck(f, (x, bias), eps=1e-6, atol=1e-6)


def test_weight_gradient_raises():
    op, args = CASES["linear"]
    args = list(args)
    args[2] = args[2].clone().requires_grad_(True)  # scale
    with pytest.raises(RuntimeError, match="scale requires grad, but the weight is not differentiable"):
        op(*args)


@pytest.mark.parametrize("name", ["int8_gemm_dequant", "quantize_activation"])
def test_non_differentiable_ops_raise_when_asked_for_grad(name):
    op, args = CASES[name]
    args = [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args]
    with pytest.raises(RuntimeError, match="is not differentiable"):
        op(*args)


def test_public_functions_refuse_grad_where_there_is_none():
    x = torch.randn(3, 64, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"quantize_activation\(\) is not differentiable but x requires grad"):
        cutlass_ops.quantize_activation(x, 32)
    with torch.no_grad():
        assert cutlass_ops.quantize_activation(x, 32)[0].dtype == torch.int8


def test_compile_fullgraph_cpu():
    """The ops trace without a graph break (aot_eager: no C++ compiler needed)."""
    op, args = CASES["linear"]
    x, *rest = args

    def f(x):
        return torch.relu(op(x, *rest)) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), f(x), rtol=0, atol=0)
