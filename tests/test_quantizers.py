"""Quantization methods (issue 22): format validity, never worse than minmax, GPTQ vs a textbook loop (CPU)."""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight
from cutlass_ops.quantizers import METHODS

QRANGE = {8: (-128, 127), 4: (-8, 7)}
CALIBRATED = [name for name, m in METHODS.items() if m.needs_calibration]
FREE = [name for name, m in METHODS.items() if not m.needs_calibration]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: one thread is faster than contending for a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _weights(kind: str, N: int, K: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(N, K, generator=g) * 0.05 + 0.01
    # Student-t with 3 degrees of freedom: heavy tails, a few large weights per block.
    z = torch.randn(N, K, generator=g, dtype=torch.float64)
    chi2 = torch.randn(N, K, 3, generator=g, dtype=torch.float64).pow(2).sum(-1)
    return (z / (chi2 / 3).sqrt() * 0.02).float()


def _calibration(K: int, M: int = 256, dominant: int = 0, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(M, K, generator=g)
    if dominant:
        X[:, torch.randperm(K, generator=g)[:dominant]] *= 25
    return X


def _deq64(qw: QuantizedWeight) -> torch.Tensor:
    q = qw.int_values().double().reshape(qw.N, qw.num_groups, qw.block_size)
    return (q * qw.scale.double()[..., None] + qw.offset.double()[..., None]).reshape(qw.N, qw.K)


def _quantize(W, method, bits, block_size, symmetric, X=None, options=None):
    return quantize_weight(W, bits=bits, block_size=block_size, symmetric=symmetric, method=method,
                           calibration=X if method in CALIBRATED else None, options=options)


def _output_error(W, qw, X) -> float:
    E = W.double() - _deq64(qw)
    return float((X.double() @ E.T).pow(2).sum())


# ---------------------------------------------------------------------------------------------
# every method: a valid QuantizedWeight, never worse than minmax
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_output_is_a_valid_quantized_weight(method, bits, symmetric):
    N, K, bs = 12, 128, 32
    W = _weights("student_t", N, K)
    W[2, :32] = 0.0  # an all-zero block
    W[3, 32:64] = 0.7  # a constant block
    qw = _quantize(W, method, bits, bs, symmetric, _calibration(K, 64))
    qw.validate()
    assert (qw.bits, qw.block_size, qw.N, qw.K, qw.symmetric) == (bits, bs, N, K, symmetric)
    q = qw.int_values()
    assert QRANGE[bits][0] <= int(q.min()) and int(q.max()) <= QRANGE[bits][1]
    assert bool((qw.scale > 0).all()) and bool(torch.isfinite(qw.scale).all())
    assert bool(torch.isfinite(qw.offset).all())
    if symmetric:
        assert bool((qw.offset == 0).all())
    deq = qw.dequantize()
    assert bool((deq[2, :32] == 0).all())
    assert torch.allclose(deq[3, 32:64], torch.full((32,), 0.7), atol=1e-6)


@pytest.mark.parametrize("method", [m for m in FREE if m != "minmax"])
@pytest.mark.parametrize("kind", ["normal", "student_t"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_calibration_free_methods_never_worse_than_minmax(method, kind, bits, symmetric):
    W = _weights(kind, 24, 256)
    base = _quantize(W, "minmax", bits, 64, symmetric)
    qw = _quantize(W, method, bits, 64, symmetric)
    err = (W.double() - _deq64(qw)).pow(2).reshape(24, 4, 64).sum(-1)
    err0 = (W.double() - _deq64(base)).pow(2).reshape(24, 4, 64).sum(-1)
    assert bool((err <= err0).all())  # block by block, not only in total
    if bits == 4:
        assert float(err.sum()) < 0.97 * float(err0.sum())  # and a real gain at int4


@pytest.mark.parametrize("method", CALIBRATED)
@pytest.mark.parametrize("kind", ["normal", "student_t"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_calibrated_methods_never_worse_than_minmax_on_the_outputs(method, kind, bits, symmetric):
    W, X = _weights(kind, 24, 256), _calibration(256, 128, dominant=4)
    base = _quantize(W, "minmax", bits, 64, symmetric)
    qw = _quantize(W, method, bits, 64, symmetric, X)
    assert _output_error(W, qw, X) < _output_error(W, base, X)


def test_minmax_is_the_default_and_unchanged():
    W = _weights("normal", 8, 128)
    a = quantize_weight(W, bits=4, block_size=32, symmetric=False)
    b = quantize_weight(W, bits=4, block_size=32, symmetric=False, method="minmax")
    assert torch.equal(a.qweight, b.qweight) and torch.equal(a.scale, b.scale)
    assert torch.equal(a.offset, b.offset)


def test_conv_weight_accepts_a_method():
    w = torch.randn(8, 32, 3, 3, generator=torch.Generator().manual_seed(0))
    base = quantize_conv_weight(w, bits=4, block_size=16)
    qw = quantize_conv_weight(w, bits=4, block_size=16, method="mse")
    assert qw.conv_shape == base.conv_shape and qw.scale.shape == base.scale.shape
    assert float((qw.dequantize() - w).pow(2).sum()) < float((base.dequantize() - w).pow(2).sum())


# ---------------------------------------------------------------------------------------------
# the activation-aware search
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("symmetric", [True, False])
def test_imatrix_lowers_the_output_error_on_dominant_channels(symmetric):
    W, X = _weights("normal", 32, 256), _calibration(256, 256, dominant=3)
    plain = _quantize(W, "mse", 4, 128, symmetric)
    aware = _quantize(W, "imatrix", 4, 128, symmetric, X)
    assert _output_error(W, aware, X) < 0.8 * _output_error(W, plain, X)


def test_mse_balanced_uses_small_weight_columns_as_important_inputs():
    # A layer whose large inputs meet small weight columns (x_k * w_nk balanced, as after a
    # LayerNorm with large gains): the data-free weighting finds those channels from W alone.
    g = torch.Generator().manual_seed(7)
    gain = torch.ones(256)
    gain[torch.randperm(256, generator=g)[:16]] = 10.0
    W = torch.randn(32, 256, generator=g) * 0.05 / gain
    X = torch.randn(256, 256, generator=g) * gain
    for symmetric, gain_at_least in ((True, 0.05), (False, 0.2)):
        plain = _quantize(W, "mse", 4, 128, symmetric)
        balanced = _quantize(W, "mse_balanced", 4, 128, symmetric)
        assert _output_error(W, balanced, X) < (1 - gain_at_least) * _output_error(W, plain, X)


# ---------------------------------------------------------------------------------------------
# GPTQ against a float64 textbook loop
# ---------------------------------------------------------------------------------------------

def _textbook_gptq(W, X, scale, offset, block_size, bits, act_order, damp=0.01):
    """GPTQ/OBQ as written in the paper: one column at a time, updating the inverse Hessian by
    Gaussian elimination of the quantized column; then, per row, keep GPTQ or plain rounding
    (same scale and offset), whichever has the lower output error e^T H e."""
    qmin, qmax = QRANGE[bits]
    W = W.double().clone()
    N, K = W.shape
    H = X.double().T @ X.double() / X.shape[0]
    s = scale.double().repeat_interleave(block_size, dim=1)
    o = offset.double().repeat_interleave(block_size, dim=1)
    order = sorted(range(K), key=lambda k: -float(H[k, k])) if act_order else list(range(K))
    H_damped = H + damp * torch.diagonal(H).mean() * torch.eye(K, dtype=torch.float64)
    H_inv = torch.linalg.inv(H_damped[order][:, order])
    Wp, sp, op = W[:, order], s[:, order], o[:, order]
    Q = torch.zeros_like(Wp)
    for k in range(K):
        Q[:, k] = torch.round((Wp[:, k] - op[:, k]) / sp[:, k]).clamp(qmin, qmax)
        err = (Wp[:, k] - (Q[:, k] * sp[:, k] + op[:, k])) / H_inv[k, k]
        Wp[:, k:] -= err[:, None] * H_inv[k, k:][None, :]
        H_inv = H_inv - H_inv[:, k:k + 1] @ H_inv[k:k + 1, :] / H_inv[k, k]
    Q_natural = torch.empty_like(Q)
    Q_natural[:, order] = Q
    Q_rtn = torch.round((W - o) / s).clamp(qmin, qmax)
    def row_errors(q):
        E = W - (q * s + o)
        return ((E @ H) * E).sum(1)
    keep = row_errors(Q_natural) <= row_errors(Q_rtn)
    return torch.where(keep[:, None], Q_natural, Q_rtn).to(torch.int32), keep


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("bits, symmetric", [(4, True), (4, False), (8, False)])
def test_gptq_matches_textbook_loop(act_order, bits, symmetric):
    N, K, bs = 10, 192, 32  # K > 128: the lazy batches of 128 columns are crossed
    W = _weights("normal", N, K)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(300, K, generator=g) @ (torch.eye(K) + 0.3 * torch.randn(K, K, generator=g))
    X[:, :5] *= 4
    qw = quantize_weight(W, bits=bits, block_size=bs, symmetric=symmetric, method="gptq",
                         calibration=X, options={"act_order": act_order})
    Q, keep = _textbook_gptq(W, X, qw.scale, qw.offset, bs, bits, act_order)
    assert int(keep.sum()) >= N - 1  # GPTQ itself, not the rounding fallback, is what is compared
    assert torch.equal(qw.int_values(), Q)


def test_gptq_act_order_keeps_natural_k_order_and_contiguous_blocks():
    N, K, bs = 16, 256, 64
    W = _weights("normal", N, K)
    X = _calibration(K, 1024)
    X *= torch.linspace(0.2, 5.0, K).flip(0)[torch.randperm(K, generator=torch.Generator().manual_seed(5))]
    plain = quantize_weight(W, bits=4, block_size=bs, method="gptq", calibration=X)
    ordered = quantize_weight(W, bits=4, block_size=bs, method="gptq", calibration=X,
                              options={"act_order": True})
    # The groups are the natural contiguous K blocks, fixed before the loop: the same scales.
    assert torch.equal(ordered.scale, plain.scale) and torch.equal(ordered.offset, plain.offset)
    assert (ordered.N, ordered.K, ordered.num_groups) == (N, K, K // bs)
    deq = ordered.dequantize()
    # Natural order: each element dequantizes near its own weight (the error feedback moves an
    # element by a few steps at most; in a permuted order it would be as far as unrelated weights).
    steps = ((deq - W).abs() / ordered.scale.repeat_interleave(bs, dim=1))
    assert float(steps.max()) < 8 and float(steps.mean()) < 0.6
    rtn = quantize_weight(W, bits=4, block_size=bs)
    assert float((deq - W).norm()) < 2 * float((rtn.dequantize() - W).norm())
    assert _output_error(W, ordered, X) < _output_error(W, rtn, X)


# ---------------------------------------------------------------------------------------------
# argument errors
# ---------------------------------------------------------------------------------------------

def test_method_argument_errors():
    W = torch.randn(4, 128)
    with pytest.raises(ValueError, match="method must be one of .*'gptq'.*got 'awq'"):
        quantize_weight(W, method="awq")
    with pytest.raises(TypeError, match="method must be a str"):
        quantize_weight(W, method=None)
    with pytest.raises(ValueError, match="method='gptq' needs calibration"):
        quantize_weight(W, method="gptq")
    with pytest.raises(ValueError, match="method='imatrix' needs calibration"):
        quantize_weight(W, method="imatrix")
    with pytest.raises(ValueError, match="calibration .*method='mse' ignores it"):
        quantize_weight(W, method="mse", calibration=torch.randn(8, 128))
    with pytest.raises(ValueError, match="calibration must have shape \\[\\*, K=128\\]"):
        quantize_weight(W, method="gptq", calibration=torch.randn(8, 32))
    with pytest.raises(TypeError, match="calibration must have a floating dtype"):
        quantize_weight(W, method="gptq", calibration=torch.ones(8, 128, dtype=torch.int32))
    bad = torch.randn(8, 128)
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="calibration contains NaN or Inf"):
        quantize_weight(W, method="imatrix", calibration=bad)
    with pytest.raises(ValueError, match="options: method='mse' takes .*got 'act_order'"):
        quantize_weight(W, method="mse", options={"act_order": True})
    with pytest.raises(TypeError, match="options\\['act_order'\\] must be a bool"):
        quantize_weight(W, method="gptq", calibration=torch.randn(8, 128), options={"act_order": 1})
    with pytest.raises(ValueError, match="options: method='minmax' takes no options"):
        quantize_weight(W, options={"steps": 3})
