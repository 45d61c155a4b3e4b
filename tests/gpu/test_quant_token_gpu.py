"""Per-token int8 quantization on the GPU (``quant_token.cu``): bit-exact with the torch reference.

The kernel is compared bit for bit with ``torch_ops.quantize_per_token_reference`` run on the CPU (one
IEEE-rounded float32 op each): rows of random values with outliers, zero rows, rows of exact ties
(x / s = k + 0.5, s a power of two), large and subnormal magnitudes, misaligned and strided rows, NaN / Inf.
torch's own CUDA run of the reference computes amax / 127.0 as amax * float(1 / 127), so it is only
within 1 ulp of s (test_torch_on_cuda_multiplies_by_the_reciprocal). Then the W8A8 per-channel linear
through the kernel against its exact integer product in float64.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from cutlass_ops.nn import QuantLinear
from cutlass_ops.quantize_model import W8A8ChannelConfig
from cutlass_ops.torch_ops import quantize_per_token, quantize_per_token_reference
from cutlass_ops.w8a8.quant_token import quantize_per_token_gpu

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
# the largest power of two e with 127 * 2^e finite in the dtype: a large-magnitude tie row
LARGE_EXP = {torch.float32: 100, torch.float16: 8, torch.bfloat16: 100}
# a tiny scale: float32 / bfloat16 s subnormal (x / s may pass 127: the clamp), float16 x subnormal
TINY_EXP = {torch.float32: -140, torch.float16: -20, torch.bfloat16: -130}


def _ties(K: int, e: int, sign: float = 1.0) -> torch.Tensor:
    """A row with amax 127 * 2^e (so s = 2^e exactly) and x / s = +-(k + 0.5): every rounding a tie."""
    k = torch.arange(K, dtype=torch.float64)
    row = ((k % 127) + 0.5) * torch.where(k % 2 == 0, 1.0, -1.0)
    row[0] = 127.0 * sign
    return row * 2.0 ** e


def _special_rows(K: int, dtype: torch.dtype, g: torch.Generator) -> list[torch.Tensor]:
    rows = [
        torch.zeros(K, dtype=torch.float64),                                  # s = 1, q = 0
        _ties(K, 0), _ties(K, -3, -1.0), _ties(K, LARGE_EXP[dtype]),           # exact ties
        torch.randn(K, generator=g, dtype=torch.float64) * 2.0 ** LARGE_EXP[dtype] / 16,
        torch.randn(K, generator=g, dtype=torch.float64) * 2.0 ** TINY_EXP[dtype],
        torch.full((K,), -0.0, dtype=torch.float64),                          # a zero row of -0
        torch.full((K,), 0.375, dtype=torch.float64),                         # constant: q = 127 everywhere
    ]
    if dtype == torch.float32:  # amax = the smallest subnormal: amax / 127 underflows to 0, s = 1
        tiny = torch.zeros(K, dtype=torch.float64)
        tiny[K // 2] = 2.0 ** -149
        rows.append(tiny)
    return rows


def _activations(M: int, K: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """M rows: random with outliers, then the special rows in turn (row m >= 1 is special kind m - 1)."""
    g = torch.Generator().manual_seed(seed + 7 * K + M)
    x = torch.randn(M, K, generator=g, dtype=torch.float64) * 3
    x[:, ::17] *= 25  # outliers
    special = _special_rows(K, dtype, g)
    for m in range(1, M, 2):  # every other row special, the kinds in turn
        x[m] = special[(m // 2) % len(special)]
    out = x.to(dtype)
    assert torch.isfinite(out).all()
    return out


def _assert_same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    """A_q and s bit for bit (s: NaN where the other is NaN, else equal)."""
    (A_q, s), (A_ref, s_ref) = (t.cpu() for t in got), want
    assert A_q.dtype == torch.int8 and s.dtype == torch.float32
    assert A_q.shape == A_ref.shape and s.shape == s_ref.shape, (A_q.shape, s.shape)
    assert torch.equal(torch.isnan(s), torch.isnan(s_ref))
    finite = ~torch.isnan(s_ref)
    if not torch.equal(s[finite], s_ref[finite]):
        bad = (s != s_ref).logical_and(finite).nonzero()[:5].tolist()
        raise AssertionError(f"s differs at {bad}: got {[s[tuple(i)].item() for i in bad]}, "
                             f"expected {[s_ref[tuple(i)].item() for i in bad]}")
    if not torch.equal(A_q, A_ref):
        bad = (A_q != A_ref).nonzero()[:5].tolist()
        raise AssertionError(f"A_q differs at {bad}: got {[A_q[tuple(i)].item() for i in bad]}, "
                             f"expected {[A_ref[tuple(i)].item() for i in bad]}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K", [1, 7, 16, 4096, 4097, 14336])
@pytest.mark.parametrize("M", [1, 3, 17, 64])
def test_bit_exact(M, K, dtype):
    x = _activations(M, K, dtype)
    want = quantize_per_token_reference(x)
    _assert_same(quantize_per_token_gpu(x.cuda()), want)
    _assert_same(quantize_per_token(x.cuda()), want)  # the public entry takes the kernel on CUDA


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K", [16, 300, 4096])
def test_every_special_row(K, dtype):
    """Each special row kind (ties, zero, large, subnormal, underflowing s) in a row of its own."""
    rows = _special_rows(K, dtype, torch.Generator().manual_seed(K))
    x = torch.stack(rows).to(dtype)
    A_q, s = quantize_per_token_gpu(x.cuda())
    _assert_same((A_q, s), quantize_per_token_reference(x))
    A_q, s = A_q.cpu(), s.cpu()
    assert s[0, 0] == 1 and not A_q[0].any()  # zero row
    k = torch.arange(K)
    ties = ((k % 127) + 0.5)
    half_even = torch.round(ties) * torch.where(k % 2 == 0, 1.0, -1.0)  # round half to even
    half_even[0] = 127
    for r, e in ((1, 0), (3, LARGE_EXP[dtype])):
        assert s[r, 0] == 2.0 ** e
        assert torch.equal(A_q[r], half_even.to(torch.int8)), r
    assert s[2, 0] == 2.0 ** -3 and torch.equal(A_q[2, 1:], half_even[1:].to(torch.int8)) and A_q[2, 0] == -127
    assert (A_q[7] == 127).all()
    if dtype == torch.float32:
        assert s[-1, 0] == 1 and not A_q[-1].any()  # amax / 127 underflowed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K", [1, 7, 16, 300, 4097])
@pytest.mark.parametrize("shift", [1, 3])
def test_misaligned_and_strided_rows(K, dtype, shift):
    """Rows starting off a 16-byte boundary with a padded row stride (scalar head, vectors, tail), and a
    last dimension with a stride (copied first)."""
    M = 19
    wide = _activations(M, K + 11, dtype, seed=3)
    x = wide[:, shift:shift + K]  # row stride K + 11
    want = quantize_per_token_reference(x)
    _assert_same(quantize_per_token_gpu(wide.cuda()[:, shift:shift + K]), want)
    xt = x.t().contiguous().cuda().t()  # strides (1, M)
    assert xt.stride(1) != 1 or K == 1
    _assert_same(quantize_per_token_gpu(xt), want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_many_rows_stride_over_row_groups(dtype):
    """More rows than the grid cap (8 blocks per SM): blocks loop over row groups."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    for K in (64, 2048):  # rows per block: 8 at K = 64; 4 (16-bit types) or 2 (float32) at K = 2048
        M = 8 * sms * 8 + 5
        x = _activations(M, K, dtype, seed=5)
        _assert_same(quantize_per_token_gpu(x.cuda()), quantize_per_token_reference(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K", [7, 4096])
def test_nan_and_inf_rows(K, dtype):
    """A row holding NaN gets s = NaN, one holding +-Inf s = +Inf; their A_q is 0 (x / s is NaN or 0, and NaN
    converts to 0) - what torch's ops give, on the CPU as on CUDA. The other rows are untouched."""
    x = _activations(6, K, dtype, seed=11)
    x[1, K // 2] = float("nan")
    x[2, 0] = float("inf")
    x[3, K - 1] = float("-inf")
    x[4, 0], x[4, K - 1] = float("inf"), float("nan")
    A_q, s = (t.cpu() for t in quantize_per_token_gpu(x.cuda()))
    _assert_same((A_q, s), quantize_per_token_reference(x))
    A_cuda, s_cuda = (t.cpu() for t in quantize_per_token_reference(x.cuda()))
    assert torch.equal(A_q[1:5], A_cuda[1:5]) and torch.equal(torch.isnan(s), torch.isnan(s_cuda))
    assert torch.isnan(s[1, 0]) and torch.isnan(s[4, 0]) and s[2, 0] == float("inf") and s[3, 0] == float("inf")
    assert not A_q[1:5].any()
    assert torch.isfinite(s[[0, 5]]).all()


def test_torch_on_cuda_multiplies_by_the_reciprocal():
    """Rows whose amax / 127 and amax * float(1 / 127) round apart: the kernel (and quantize_per_token on
    CUDA) give the division, as the CPU; torch's CUDA ops are within 1 ulp of it."""
    a = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 100 + 1
    apart = a[a / 127.0 != a * (torch.tensor(1.0) / 127.0)][:8]
    assert apart.numel() == 8  # about 1 amax in 20
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).clamp(-0.9, 0.9) * apart[:, None]
    x[:, 5] = apart  # the amax of each row
    want = quantize_per_token_reference(x)
    assert torch.equal(want[1], (apart / 127.0)[:, None])
    _assert_same(quantize_per_token_gpu(x.cuda()), want)
    _assert_same(quantize_per_token(x.cuda()), want)
    s_cuda = quantize_per_token_reference(x.cuda())[1].cpu()
    ulps = (s_cuda.view(torch.int32).to(torch.int64) - want[1].view(torch.int32).to(torch.int64)).abs()
    assert int(ulps.max()) <= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_rows(dtype):
    A_q, s = quantize_per_token_gpu(torch.empty(0, 64, dtype=dtype, device="cuda"))
    assert A_q.shape == (0, 64) and A_q.dtype == torch.int8 and s.shape == (0, 1) and s.dtype == torch.float32


def test_refuses_what_it_cannot_take():
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        quantize_per_token_gpu(torch.zeros(2, 16, dtype=torch.float64, device="cuda"))
    with pytest.raises(ValueError, match="2-D"):
        quantize_per_token_gpu(torch.zeros(2, 3, 16, device="cuda"))
    with pytest.raises(ValueError, match="K >= 1|1 <= K"):
        quantize_per_token_gpu(torch.zeros(2, 0, device="cuda"))
    # the public entry keeps the torch ops for what the kernel does not take (float64: the gradcheck dtype)
    x = torch.randn(3, 16, dtype=torch.float64, device="cuda")
    got = quantize_per_token(x)
    want = quantize_per_token_reference(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_graph_capture_replays_the_kernel():
    """Inside a CUDA graph the quantization is one kernel that reads the captured input buffer."""
    x = _activations(5, 4096, torch.float16).cuda()
    quantize_per_token_gpu(x)  # load the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        A_q, s = quantize_per_token_gpu(x)
    fresh = _activations(5, 4096, torch.float16, seed=9)
    x.copy_(fresh.cuda())
    graph.replay()
    torch.cuda.synchronize()
    _assert_same((A_q, s), quantize_per_token_reference(fresh))


# --------------------------------------------------------------------------------------------
# QuantLinear "w8a8_channel" through the kernel
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 5, 64])
@pytest.mark.parametrize("K, N", [(256, 48), (100, 37), (4097, 1000)])  # ragged: the GEMM runs padded
def test_quant_linear_w8a8_channel_matches_the_exact_product(M, dtype, K, N):
    """The module's output against act(A_q @ W_q^T * s * scale + bias) in float64 from the reference's A_q
    and s and the exact integer product: the epilogue's float32 arithmetic (a few roundings of each term)
    and the output rounding apart, the same numbers."""
    torch.manual_seed(0)
    q = QuantLinear.from_float(nn.Linear(K, N), W8A8ChannelConfig()).cuda().to(dtype)
    x = (torch.randn(M, K) * 2).to(dtype)
    A_q, s = quantize_per_token_reference(x)
    acc = (A_q.to(torch.int64) @ q.qweight.cpu().to(torch.int64).T).double()
    terms = acc * s.double() * q.scale.cpu().double().reshape(1, N)
    bias = q.bias.detach().cpu().double()
    ref = terms + bias
    # + half the output's subnormal spacing: an output near 0 rounds with an absolute error
    u = UNIT_ROUNDOFF[dtype]
    tol = 8 * 2.0 ** -24 * (terms.abs() + bias.abs()) + u * ref.abs() + u * torch.finfo(dtype).tiny
    with torch.no_grad():
        eager = q(x.cuda())  # the eager fast path (linear_w8a8_channel_impl)
        op = torch.ops.cutlass_ops.linear_w8a8_channel(x.cuda(), q.qweight, q.scale, q.bias, 0)  # the custom op
    for got in (eager, op):
        assert got.dtype == dtype and got.shape == (M, N)
        err = (got.cpu().double() - ref).abs()
        assert bool((err <= tol).all()), f"max err {err.max():.3e}, max err/tol {(err / tol).max():.3f}"
