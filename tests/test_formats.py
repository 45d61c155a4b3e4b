"""The shared data format: quantizers, int4 packing orders, zero points, QuantA, requant params (CPU)."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.formats import (
    INT4_INTERLEAVE, QuantizedWeight, offset_to_zero_point, pack_int4, quantize_activation_reference,
    quantize_conv_weight, quantize_weight, requant_params, unpack_int4, zero_point_to_offset,
)

QRANGE = {8: (-128, 127), 4: (-8, 7)}
FLOAT32_EPS = torch.finfo(torch.float32).eps


def _deq64(qw: QuantizedWeight) -> torch.Tensor:
    """q * scale + offset in float64 from the stored integers and float32 parameters, [N, K]."""
    q = qw.int_values().to(torch.float64).reshape(qw.N, qw.num_groups, qw.block_size)
    return (q * qw.scale.double()[..., None] + qw.offset.double()[..., None]).reshape(qw.N, qw.K)


def _per_element(params: torch.Tensor, block_size: int) -> torch.Tensor:
    return params.repeat_interleave(block_size, dim=1)


# ---------------------------------------------------------------------------------------------
# weight quantization round trip
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", [32, None])
def test_round_trip_error_is_at_most_half_a_step(bits, symmetric, block_size, seeded):
    N, K = 17, 128
    w = torch.randn(N, K, generator=seeded, dtype=torch.float64) * 3 + 0.5
    qw = quantize_weight(w, bits=bits, block_size=block_size, symmetric=symmetric)
    bs = K if block_size is None else block_size
    assert (qw.bits, qw.block_size, qw.N, qw.K) == (bits, bs, N, K)
    assert qw.symmetric == symmetric and qw.conv_shape is None
    assert qw.scale.shape == qw.offset.shape == (N, K // bs)
    q = qw.int_values()
    assert q.dtype == torch.int32 and q.shape == (N, K)
    assert QRANGE[bits][0] <= int(q.min()) and int(q.max()) <= QRANGE[bits][1]
    half_step = _per_element(qw.scale.double(), bs) / 2
    err = (w - _deq64(qw)).abs()
    # Rounding to the nearest of the uniform levels: |w - deq| <= scale / 2 (float64 slack only).
    assert bool((err <= half_step * (1 + 1e-12)).all())
    # The bound is tight: some element lands close to half way between two levels.
    assert float((err / half_step).max()) > 0.8
    # The float32 dequantize() adds at most float32 rounding of the result.
    err32 = (w - qw.dequantize().double()).abs()
    assert bool((err32 <= half_step * (1 + 1e-12) + 4 * FLOAT32_EPS * w.abs().max()).all())
    if symmetric:
        assert bool((qw.offset == 0).all())
        # absmax maps to +-qmax exactly.
        qb = q.abs().reshape(N, K // bs, bs).amax(dim=-1)
        assert bool((qb == QRANGE[bits][1]).all())
    else:
        qb = q.reshape(N, K // bs, bs)
        assert bool((qb.amin(dim=-1) == QRANGE[bits][0]).all())
        assert bool((qb.amax(dim=-1) == QRANGE[bits][1]).all())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_integer_representable_weights_round_trip_exactly(bits, symmetric, seeded):
    N, K, bs = 5, 64, 16
    qmin, qmax = QRANGE[bits]
    lo = -qmax if symmetric else qmin
    q = torch.randint(lo, qmax + 1, (N, K), generator=seeded)
    q = q.reshape(N, K // bs, bs)
    q[..., 0], q[..., 1] = qmax, lo  # every block spans the full range, so the scale is recovered
    q = q.reshape(N, K)
    scale = torch.tensor([0.5, 0.25, 2.0, 0.125, 1.0], dtype=torch.float64)[:, None]
    offset = torch.zeros(N, 1, dtype=torch.float64) if symmetric else \
        torch.tensor([-1.25, 0.5, 3.0, -0.0625, 7.5], dtype=torch.float64)[:, None]
    w = (q * scale + offset).to(torch.float32)
    qw = quantize_weight(w, bits=bits, block_size=bs, symmetric=symmetric)
    assert torch.equal(qw.int_values(), q.to(torch.int32))
    assert torch.equal(qw.dequantize(), w)
    assert torch.equal(qw.scale, scale.float().expand(N, K // bs))


@pytest.mark.parametrize("bits", [8, 4])
def test_zero_and_constant_blocks_have_no_nan(bits):
    w = torch.zeros(2, 32)
    w[1, 16:] = 3.7  # constant nonzero block
    sym = quantize_weight(w, bits=bits, block_size=16, symmetric=True)
    asym = quantize_weight(w, bits=bits, block_size=16, symmetric=False)
    for qw in (sym, asym):
        assert bool(torch.isfinite(qw.scale).all()) and bool(torch.isfinite(qw.offset).all())
    assert sym.scale[0, 0] == 1 and bool((sym.int_values()[0] == 0).all())
    assert torch.equal(asym.scale, torch.ones(2, 2))
    assert torch.equal(asym.offset, torch.tensor([[0.0, 0.0], [0.0, 3.7]]))
    assert bool((asym.int_values() == 0).all())
    assert torch.equal(asym.dequantize(), w)


def test_quantize_weight_rejects_nan():
    w = torch.ones(2, 32)
    w[1, 3] = float("nan")
    with pytest.raises(ValueError, match="w contains NaN"):
        quantize_weight(w, bits=8, block_size=32)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_quantize_weight_rejects_non_finite_weights(bad):
    w = torch.ones(2, 32, dtype=torch.float64)
    w[0, 7] = bad
    with pytest.raises(ValueError, match="^w contains NaN or Inf"):
        quantize_weight(w, bits=4, block_size=32)
    with pytest.raises(ValueError, match="^w contains NaN or Inf"):
        quantize_conv_weight(w.reshape(2, 8, 2, 2), bits=8)


@pytest.mark.parametrize("symmetric", [True, False])
def test_float64_weight_beyond_float32_range_is_rejected(symmetric):
    # Its float32 scale would be infinite (silently dequantizing to inf/nan).
    w = torch.ones(2, 32, dtype=torch.float64)
    w[1, 5] = 1e39
    with pytest.raises(ValueError, match="^w has values beyond the float32 range"):
        quantize_weight(w, bits=8, block_size=32, symmetric=symmetric)
    # The largest float32 still quantizes to a finite scale and offset.
    w[1, 5] = float(torch.finfo(torch.float32).max)
    qw = quantize_weight(w, bits=8, block_size=32, symmetric=symmetric)
    assert bool(torch.isfinite(qw.scale).all()) and bool(torch.isfinite(qw.offset).all())


@pytest.mark.parametrize("bits", [8.0, 4.0, True, "8", None])
def test_bits_must_be_an_int(bits):
    w = torch.randn(2, 32)
    with pytest.raises(TypeError, match="^bits must be an int"):
        quantize_weight(w, bits=bits, block_size=32)
    with pytest.raises(TypeError, match="^bits must be an int"):
        quantize_conv_weight(w.reshape(2, 8, 2, 2), bits=bits)
    qw = quantize_weight(w, bits=8, block_size=32)
    with pytest.raises(TypeError, match="^QuantizedWeight.bits must be an int"):
        QuantizedWeight(qw.qweight, qw.scale, qw.offset, bits, 32, 2, 32)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.uint8, torch.bool, torch.complex64,
                                   "float32", float])
def test_dequantize_needs_a_floating_dtype(dtype):
    qw = quantize_weight(torch.randn(2, 32), bits=4, block_size=32)
    with pytest.raises(TypeError, match="^dtype must be a floating torch.dtype"):
        qw.dequantize(dtype)
    for ok in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        assert qw.dequantize(ok).dtype == ok


def test_nbytes_and_to():
    qw = quantize_weight(torch.randn(6, 64), bits=4, block_size=32)
    assert qw.nbytes == 6 * 32 + 2 * (6 * 2 * 4)
    moved = qw.to("cpu")
    assert moved is not qw and torch.equal(moved.qweight, qw.qweight) and moved.device.type == "cpu"


def test_quantized_weight_checks_its_fields():
    qw = quantize_weight(torch.randn(4, 64), bits=8, block_size=32)
    with pytest.raises(ValueError, match="QuantizedWeight.scale"):
        QuantizedWeight(qw.qweight, qw.scale[:, :1], qw.offset, 8, 32, 4, 64)
    with pytest.raises(TypeError, match="QuantizedWeight.qweight"):
        QuantizedWeight(qw.qweight.to(torch.uint8), qw.scale, qw.offset, 8, 32, 4, 64)
    with pytest.raises(ValueError, match="block_size=48 does not divide K=64"):
        QuantizedWeight(qw.qweight, qw.scale, qw.offset, 8, 48, 4, 64)


# ---------------------------------------------------------------------------------------------
# conv weights
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
def test_conv_weight_layout_and_blocks(bits, seeded):
    Co, Ci, Kh, Kw = 3, 16, 3, 2
    w = torch.randn(Co, Ci, Kh, Kw, generator=seeded)
    qw = quantize_conv_weight(w, bits=bits, block_size=8, symmetric=False)
    assert qw.conv_shape == (Co, Kh, Kw, Ci) and (qw.N, qw.K) == (Co, Kh * Kw * Ci)
    assert qw.scale.shape == (Co, Kh * Kw * Ci // 8)
    # Stored [Co, Kh, Kw, Ci]: element (co, ci, kh, kw) sits at k = (kh * Kw + kw) * Ci + ci,
    # in group k // block_size; quantizing the permuted matrix directly gives the same integers.
    w_nk = w.permute(0, 2, 3, 1).reshape(Co, -1)
    ref = quantize_weight(w_nk, bits=bits, block_size=8, symmetric=False)
    assert torch.equal(qw.int_values(), ref.int_values())
    assert torch.equal(qw.scale, ref.scale) and torch.equal(qw.offset, ref.offset)
    deq = qw.dequantize()
    assert deq.shape == (Co, Ci, Kh, Kw)
    assert torch.equal(deq, ref.dequantize().reshape(Co, Kh, Kw, Ci).permute(0, 3, 1, 2))
    assert torch.equal(qw.dequantize(flat=True), ref.dequantize())
    co, ci, kh, kw = 2, 11, 1, 1
    k = (kh * Kw + kw) * Ci + ci
    step = float(qw.scale[co, k // 8])
    assert abs(float(w[co, ci, kh, kw]) - float(deq[co, ci, kh, kw])) <= step / 2 * (1 + 1e-6)


def test_conv_weight_per_channel_blocks_over_ci():
    qw = quantize_conv_weight(torch.randn(4, 8, 3, 3), bits=8, block_size=None)
    assert qw.block_size == 8 and qw.num_groups == 9
    with pytest.raises(ValueError, match=r"block_size=16 does not divide Kh\*Kw\*Ci=72"):
        quantize_conv_weight(torch.randn(4, 8, 3, 3), bits=8, block_size=16)


# ---------------------------------------------------------------------------------------------
# int4 packing
# ---------------------------------------------------------------------------------------------

def _words(packed: torch.Tensor) -> list[int]:
    """Little-endian 32-bit words of a uint8 row."""
    b = [int(v) for v in packed.flatten()]
    return [b[i] | b[i + 1] << 8 | b[i + 2] << 16 | b[i + 3] << 24 for i in range(0, len(b), 4)]


@pytest.mark.parametrize("order", ["interleaved", "low_first", "high_first"])
def test_pack_unpack_round_trip(order, seeded):
    q = torch.randint(-8, 8, (7, 48), generator=seeded)
    q[0, :16] = torch.arange(-8, 8)
    packed = pack_int4(q, order)
    assert packed.dtype == torch.uint8 and packed.shape == (7, 24)
    out = unpack_int4(packed, order)
    assert out.dtype == torch.int8 and torch.equal(out.long(), q)


@pytest.mark.parametrize("order, q, word", [
    # u = q + 8 = 0..7. low_first: byte j = u[2j] | u[2j+1] << 4.
    ("low_first", list(range(-8, 0)), 0x76543210),
    # high_first: byte j = u[2j] << 4 | u[2j+1] (CONV_FpAInt4B's ker >> 4 is the first element).
    ("high_first", list(range(-8, 0)), 0x67452301),
    # interleaved: nibble i holds element [0,2,4,6,1,3,5,7][i].
    ("interleaved", list(range(-8, 0)), 0x75316420),
    # u = 7..14 -> nibbles (7, 9, 11, 13, 8, 10, 12, 14) from nibble 0 up.
    ("interleaved", list(range(-1, 7)), 0xECA8DB97),
])
def test_hand_packed_words(order, q, word):
    packed = pack_int4(torch.tensor([q]), order)
    assert _words(packed) == [word]


def _lop3_converter(word: int) -> list[float]:
    """The lop3 int4 -> fp16 converter of document 001 on one 32-bit word, evaluated bit by bit.

    h[j] = ((j < 2 ? word : word >> 8) & (j even ? 0x000f000f : 0x00f000f0)) | 0x64006400;
    its two fp16 halves are output elements 2j (low) and 2j+1 (high). 0x6400 is fp16 1024 with
    an ulp of 1, so a nibble u in bits 0..3 reads as 1024 + u and in bits 4..7 as 1024 + 16u;
    subtracting 1024 + 8 (or scaling by 1/16 and subtracting 64 + 8) leaves q = u - 8.
    """
    out = []
    for j in range(4):
        src = word if j < 2 else word >> 8
        h = (src & (0x000F000F if j % 2 == 0 else 0x00F000F0)) | 0x64006400
        halves = torch.tensor([h & 0xFFFF, h >> 16], dtype=torch.int32).to(torch.int16).view(torch.float16)
        if j % 2 == 0:
            vals = halves - torch.tensor(1032.0, dtype=torch.float16)
        else:
            one_sixteenth = torch.tensor(1 / 16, dtype=torch.float16)
            vals = halves * one_sixteenth - torch.tensor(72.0, dtype=torch.float16)
        out += [float(v) for v in vals]
    return out


def test_interleaved_order_matches_lop3_converter(seeded):
    q = torch.randint(-8, 8, (3, 32), generator=seeded)
    q[0, :8] = torch.tensor([-8, 7, -1, 0, 3, -5, 6, -2])
    packed = pack_int4(q, "interleaved")
    for row in range(q.shape[0]):
        converted = [v for word in _words(packed[row]) for v in _lop3_converter(word)]
        assert converted == [float(v) for v in q[row]]
    assert INT4_INTERLEAVE == (0, 2, 4, 6, 1, 3, 5, 7)


def test_int4_weights_store_interleaved_nibbles(seeded):
    w = torch.randn(3, 32, generator=seeded)
    qw = quantize_weight(w, bits=4, block_size=32)
    assert qw.qweight.shape == (3, 16) and qw.qweight.dtype == torch.uint8
    assert torch.equal(unpack_int4(qw.qweight, "interleaved").int(), qw.int_values())
    assert not torch.equal(unpack_int4(qw.qweight, "low_first").int(), qw.int_values())


def test_pack_rejects_out_of_range_and_bad_k():
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([[8, 0, 0, 0, 0, 0, 0, 0]]), "low_first")
    with pytest.raises(ValueError, match="K % 8 == 0"):
        pack_int4(torch.zeros(2, 12, dtype=torch.int8), "interleaved")
    with pytest.raises(ValueError, match="order"):
        pack_int4(torch.zeros(2, 8, dtype=torch.int8), "middle_first")


# ---------------------------------------------------------------------------------------------
# zero point <-> offset
# ---------------------------------------------------------------------------------------------

def test_zero_point_offset_conversion(seeded):
    scale = torch.tensor([0.5, 0.25])
    offset = torch.tensor([-2.0, 1.0])
    assert torch.equal(offset_to_zero_point(offset, scale), torch.tensor([4.0, -4.0]))
    assert torch.equal(zero_point_to_offset(torch.tensor([4.0, -4.0]), scale), offset)
    qw = quantize_weight(torch.randn(5, 64, generator=seeded), bits=8, block_size=32, symmetric=False)
    z = qw.zero_point().double()
    q = qw.int_values().double().reshape(5, 2, 32)
    deq_zp = (qw.scale.double()[..., None] * (q - z[..., None])).reshape(5, 64)
    torch.testing.assert_close(deq_zp, _deq64(qw), rtol=1e-6, atol=1e-6)
    sym = quantize_weight(torch.randn(5, 64, generator=seeded), bits=8, block_size=32)
    assert bool((sym.zero_point() == 0).all())


# ---------------------------------------------------------------------------------------------
# QuantA
# ---------------------------------------------------------------------------------------------

def test_quant_a_hand_example():
    # Row 0: min 0, max 255 -> scale 1, offset 255 - 127 = 128; ties round half to even.
    # Row 1: a zero-range block -> scale 1, offset = max, q = 0.
    x = torch.tensor([[0.0, 255.0, 128.0, 127.5, 128.5, 129.5, 126.5, 10.0],
                      [3.25] * 8])
    A_q, scale, offset, sum_q = quantize_activation_reference(x, 8)
    assert A_q.dtype == torch.int8 and sum_q.dtype == torch.int32
    assert scale.dtype == offset.dtype == torch.float32
    assert A_q.tolist() == [[-128, 127, 0, 0, 0, 2, -2, -118], [0] * 8]
    assert scale.tolist() == [[1.0], [1.0]] and offset.tolist() == [[128.0], [3.25]]
    assert sum_q.tolist() == [[-119], [0]]


def test_quant_a_zero_range_block_reconstructs_exactly(seeded):
    x = torch.randn(3, 64, generator=seeded)
    x[1, 32:] = -0.3
    x[2, :32] = 0.0
    A_q, scale, offset, sum_q = quantize_activation_reference(x, 32)
    for t in (scale, offset):
        assert bool(torch.isfinite(t).all())
    rec = A_q.float().reshape(3, 2, 32) * scale[..., None] + offset[..., None]
    assert torch.equal(rec[1, 1], x[1, 32:]) and torch.equal(rec[2, 0], x[2, :32])
    assert sum_q[1, 1] == 0 and sum_q[2, 0] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quant_a_reconstruction_bound(dtype, seeded):
    M, K, bs = 17, 256, 64
    x = (torch.randn(M, K, generator=seeded) * 4 - 1).to(dtype)
    A_q, scale, offset, sum_q = quantize_activation_reference(x, bs)
    assert A_q.shape == (M, K) and scale.shape == offset.shape == sum_q.shape == (M, K // bs)
    assert torch.equal(sum_q, A_q.int().reshape(M, -1, bs).sum(-1, dtype=torch.int32))
    qb = A_q.reshape(M, -1, bs)
    assert bool((qb.amin(-1) == -128).all()) and bool((qb.amax(-1) == 127).all())
    rec = A_q.double().reshape(M, -1, bs) * scale.double()[..., None] + offset.double()[..., None]
    err = (rec.reshape(M, K) - x.double()).abs()
    # Half a step, plus float32 rounding in computing offset and (x - offset) / scale.
    bound = _per_element(scale.double(), bs) * (0.5 + 1e-4) + 4 * FLOAT32_EPS * x.double().abs().max()
    assert bool((err <= bound).all())


def test_quant_a_block_size_must_divide_k():
    with pytest.raises(ValueError, match="block_size=48 does not divide K=4160"):
        quantize_activation_reference(torch.zeros(2, 4160), 48)


# ---------------------------------------------------------------------------------------------
# requant parameters
# ---------------------------------------------------------------------------------------------

def test_requant_params_hand_example():
    W_q = torch.tensor([[1, 2, 3], [-4, 5, -6]], dtype=torch.int8)  # row sums 6, -5
    M, fused_bias = requant_params(S_I=0.5, Z_I=3, S_W=torch.tensor([0.25, 0.125]), W_q=W_q,
                                   B_fp=torch.tensor([1.0, -2.0]), S_O=0.0625, Z_O=-5)
    # M = S_I * S_W / S_O; FusedBias = -Z_I * sum W_q + B / (S_I * S_W) + Z_O / M.
    assert M.dtype == fused_bias.dtype == torch.float32
    assert M.tolist() == [2.0, 1.0]
    assert fused_bias.tolist() == [-3 * 6 + 1.0 / 0.125 - 5 / 2.0, -3 * -5 + -2.0 / 0.0625 - 5 / 1.0]
    M2, fb2 = requant_params(0.5, 0, 0.25, W_q, None, 0.125, 0)
    assert M2.tolist() == [1.0, 1.0] and fb2.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="S_W"):
        requant_params(0.5, 0, torch.ones(3), W_q, None, 0.125, 0)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size", [None, 32])
def test_quantize_weight_of_a_transposed_view(bits, block_size):
    """A non-contiguous w (a transposed view) quantizes to a contiguous qweight equal to that of w.contiguous()."""
    w = torch.randn(128, 64, generator=torch.Generator().manual_seed(3)).t()
    qw = quantize_weight(w, bits=bits, block_size=block_size)
    ref = quantize_weight(w.contiguous(), bits=bits, block_size=block_size)
    assert qw.qweight.is_contiguous()
    assert torch.equal(qw.qweight, ref.qweight) and torch.equal(qw.scale, ref.scale)
    assert torch.equal(qw.offset, ref.offset)
