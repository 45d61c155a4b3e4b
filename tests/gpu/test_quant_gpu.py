"""Scheme 2 helpers on the GPU: QuantA (bit-exact), SumBq (exact), DequantAndAcc + BiasAndActivation.

QuantA is compared bit for bit with formats.quantize_activation_reference (float32, one
rounding per operation, round half to even). The 4-term accumulation is compared with the
float64 reference.w8a8_kblock_reference under a bound derived from fp32 evaluation: each
block's 4-term value takes about 6 roundings of magnitude <= mag_i, the G atomic additions
one each, so |err| <= (8 + G) 2^-24 sum_i mag_i, plus one output rounding (and, for fp16/bf16
accumulators, G roundings of the running sum).
"""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.formats import quantize_activation_reference, quantize_weight
from cutlass_ops.w8a8.epilogue import bias_and_activation_gpu, dequant_and_acc_gpu
from cutlass_ops.w8a8.quant_a import quantize_activation_block_gpu, quantize_activation_gpu, sum_bq_gpu
from cutlass_ops.reference import w8a8_kblock_reference

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
# (block_size, number of blocks): K = block_size * G, ragged multiples of each block size.
BLOCKS = [(32, 7), (64, 3), (128, 5), (256, 2)]


def _activations(M: int, K: int, block_size: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * 3
    x[:, ::17] *= 25  # outliers
    if K // block_size >= 2:
        x[:, block_size:2 * block_size] = 0.375  # a constant (zero-range) block in every row
    x[0, :block_size] = 0.0  # an all-zero block
    return x.to(dtype)


def _assert_same(got: tuple, ref: tuple) -> None:
    for name, a, b in zip(("A_q", "scale", "offset", "sum_q"), got, ref):
        a = a.cpu()
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if not torch.equal(a, b):
            bad = (a != b).nonzero()[:5].tolist()
            raise AssertionError(f"{name} differs at {bad}: got {[a[tuple(i)].item() for i in bad]}, "
                                 f"expected {[b[tuple(i)].item() for i in bad]}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size, G", BLOCKS)
@pytest.mark.parametrize("M", [1, 3, 17, 127])
def test_quant_a_bit_exact(M, block_size, G, dtype):
    x = _activations(M, block_size * G, block_size, dtype)
    ref = quantize_activation_reference(x, block_size)
    got = quantize_activation_gpu(x.cuda(), block_size)
    _assert_same(got, ref)
    scale, offset = got[1].cpu(), got[2].cpu()
    assert torch.isfinite(scale).all() and torch.isfinite(offset).all()
    if G >= 2:  # the constant block: scale 1, offset = the constant, q = 0
        assert (scale[:, 1] == 1).all() and (offset[:, 1] == 0.375).all()
        assert (got[0][:, block_size:2 * block_size] == 0).all() and (got[3][:, 1] == 0).all()
    assert scale[0, 0] == 1 and offset[0, 0] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 17, 130])
