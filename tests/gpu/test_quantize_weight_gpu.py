"""The minmax quantization of a CUDA weight (one ``quantize_weight.cu`` launch) against the torch path on the CPU.

``quantize_weight(w.cuda(), ...)`` / ``quantize_conv_weight`` must give the QuantizedWeight of
``quantize_weight(w.cpu(), ...)`` bit for bit (qweight, and scale / offset compared as their int32 bits, so
even the sign of a zero counts) for bits 4 / 8, symmetric or not, fp16 / bf16 / fp32 / fp64 weights, ragged N,
per-channel and K blocks, conv weights (the int4 stem's K = 147 padded to 152), zero and constant blocks,
exact rounding ties and strided weights; NaN / Inf raise the CPU path's ValueError.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from cutlass_ops import quantizers
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
QMAX = {8: 127, 4: 7}


def _assert_same(got: QuantizedWeight, ref: QuantizedWeight) -> None:
    assert got.qweight.is_cuda and got.scale.is_cuda and got.offset.is_cuda
    for field in dataclasses.fields(QuantizedWeight):
        a, b = getattr(got, field.name), getattr(ref, field.name)
        if not isinstance(a, torch.Tensor):
            assert a == b, field.name
            continue
        a = a.cpu()
        assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous(), field.name
        if a.dtype == torch.float32:  # the bits: +0 and -0 differ
            a, b = a.view(torch.int32), b.view(torch.int32)
        if not torch.equal(a, b):
            bad = (a != b).nonzero()[:5].tolist()
            raise AssertionError(f"{field.name} differs at {bad}: got {[a[tuple(i)].item() for i in bad]}, "
                                 f"expected {[b[tuple(i)].item() for i in bad]}")
    got.validate()


def _weight(N: int, K: int, block_size: int, bits: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A [N, K] weight of ``dtype`` with outliers, an all-zero block, a constant block and a block of exact
    rounding ties (symmetric: scale = 2^-4 exactly, elements at (j + 1/2) 2^-4), rows scaled apart."""
    g = torch.Generator().manual_seed(seed * 7919 + N * 31 + K)
    w = torch.randn(N, K, generator=g, dtype=torch.float64) * torch.logspace(-3, 2, N, dtype=torch.float64)[:, None]
    w[:, ::17] *= 9
    G = K // block_size
    w[0, :block_size] = 0.0
    if G >= 2:
        w[:, block_size:2 * block_size] = 0.3125
    if G >= 3:
        qmax = QMAX[bits]
        j = torch.arange(block_size, dtype=torch.float64) % (2 * qmax) - qmax  # -qmax .. qmax - 1
        ties = (j + 0.5) / 16
        ties[0] = qmax / 16  # absmax = qmax * 2^-4: scale 2^-4 exactly
        w[-1, 2 * block_size:3 * block_size] = ties
    return w.to(dtype)


def _both(w: torch.Tensor, conv: bool, **kwargs) -> tuple[QuantizedWeight, QuantizedWeight]:
    quantize = quantize_conv_weight if conv else quantize_weight
    return quantize(w.cuda(), **kwargs), quantize(w.cpu(), **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block_size", [None, 32, 128])
@pytest.mark.parametrize("N", [1, 3, 257])
def test_linear_weight_bit_exact(N, block_size, bits, symmetric, dtype):
    K = 384  # 12 blocks of 32, 3 of 128, or one per channel
    w = _weight(N, K, block_size or K, bits, dtype)
    got, ref = _both(w, False, bits=bits, block_size=block_size, symmetric=symmetric)
    _assert_same(got, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape, block_size", [((64, 3, 7, 7), None), ((64, 3, 7, 7), 21), ((5, 3, 7, 7), 147),
                                               ((24, 1, 3, 3), 9), ((8, 16, 3, 3), 48), ((3, 40, 1, 1), 8)])
