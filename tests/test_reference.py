"""float64 references against naive Python loops on tiny shapes; scheme 2 two ways (CPU)."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.formats import (
    quantize_activation_reference, quantize_conv_weight, quantize_weight, requant_params,
)
from cutlass_ops.reference import (
    apply_activation, conv2d_reference, int8_gemm_reference, linear_reference, requant_gemm_reference,
    w8a8_dequant_reference, w8a8_kblock_reference,
)


def _act(v: float, act: str | None) -> float:
    if act == "relu":
        return max(v, 0.0)
    if act == "relu6":
        return min(max(v, 0.0), 6.0)
    return v


def _naive_weight(qw, n: int, k: int) -> float:
    """w[n, k] = q * scale + offset of the stored [N, K] matrix, read element by element."""
    q = int(qw.int_values()[n, k])
    g = k // qw.block_size
    return q * float(qw.scale[n, g]) + float(qw.offset[n, g])


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("act", [None, "relu", "relu6"])
def test_linear_reference_matches_loops(bits, act, seeded):
    N, K, bs = 5, 32, 16
    x = torch.randn(2, 3, K, generator=seeded) * 2
    qw = quantize_weight(torch.randn(N, K, generator=seeded), bits=bits, block_size=bs, symmetric=False)
    bias = torch.randn(N, generator=seeded)
    y = linear_reference(x, qw, bias, act)
    assert y.dtype == torch.float64 and y.shape == (2, 3, N)
    W = [[_naive_weight(qw, n, k) for k in range(K)] for n in range(N)]
    xs = x.double().reshape(-1, K).tolist()
    for m, row in enumerate(xs):
        for n in range(N):
            v = sum(row[k] * W[n][k] for k in range(K)) + float(bias[n])
            assert abs(float(y.reshape(-1, N)[m, n]) - _act(v, act)) <= 1e-12 * (1 + abs(v))


def _naive_conv(x, qw, bias, stride, padding, dilation, act):
    """Direct convolution with the weight read from the stored [Co, Kh, Kw, Ci] layout."""
    B, Ci, H, W = x.shape
    Co, Kh, Kw, _ = qw.conv_shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    Oh = (H + 2 * ph - dh * (Kh - 1) - 1) // sh + 1
    Ow = (W + 2 * pw - dw * (Kw - 1) - 1) // sw + 1
    xl = x.double().tolist()
    Wk = [[_naive_weight(qw, co, k) for k in range(qw.K)] for co in range(Co)]
    out = torch.zeros(B, Co, Oh, Ow, dtype=torch.float64)
    for b in range(B):
        for co in range(Co):
            for oy in range(Oh):
                for ox in range(Ow):
                    acc = 0.0 if bias is None else float(bias[co])
                    for fy in range(Kh):
                        iy = oy * sh - ph + fy * dh
                        if not 0 <= iy < H:
                            continue
                        for fx in range(Kw):
                            ix = ox * sw - pw + fx * dw
                            if not 0 <= ix < W:
                                continue
                            for ci in range(Ci):
                                acc += xl[b][ci][iy][ix] * Wk[co][(fy * Kw + fx) * Ci + ci]
                    out[b, co, oy, ox] = _act(acc, act)
    return out


@pytest.mark.parametrize("kernel, stride, padding, dilation, bits, use_bias, act", [
    ((1, 1), 1, 0, 1, 8, True, None),
    ((1, 1), 2, 0, 1, 4, False, "relu"),
    ((3, 3), 1, 1, 1, 8, True, "relu6"),
    ((3, 3), 2, 1, 1, 4, True, None),
    ((3, 3), 1, 0, 2, 8, False, "relu6"),
    ((3, 3), (2, 1), (1, 0), 2, 4, True, "relu6"),
])
def test_conv2d_reference_matches_loops(kernel, stride, padding, dilation, bits, use_bias, act, seeded):
    B, Ci, Co, H, W = 2, 8, 3, 7, 6
    x = torch.randn(B, Ci, H, W, generator=seeded) * 2
    qw = quantize_conv_weight(torch.randn(Co, Ci, *kernel, generator=seeded), bits=bits, block_size=4,
                              symmetric=False)
    bias = torch.randn(Co, generator=seeded) if use_bias else None
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    y = conv2d_reference(x, qw, bias, stride, padding, dilation, act)
    ref = _naive_conv(x, qw, bias, pair(stride), pair(padding), pair(dilation), act)
    assert y.dtype == torch.float64 and y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    if act == "relu6":
        assert float(y.max()) <= 6.0 and float(y.min()) >= 0.0


def test_int8_gemm_reference_exact(seeded):
    M, N, K = 3, 5, 17
    A = torch.randint(-128, 128, (M, K), generator=seeded, dtype=torch.int8)
    B = torch.randint(-128, 128, (N, K), generator=seeded, dtype=torch.int8)
    A[0] = -128
    B[0] = -128  # the largest product sum: 17 * 2^14
    C = int8_gemm_reference(A, B)
    assert C.dtype == torch.int32 and C.shape == (M, N)
    Al, Bl = A.tolist(), B.tolist()
    assert C.tolist() == [[sum(a * b for a, b in zip(Al[m], Bl[n])) for n in range(N)] for m in range(M)]
    assert int(C[0, 0]) == 17 * 128 * 128


def test_int8_gemm_reference_refuses_int32_overflow():
    A = torch.full((1, 131073), -128, dtype=torch.int8)
    with pytest.raises(ValueError, match="overflows int32"):
        int8_gemm_reference(A, A)


def test_requant_reference_matches_loops_and_float_path(seeded):
    M_, N, K = 4, 6, 24
    S_I, Z_I, S_O, Z_O = 0.05, 3, 0.4, -7
    A_q = torch.randint(-128, 128, (M_, K), generator=seeded, dtype=torch.int8)
    W_q = torch.randint(-127, 128, (N, K), generator=seeded, dtype=torch.int8)
    S_W = torch.rand(N, generator=seeded, dtype=torch.float64) * 0.02 + 0.01
    B_fp = torch.randn(N, generator=seeded, dtype=torch.float64)
    M, fused_bias = requant_params(S_I, Z_I, S_W, W_q, B_fp, S_O, Z_O)
    out = requant_gemm_reference(A_q, W_q, M, fused_bias)
    assert out.dtype == torch.int8 and out.shape == (M_, N)
    Al, Wl = A_q.tolist(), W_q.tolist()
    for m in range(M_):
        for n in range(N):
            acc = sum(a * w for a, w in zip(Al[m], Wl[n]))
            v = round(float(M[n]) * (acc + float(fused_bias[n])))  # Python round: half to even
            assert int(out[m, n]) == min(max(v, -128), 127)
    # The fused form is the dequantize -> float GEMM + bias -> quantize pipeline (up to the
    # float32 storage of M and FusedBias, i.e. at most one step of rounding).
    O_fp = (S_I * (A_q.double() - Z_I)) @ (S_W[:, None] * W_q.double()).T + B_fp
    direct = torch.round(O_fp / S_O + Z_O).clamp(-128, 127)
    assert int((direct - out.double()).abs().max()) <= 1
    clamped = requant_gemm_reference(A_q, W_q, M, fused_bias, clamp_min=-10, clamp_max=10)
    assert int(clamped.min()) >= -10 and int(clamped.max()) <= 10


@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("a_block, w_block, symmetric", [
    (64, 64, True), (128, 128, False), (32, 128, False), (128, 32, True),
])
def test_scheme2_block_formula_equals_dequantize_then_matmul(M, a_block, w_block, symmetric, seeded):
    N, K = 7, 256
    x = torch.randn(M, K, generator=seeded) * 3 + 0.5
    qw = quantize_weight(torch.randn(N, K, generator=seeded), bits=8, block_size=w_block, symmetric=symmetric)
    bias = torch.randn(N, generator=seeded)
    c4 = w8a8_kblock_reference(x, qw, a_block, bias, "relu6")
    cd = w8a8_dequant_reference(x, qw, a_block, bias, "relu6")
    assert c4.dtype == cd.dtype == torch.float64 and c4.shape == (M, N)
    torch.testing.assert_close(c4, cd, rtol=1e-12, atol=1e-12)
    raw = w8a8_kblock_reference(x, qw, a_block)
    torch.testing.assert_close(raw, w8a8_dequant_reference(x, qw, a_block), rtol=1e-12, atol=1e-12)
    # Against the weight-only result: the only difference is the activation rounding, at most
    # half a QuantA step per element: |C - x W^T| <= sum_k |W[n,k]| * sA[m, k // a_block] / 2.
    _, sA, _, _ = quantize_activation_reference(x, a_block)
    W = qw.dequantize(torch.float64)
    half_step = sA.double().repeat_interleave(a_block, dim=1) / 2
    bound = (half_step * (1 + 1e-3) + 1e-6 * x.abs().max()) @ W.abs().T
    assert bool(((raw - linear_reference(x, qw)).abs() <= bound).all())


def test_scheme2_default_block_and_leading_dims(seeded):
    x = torch.randn(2, 3, 64, generator=seeded)
    qw = quantize_weight(torch.randn(5, 64, generator=seeded), bits=8, block_size=32)
    y = w8a8_kblock_reference(x, qw)
    assert y.shape == (2, 3, 5)
    assert torch.equal(y.reshape(6, 5), w8a8_kblock_reference(x.reshape(6, 64), qw, 32))
    with pytest.raises(ValueError, match="block_size=48"):
        w8a8_kblock_reference(x, qw, 48)


def test_activation_codes_match_names():
    y = torch.tensor([-2.0, 0.5, 7.0], dtype=torch.float64)
    for code, name in ((0, None), (1, "relu"), (2, "relu6")):
        assert torch.equal(apply_activation(y, code), apply_activation(y, name))
    assert apply_activation(y, "relu6").tolist() == [0.0, 0.5, 6.0]
    assert apply_activation(y, "relu").tolist() == [0.0, 0.5, 7.0]
    with pytest.raises(ValueError, match="activation"):
        apply_activation(y, "gelu")
