"""Empty and huge problems through the public API.

Empty: M, N or K = 0 give the right empty shape, or the right zeros (K = 0: the epilogue of a zero
accumulator, i.e. bias only). N = 0 / K = 0 weights cannot be built (QuantizedWeight refuses them,
see tests/test_fuzz_api.py). Huge: one case per family with more than 2^31 elements in an operand
is correct on sampled rows, or refused with a clear Python error before any launch (a valid call
afterwards succeeds). Cases that misbehave today are xfail (not strict) with the reason.
"""
from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.gpu

EMPTY_GEMM = "int8_gemm refuses M, N or K = 0 (cutlass/plan.py check_sizes: 'empty GEMM')"


@pytest.fixture(scope="module")
def co():
    import cutlass_ops
    return cutlass_ops


def _qw(co, bits=8, N=64, K=128, bs=32):
    W = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    return co.quantize_weight(W, bits=bits, block_size=bs).to("cuda")


@pytest.mark.parametrize("bits", [4, 8])
def test_linear_M0(co, bits):
    qw = _qw(co, bits)
    assert co.linear(torch.empty(0, 128, device="cuda", dtype=torch.float16), qw).shape == (0, 64)
    assert co.linear(torch.empty(2, 0, 128, device="cuda", dtype=torch.float16), qw).shape == (2, 0, 64)


@pytest.mark.parametrize("path", ["fused", "orchestrator", "literal"])
def test_linear_w8a8_M0(co, path):
    y = co.linear_w8a8(torch.empty(0, 128, device="cuda", dtype=torch.float16), _qw(co), path=path)
    assert y.shape == (0, 64)


def test_conv2d_batch0(co):
    qw = co.quantize_conv_weight(torch.randn(16, 8, 3, 3), bits=8).to("cuda")
    y = co.conv2d(torch.empty(0, 8, 7, 7, device="cuda", dtype=torch.float16), qw, padding=1)
    assert y.shape == (0, 16, 7, 7)


def test_quantize_activation_M0(co):
    q, s, o, sq = co.quantize_activation(torch.empty(0, 128, device="cuda", dtype=torch.float16), 64)
    assert q.shape == (0, 128) and s.shape == o.shape == sq.shape == (0, 2)


@pytest.mark.parametrize("M,N", [(0, 32), (16, 0), (0, 0)])
def test_int8_gemm_empty_MN(co, M, N):
    A = torch.empty(M, 64, dtype=torch.int8, device="cuda")
    B = torch.empty(N, 64, dtype=torch.int8, device="cuda")
    D = co.int8_gemm(A, B)
    assert D.shape == (M, N) and D.dtype == torch.int32


def test_int8_gemm_K0_is_the_epilogue_of_zero(co):
    A = torch.empty(16, 0, dtype=torch.int8, device="cuda")
    B = torch.empty(32, 0, dtype=torch.int8, device="cuda")
    assert torch.equal(co.int8_gemm(A, B), torch.zeros(16, 32, dtype=torch.int32, device="cuda"))
    bias = torch.randn(32, device="cuda")
    D = co.int8_gemm(A, B, "dequant", scale_row=torch.rand(16, device="cuda"), scale_col=torch.rand(32, device="cuda"),
                     bias=bias, out_dtype=torch.float32)
    assert torch.equal(D, bias.expand(16, 32))
    ms, fb = torch.full((32,), 0.5, device="cuda"), torch.arange(32, device="cuda", dtype=torch.float32)
    Oq = co.int8_gemm_requant(A, B, ms, fb)
    assert torch.equal(Oq, torch.round(ms * fb).clamp(-128, 127).to(torch.int8).expand(16, 32))


# ------------------------------------------------------------------------------------------------
# more than 2^31 elements
# ------------------------------------------------------------------------------------------------

M_BIG, K_BIG = 2 ** 19, 4096  # A / x: 2^31 elements
ROWS = [0, 1, 2 ** 18 - 1, 2 ** 18, 2 ** 18 + 1, M_BIG - 2, M_BIG - 1]  # around the 2^31-byte boundary


def _refused_or(fn, check):
    """Run fn(); a refusal must be a plain Python error saying why, and leave the GPU usable."""
    try:
        out = fn()
    except (ValueError, RuntimeError) as exc:
        msg = str(exc)
        assert "CUDA" not in msg and "cuda" not in type(exc).__name__.lower(), msg
        assert "2^31" in msg or "2**31" in msg or "elements" in msg or "too large" in msg, msg
        torch.ones(4, device="cuda").sum().item()  # no sticky error
        return
    torch.cuda.synchronize()
    check(out)


@pytest.fixture
def free_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _big_int8(rows, cols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-2, 3, (rows, cols), dtype=torch.int8, device="cuda", generator=g)


def test_int8_gemm_2_31_elements(co, free_memory):
    A, B = _big_int8(M_BIG, K_BIG, 1), _big_int8(128, K_BIG, 2)

    def check(D):
        assert D.shape == (M_BIG, 128)
        ref = A[ROWS].float() @ B.float().T  # |sum| <= 4 * 4096: exact in float32
        assert torch.equal(D[ROWS], ref.to(torch.int32))
    _refused_or(lambda: co.int8_gemm(A, B), check)


def _dequant(qw):
    q = qw.int_values().float()
    G = qw.K // qw.block_size
    return (q.view(qw.N, G, -1) * qw.scale[..., None] + qw.offset[..., None]).view(qw.N, qw.K)


@pytest.mark.parametrize("op", ["linear-int4", "linear-int8", "linear_w8a8"])
def test_linear_families_2_31_elements(co, op, free_memory):
    qw = _qw(co, 4 if op == "linear-int4" else 8, N=128, K=K_BIG, bs=128)
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.empty(M_BIG, K_BIG, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=g)
    fn = (lambda: co.linear_w8a8(x, qw)) if op == "linear_w8a8" else (lambda: co.linear(x, qw))

    def check(y):
        assert y.shape == (M_BIG, 128)
        ref = x[ROWS].float() @ _dequant(qw).T
        tol = 0.05 if op == "linear_w8a8" else 0.01  # activation quantization vs fp16 rounding
        assert torch.allclose(y[ROWS].float(), ref, atol=tol * ref.abs().max().item(), rtol=0), op
    _refused_or(fn, check)


def test_quantize_activation_2_31_elements(co, free_memory):
    x = torch.empty(M_BIG, K_BIG, dtype=torch.float16, device="cuda").uniform_(-1, 1)

    def check(res):
        from cutlass_ops.formats import quantize_activation_reference
        ref = quantize_activation_reference(x[ROWS].cpu(), 128)
        for got, want in zip(res, ref):
            assert torch.equal(got[ROWS].cpu(), want)
    _refused_or(lambda: co.quantize_activation(x, 128), check)


def test_conv2d_2_31_elements_is_refused(co, free_memory):
    """conv refuses a > 2^31-1 element input before any launch (conv/__init__.py)."""
    qw = co.quantize_conv_weight(torch.randn(32, 32, 3, 3), bits=8).to("cuda")
    x = torch.empty(257, 32, 512, 512, dtype=torch.float16, device="cuda")  # 2^31 + 2^23 elements
    with pytest.raises(ValueError, match="2\\^31"):
        co.conv2d(x, qw, padding=1)
    torch.ones(4, device="cuda").sum().item()