def test_conv_weight_bit_exact(shape, block_size, bits, symmetric, dtype):
    Co, Ci, Kh, Kw = shape
    g = torch.Generator().manual_seed(Co * Ci + Kh)
    w = torch.randn(shape, generator=g, dtype=torch.float64) * 0.2
    w[0] = 0.0
    w[1, :, 0, 0] = -0.75  # a constant block where blocks lie within a (kh, kw)
    w = w.to(dtype)
    got, ref = _both(w, True, bits=bits, block_size=block_size, symmetric=symmetric)
    _assert_same(got, ref)
    if bits == 4:
        assert got.K_packed == -(-got.K // 8) * 8


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_strided_weights_read_in_place(bits, symmetric):
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(96, 80, generator=g).cuda()
    for w in (wide.t(), wide[5:69, 3:67], wide.t()[:, 32:]):  # transposed, offset rows, both
        got = quantize_weight(w, bits=bits, block_size=16, symmetric=symmetric)
        # .contiguous(): the torch path's int8 qweight keeps a transposed w's strides, which QuantizedWeight refuses
        _assert_same(got, quantize_weight(w.cpu().contiguous(), bits=bits, block_size=16, symmetric=symmetric))
    conv = torch.randn(16, 8, 3, 3, generator=g).cuda().to(memory_format=torch.channels_last)
    got = quantize_conv_weight(conv, bits=bits, symmetric=symmetric)
    _assert_same(got, quantize_conv_weight(conv.cpu(), bits=bits, symmetric=symmetric))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", [8, 4])
def test_zero_constant_and_tiny_blocks(bits, dtype):
    """All-zero and zero-range blocks (scale 1, offset = max), blocks of +-0 mixed (asymmetric: the first
    zero's sign, as torch's CPU reduction for blocks under 16), and float64 ranges that underflow float32."""
    K, bs = 64, 8
    w = torch.zeros(6, K, dtype=torch.float64)
    w[1] = 2.5
    w[2, :bs] = torch.tensor([-0.0, 0.0, 0.0, -0.0, 0.0, 0.0, 0.0, 0.0])
    w[2, bs:2 * bs] = torch.tensor([0.0, -0.0, -0.0, 0.0, -0.0, 0.0, 0.0, 0.0])
    w[3] = -1e-3
    w[4, ::2] = 1.0
    if dtype == torch.float64:
        w[5, :bs] = 1e-300  # a float64 range whose float32 scale underflows: scale 1
        w[5, bs:2 * bs] = torch.tensor([0.0, -1e-300, -0.0, 0.0, 1e-310, 0.0, -0.0, 0.0])
    w = w.to(dtype)
    for symmetric in (True, False):
        got, ref = _both(w, False, bits=bits, block_size=bs, symmetric=symmetric)
        _assert_same(got, ref)


def test_large_values_and_float32_extremes():
    w = torch.randn(4, 256, dtype=torch.float64)
    w[0, 3] = float(torch.finfo(torch.float32).max)
    w[1, :128] = -float(torch.finfo(torch.float32).max)
    w[2, 7] = float(torch.finfo(torch.float32).tiny) / 8  # a float32 subnormal
    w[3] *= 1e-38
    for bits in (8, 4):
        for symmetric in (True, False):
            for dtype in (torch.float32, torch.float64):
                got, ref = _both(w.to(dtype), False, bits=bits, block_size=64, symmetric=symmetric)
                _assert_same(got, ref)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The shapes of the weights that reached the kernel (a spy: the kernel itself runs)."""
    from cutlass_ops.quantizers import minmax_cuda

    calls, real = [], minmax_cuda.quantize_minmax_cuda

    def spy(w, *args):
        calls.append(tuple(w.shape))
        return real(w, *args)

    monkeypatch.setattr(minmax_cuda, "quantize_minmax_cuda", spy)
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_raise_the_cpu_error(bad, dtype, kernel_calls):
    w = torch.ones(3, 64, dtype=dtype)
    w[2, 41] = bad
    for conv in (False, True):
        x = w.reshape(3, 16, 2, 2) if conv else w
        quantize = quantize_conv_weight if conv else quantize_weight
        kwargs = dict(bits=4) if conv else dict(bits=4, block_size=32)
        with pytest.raises(ValueError) as cpu:
            quantize(x, **kwargs)
        with pytest.raises(ValueError) as cuda:
            quantize(x.cuda(), **kwargs)
        assert str(cuda.value) == str(cpu.value) == "w contains NaN or Inf"
    assert kernel_calls == [(3, 64), (3, 16, 2, 2)]  # the kernel's flags raised, not a torch check first


@pytest.mark.parametrize("symmetric", [True, False])
def test_float64_beyond_float32_raises_the_cpu_error(symmetric, kernel_calls):
    w = torch.ones(2, 32, dtype=torch.float64)
    w[1, 5] = -1e39
    with pytest.raises(ValueError) as cpu:
        quantize_weight(w, bits=8, block_size=32, symmetric=symmetric)
    with pytest.raises(ValueError) as cuda:
        quantize_weight(w.cuda(), bits=8, block_size=32, symmetric=symmetric)
    assert str(cuda.value) == str(cpu.value)
    assert kernel_calls == [(2, 32)]
    assert str(cpu.value).startswith("w has values beyond the float32 range (max |w| = 1e+39)")


def test_argument_errors_come_second_as_on_the_cpu(kernel_calls):
    """A bad block_size or int4 K with a NaN weight: the torch path's order (NaN first) on both devices."""
    w = torch.ones(2, 36)
    w[0, 0] = float("nan")
    for kwargs in (dict(bits=8, block_size=5), dict(bits=4, block_size=None)):
        with pytest.raises(ValueError) as cpu:
            quantize_weight(w, **kwargs)
        with pytest.raises(ValueError) as cuda:
            quantize_weight(w.cuda(), **kwargs)
        assert str(cuda.value) == str(cpu.value)
    with pytest.raises(ValueError, match="block_size=5 does not divide K=36"):
        quantize_weight(torch.ones(2, 36).cuda(), bits=8, block_size=5)
    assert kernel_calls == []  # the torch path raised them


def test_the_default_method_runs_the_kernel_and_the_others_torch(monkeypatch, kernel_calls):
    calls = []
    real = quantizers.quantize

    def spy(*args, **kwargs):
        calls.append(kwargs["method"])
        return real(*args, **kwargs)

    monkeypatch.setattr(quantizers, "quantize", spy)  # formats looks it up per call
    w = torch.randn(8, 128).cuda()
    quantize_weight(w, bits=4)
    quantize_weight(w, bits=8, method="minmax", options={})
    quantize_conv_weight(w.reshape(8, 32, 2, 2), bits=4)
    assert calls == [] and kernel_calls == [(8, 128), (8, 128), (8, 32, 2, 2)]
    quantize_weight(w, bits=4, method="mse")
    quantize_weight(w, bits=4, method="imatrix", calibration=torch.randn(16, 128).cuda())
    assert calls == ["mse", "imatrix"] and len(kernel_calls) == 3


def test_other_device_and_stream():
    """The kernel runs on w's device and torch's current stream there."""
    w = torch.randn(64, 256)
    ref = quantize_weight(w, bits=4, block_size=64, symmetric=False)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        got = quantize_weight(w.cuda(), bits=4, block_size=64, symmetric=False)
    _assert_same(got, ref)
    if torch.cuda.device_count() > 1:
        got = quantize_weight(w.to("cuda:1"), bits=4, block_size=64, symmetric=False)
        assert got.qweight.device == torch.device("cuda:1")
        _assert_same(got, ref)