def test_quant_a_planes_hold_the_same_values(M, dtype):
    """The planes layout of the fused Hopper kernel: [G, 3, M rounded up to 4] = scale, offset and
    sum_q's int32 bits, bit-identical to the [M, G] outputs; A_q identical too."""
    from cutlass_ops.w8a8.quant_a import quantize_activation_planes_gpu

    block_size, G = 64, 3
    x = _activations(M, block_size * G, block_size, dtype).cuda()
    A_q, scale, offset, sum_q = quantize_activation_gpu(x, block_size)
    A_q2, planes = quantize_activation_planes_gpu(x, block_size)
    assert planes.shape == (G, 3, -(-M // 4) * 4) and planes.dtype == torch.float32
    assert torch.equal(A_q2, A_q)
    assert torch.equal(planes[:, 0, :M], scale.t()) and torch.equal(planes[:, 1, :M], offset.t())
    assert torch.equal(planes[:, 2, :M].contiguous().view(torch.int32), sum_q.t())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K", [1000, 1024, 1040, 3000])  # one warp per row up to 1024, a block per row above
def test_quant_a_one_block_per_row(dtype, K):
    x = _activations(3, K, K, dtype)  # block_size None: G = 1 (1000, 1040: K not a multiple of 32)
    _assert_same(quantize_activation_gpu(x.cuda(), None), quantize_activation_reference(x, None))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quant_a_many_rows_and_blocks(dtype):
    """Enough (row, block) items that the warp-per-item launch spans many thread blocks, with a
    ragged last one (M * G not a multiple of 8)."""
    x = _activations(1001, 128 * 9, 128, dtype, seed=3)
    _assert_same(quantize_activation_gpu(x.cuda(), 128), quantize_activation_reference(x, 128))


@pytest.mark.parametrize("params_2d", [True, False], ids=["params_MxG", "params_M"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quant_a_block_variant_on_strided_rows(dtype, params_2d):
    M, block_size, G = 17, 64, 3
    K = block_size * G
    wide = torch.randn(M, K + 24, dtype=torch.float32).to(dtype)
    wide[:, 8:8 + K] = _activations(M, K, block_size, dtype)
    x = wide[:, 8:8 + K]  # row stride K + 24, not contiguous
    A_q_ref, s_ref, o_ref, q_ref = quantize_activation_reference(x, block_size)
    xg = wide.cuda()[:, 8:8 + K]
    A_q = torch.full((M, block_size + 5), 99, dtype=torch.int8, device="cuda")[:, :block_size]
    shape = (M, G) if params_2d else (M,)
    scale = torch.full(shape, float("nan"), device="cuda")
    offset = torch.full(shape, float("nan"), device="cuda")
    sum_q = torch.full(shape, -7, dtype=torch.int32, device="cuda")
    for g in range(G):
        quantize_activation_block_gpu(xg, g * block_size, block_size, A_q, scale, offset, sum_q)
        assert torch.equal(A_q.cpu(), A_q_ref[:, g * block_size:(g + 1) * block_size]), g
        if not params_2d:
            assert torch.equal(scale.cpu(), s_ref[:, g]) and torch.equal(offset.cpu(), o_ref[:, g])
            assert torch.equal(sum_q.cpu(), q_ref[:, g])
    if params_2d:
        assert torch.equal(scale.cpu(), s_ref) and torch.equal(offset.cpu(), o_ref)
        assert torch.equal(sum_q.cpu(), q_ref)


def test_quant_a_block_variant_rejects_out_of_range():
    x = torch.zeros(4, 64, device="cuda")
    A_q = torch.empty(4, 32, dtype=torch.int8, device="cuda")
    p = torch.empty(4, device="cuda")
    with pytest.raises(ValueError, match="k_start"):
        quantize_activation_block_gpu(x, 48, 32, A_q, p, p, torch.empty(4, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="sum_q"):
        quantize_activation_block_gpu(x, 0, 32, A_q, p, p, p)


@pytest.mark.parametrize("N, block_size, G", [(1, 32, 3), (17, 64, 5), (130, 128, 2), (5, 4096, 1)])
def test_sum_bq_exact(N, block_size, G):
    K = block_size * G
    g = torch.Generator().manual_seed(N)
    qweight = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    qweight[0, :block_size] = -128  # extreme block
    expected = qweight.to(torch.int32).reshape(N, G, block_size).sum(-1, dtype=torch.int32)
    assert torch.equal(sum_bq_gpu(qweight.cuda(), block_size).cpu(), expected)
    # rows that start at odd addresses take the byte-wise path
    wide = torch.zeros(N, K + 3, dtype=torch.int8)
    wide[:, 1:1 + K] = qweight
    assert torch.equal(sum_bq_gpu(wide.cuda()[:, 1:1 + K], block_size).cpu(), expected)


def _scheme2_problem(M=17, N=40, block_size=64, G=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    K = block_size * G
    x = torch.randn(M, K, generator=g) * 2
    w = torch.randn(N, K, generator=g) * 0.1 + 0.02
    qw = quantize_weight(w, bits=8, block_size=block_size, symmetric=False)
    bias = torch.randn(N, generator=g)
    return x, qw, bias


def _magnitude(x, qw, block_size, bias) -> torch.Tensor:
    """sum_i (|sA sB Cq_i| + |sA oB sumA_i| + |oA sB sumB_i| + bs |oA oB|) + |bias|, float64."""
    A_q, sA, oA, sumA = quantize_activation_reference(x, block_size)
    M, K = x.shape
    N, G = qw.N, K // block_size
    Bq = qw.int_values().to(torch.int64)
    mag = torch.zeros(M, N, dtype=torch.float64)
    for i in range(G):
        blk = slice(i * block_size, (i + 1) * block_size)
        Cq = (A_q[:, blk].to(torch.int64) @ Bq[:, blk].T).double()
        sa, oa, qa = sA[:, i:i + 1].double().abs(), oA[:, i:i + 1].double().abs(), sumA[:, i:i + 1].double().abs()
        sb, ob = qw.scale[:, i].double().abs()[None], qw.offset[:, i].double().abs()[None]
        qb = Bq[:, blk].sum(-1).double().abs()[None]
        mag += sa * sb * Cq.abs() + sa * ob * qa + oa * sb * qb + block_size * oa * ob
    return mag + bias.double().abs()[None]


@pytest.mark.parametrize("acc_dtype, out_dtype", [
    (torch.float32, torch.float32), (torch.float32, torch.float16), (torch.float32, torch.bfloat16),
    (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
], ids=str)
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("params_2d", [True, False], ids=["params_MxG", "params_M"])
def test_dequant_and_acc_then_bias_act(acc_dtype, out_dtype, act, params_2d):
    block_size, G = 64, 4
    x, qw, bias = _scheme2_problem(block_size=block_size, G=G)
    M, N = x.shape[0], qw.N
    ref = w8a8_kblock_reference(x, qw, block_size, bias, act)
    mag = _magnitude(x, qw, block_size, bias)

    xg, qwg = x.cuda(), qw.to("cuda")
    sum_B = sum_bq_gpu(qwg.qweight, block_size)
    A_q = torch.empty(M, block_size, dtype=torch.int8, device="cuda")
    shape = (M, G) if params_2d else (M,)
    sA, oA = torch.empty(shape, device="cuda"), torch.empty(shape, device="cuda")
    sumA = torch.empty(shape, dtype=torch.int32, device="cuda")
    ldc = N + 8
    Cq = torch.full((M, ldc), 2 ** 30, dtype=torch.int32, device="cuda")  # padding columns never read
    acc = torch.zeros(M, N, dtype=acc_dtype, device="cuda")
    for i in range(G):
        quantize_activation_block_gpu(xg, i * block_size, block_size, A_q, sA, oA, sumA)
        B_blk = qw.qweight[:, i * block_size:(i + 1) * block_size]
        Cq[:, :N] = (A_q.cpu().to(torch.int64) @ B_blk.to(torch.int64).T).to(torch.int32).cuda()
        dequant_and_acc_gpu(Cq, acc, sA, oA, sumA, qwg.scale, qwg.offset, sum_B, i, block_size)

    if out_dtype == acc_dtype:
        y = bias_and_activation_gpu(acc, bias.cuda(), act)  # in place
        assert y is acc
    else:
        out = torch.full((M, N), float("nan"), dtype=out_dtype, device="cuda")
        y = bias_and_activation_gpu(acc, bias.cuda(), act, out=out)
        assert y is out
    got = y.double().cpu()
    assert torch.isfinite(got).all()
    u32, u_acc, u_out = 2.0 ** -24, UNIT_ROUNDOFF[acc_dtype], UNIT_ROUNDOFF[out_dtype]
    tol = ((8 + G) * u32 + (G + 1) * (u_acc if acc_dtype != torch.float32 else 0)) * mag + u_out * ref.abs()
    err = (got - ref).abs()
    assert bool((err <= tol).all()), f"max err {err.max():.3e}, max err/tol {(err / tol).max():.3f}"


def test_bias_act_without_bias_and_strided_rows():
    data = torch.randn(9, 40, device="cuda") * 8
    view = data[:, :33]
    expected = view.clamp(0, 6).half()
    out = torch.full((9, 33), float("nan"), dtype=torch.float16, device="cuda")
    bias_and_activation_gpu(view, None, "relu6", out=out)
    assert torch.equal(out, expected)
