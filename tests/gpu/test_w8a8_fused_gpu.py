"""The fused scheme-2 W8A8 kernel on a GPU against float64 references.

Compared at the quantized-input level: the same (A_q, sA, oA, sumA) and weight feed the kernel
and a float64 evaluation of the 4-term formula, so the only differences are the kernel's float32
arithmetic and the output rounding. Bound per output (derived, worst case):
  |D - ref| <= (3G + 4) * 2^-24 * S  +  u_out * |ref|  (+ 2^-24 for fp16's subnormals)
with S = sum over blocks of |each of the four terms| + |bias| (3 rounded FMAs per block into
the running sum, a few roundings per term), u_out the output format's unit roundoff.
"""
from __future__ import annotations

import pytest
import torch

from custom_kernels.device import capability as device_capability
from cutlass_ops import plan_cache
from cutlass_ops.formats import QuantizedWeight, quantize_activation_reference
from cutlass_ops.w8a8 import tiles
from cutlass_ops.w8a8.fused import linear_w8a8_fused, prepare_weight_w8a8, quantize_activation_torch
from cutlass_ops.w8a8.quant_a import quantize_activation_gpu
from cutlass_ops.w8a8.tiles import BLOCK_SIZES, TILE_CONFIGS, choose_config

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4352, 256: 4352}  # not multiples of the 128-wide K tile


def _weight(N: int, K: int, block_size: int, gen: torch.Generator) -> QuantizedWeight:
    G = K // block_size
    q = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8, device="cuda")
    scale = torch.rand(N, G, generator=gen, device="cuda") * 0.02 + 1e-3
    offset = torch.randn(N, G, generator=gen, device="cuda") * 0.05
    return QuantizedWeight(q, scale, offset, 8, block_size, N, K, None, False)


def _activations(M: int, K: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(M, K, generator=gen, device="cuda")
    x = x * torch.rand(M, 1, generator=gen, device="cuda") * 4 + torch.randn(M, 1, generator=gen, device="cuda")
    return x.to(dtype)


def _reference(quantized_A, qw: QuantizedWeight, bias, act: int):
    """float64 4-term formula and the bound S of the docstring; both [M, N] on the GPU."""
    A_q, sA, oA, sumA = (t.double() for t in quantized_A)
    B_q = qw.qweight.double()
    bs, G = qw.block_size, qw.K // qw.block_size
    sB, oB = qw.scale.double(), qw.offset.double()
    sumB = qw.qweight.to(torch.int32).reshape(qw.N, G, bs).sum(-1).double()
    M, N = A_q.shape[0], qw.N
    ref = torch.zeros(M, N, dtype=torch.float64, device="cuda")
    S = torch.zeros_like(ref)
    for g in range(G):
        k = slice(g * bs, (g + 1) * bs)
        Cq = A_q[:, k] @ B_q[:, k].T  # exact: |Cq| <= 2^22
        terms = (sA[:, g, None] * sB[None, :, g] * Cq,
                 (sA[:, g] * sumA[:, g])[:, None] * oB[None, :, g],
                 oA[:, g, None] * (sB[:, g] * sumB[:, g])[None, :],
                 bs * oA[:, g, None] * oB[None, :, g])
        for t in terms:
            ref += t
            S += t.abs()
    if bias is not None:
        ref += bias.double()[None, :]
        S += bias.double().abs()[None, :]
    if act == 1:
        ref = ref.clamp_min(0)
    elif act == 2:
        ref = ref.clamp(0, 6)
    return ref, S


def _check(D: torch.Tensor, ref: torch.Tensor, S: torch.Tensor, G: int) -> None:
    assert bool(torch.isfinite(D).all()), "NaN/Inf in the output (unwritten element?)"
    bound = (3 * G + 4) * 2.0 ** -24 * S + UNIT_ROUNDOFF[D.dtype] * ref.abs()
    if D.dtype == torch.float16:
        bound += 2.0 ** -24
    err = (D.double() - ref).abs()
    worst = int((err - bound).argmax())
    m, n = divmod(worst, D.shape[1])
    assert bool((err <= bound).all()), (f"max excess at (m={m}, n={n}): got {float(D[m, n])}, "
                                        f"want {float(ref[m, n])} +- {float(bound[m, n])}")
    rel = float(torch.linalg.norm(D.double() - ref) / torch.linalg.norm(ref).clamp_min(1e-30))
    assert rel < 1e-2  # sanity on top of the per-element bound


def _run(M, N, K, block_size, dtype, with_bias, act, config=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qw = _weight(N, K, block_size, gen)
    x = _activations(M, K, dtype, gen)
    bias = torch.randn(N, generator=gen, device="cuda").to(dtype) if with_bias else None
    quantized_A = quantize_activation_torch(x, block_size)
    out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")  # poison: every element must be written
    D = linear_w8a8_fused(x, qw, bias, act, quantized_A=quantized_A, out=out, config=config)
    torch.cuda.synchronize()
    assert D is out
    ref, S = _reference(quantized_A, qw, bias, act)
    _check(D, ref, S, K // block_size)


@pytest.mark.parametrize("M, N, K, block_size, dtype, with_bias, act", [
    (1, 4097, 4160, 64, torch.float16, True, 1),
    (3, 257, 4352, 128, torch.bfloat16, False, 0),
    (17, 4097, 4352, 256, torch.float32, True, 2),
    (127, 1000, 4160, 32, torch.float16, True, 0),
    (33, 640, 4160, 64, torch.bfloat16, True, 2),
    (2048, 4097, 4352, 128, torch.bfloat16, True, 1),
    (2048, 4097, 4160, 64, torch.float32, False, 2),
])
def test_matches_float64_reference(M, N, K, block_size, dtype, with_bias, act):
    _run(M, N, K, block_size, dtype, with_bias, act)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("config", sorted(TILE_CONFIGS))
def test_every_variant_and_block_size(config, block_size):
    if TILE_CONFIGS[config].wgmma and device_capability() != tiles.WGMMA_CC:
        pytest.skip("the wgmma variants need compute capability 9.0")
    # M = 129 and N = 200 leave ragged tiles in both directions for every variant
    _run(129, 200, K_FOR_BLOCK[block_size], block_size, torch.float16, True, 0, config=config, seed=block_size)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_end_to_end_matches_library_reference(dtype):
    """Quantization inside the call (GPU QuantA) vs cutlass_ops.reference on the CPU."""
    from cutlass_ops.reference import w8a8_kblock_reference

    gen = torch.Generator(device="cuda").manual_seed(7)
    M, N, K, bs = 17, 300, 4160, 64
    qw = _weight(N, K, bs, gen)
    x = _activations(M, K, dtype, gen)
    bias = torch.randn(N, generator=gen, device="cuda").to(dtype)
    D = linear_w8a8_fused(x, qw, bias, "relu")
    want = w8a8_kblock_reference(x.cpu(), qw.to("cpu"), bias=bias.cpu(), activation="relu").cuda()
    quantized_A = tuple(t.cuda() for t in quantize_activation_reference(x.cpu(), bs))
    _, S = _reference(quantized_A, qw, bias, 1)
    _check(D, want, S, K // bs)


def test_gpu_quantizer_is_bit_identical_to_reference():
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = _activations(37, 4096, torch.float16, gen)
    x[5, 128:256] = 0.25
    for bs in BLOCK_SIZES:
        got = quantize_activation_gpu(x, bs)
        want = quantize_activation_reference(x.cpu(), bs)
        for a, b, name in zip(got, want, ("A_q", "scale", "offset", "sum_q")):
            assert torch.equal(a.cpu(), b), f"{name} differs at block_size={bs}"


def test_constant_blocks_give_finite_exact_results():
    """Zero-range activation blocks (scale 1, q = 0) and an all-zero row: no NaN/Inf, still correct."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    M, N, K, bs = 5, 384, 1024, 128
    qw = _weight(N, K, bs, gen)
    x = _activations(M, K, torch.float16, gen)
    x[0, 128:256] = 3.0
    x[1] = 0.0
    x[2, :] = -1.5
    quantized_A = quantize_activation_torch(x, bs)
    assert bool((quantized_A[1][1] == 1).all()) and bool((quantized_A[0][1] == 0).all())
    out = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    D = linear_w8a8_fused(x, qw, None, 0, quantized_A=quantized_A, out=out)
    ref, S = _reference(quantized_A, qw, None, 0)
    _check(D, ref, S, K // bs)
    # a constant row equals its value times the row sums of the dequantized weight
    w = qw.dequantize(torch.float64)
    torch.testing.assert_close(D[2].double(), -1.5 * w.sum(1), rtol=2e-3, atol=1e-2)


def test_default_config_choice_and_cached_preparation():
    gen = torch.Generator(device="cuda").manual_seed(5)
    qw = _weight(256, 512, 128, gen)
    prep = prepare_weight_w8a8(qw)
    x = _activations(40, 512, torch.float16, gen)
    D1 = linear_w8a8_fused(x, qw)
    assert prepare_weight_w8a8(qw) is prep
    D2 = linear_w8a8_fused(x, qw, config=choose_config(40, 256, device_capability()))
    torch.testing.assert_close(D1, D2, rtol=0, atol=0)  # same variant, same inputs: deterministic
    plans = plan_cache.stats()["plans"]
    linear_w8a8_fused(x[:37], qw)  # another M of the same variant: the same plan, another grid
    assert plan_cache.stats()["plans"] <= plans  # (other tests' weights may be freed meanwhile)
    assert not [k for k in vars(qw) if k.startswith("_")]  # nothing cached on the weight


def test_graph_capture_replays_the_kernel():
    gen = torch.Generator(device="cuda").manual_seed(9)
    qw = _weight(512, 1024, 64, gen)
    x = _activations(64, 1024, torch.bfloat16, gen)
    quantized_A = quantize_activation_torch(x, 64)
    expected = linear_w8a8_fused(x, qw, quantized_A=quantized_A)
    out = torch.empty_like(expected)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        linear_w8a8_fused(x, qw, quantized_A=quantized_A, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_k_must_be_a_multiple_of_the_block():
    gen = torch.Generator(device="cuda").manual_seed(1)
    qw = _weight(64, 256, 64, gen)
    with pytest.raises(ValueError, match="K=200"):
        linear_w8a8_fused(torch.randn(4, 200, device="cuda"), qw)


@pytest.mark.parametrize("N, K, block_size, odd_rows", [(1, 96, 32, False), (17, 320, 64, False),
                                                        (130, 256, 128, True), (5, 4096, 4096, False),
                                                        (257, 4352, 256, False)])
def test_weight_preparation_kernel_equals_the_torch_reference(N, K, block_size, odd_rows):
    """precompute_bvec (quant_a.cu), the fused path's weight preparation on the GPU: sum_B_q and bvec equal,
    bit for bit, the float64 torch expression they replace (prepare_bvec_reference) - rows at odd addresses
    (the byte loop), extreme int8 rows and scales of every magnitude included."""
    from cutlass_ops.w8a8.fused import prepare_bvec_reference
    from cutlass_ops.w8a8.quant_a import precompute_bvec_gpu

    gen = torch.Generator(device="cuda").manual_seed(N + K)
    G = K // block_size
    q = torch.randint(-128, 128, (N, K + 1), generator=gen, dtype=torch.int8, device="cuda")
    q[0, :K] = -128  # the extreme sums
    if N > 1:
        q[1, :K] = 127
    B_q = q[:, 1:] if odd_rows else q[:, :K].contiguous()
    scale = torch.rand(N, G, generator=gen, device="cuda") * torch.logspace(-30, 30, N * G, device="cuda").view(N, G)
    offset = torch.randn(N, G, generator=gen, device="cuda") * torch.logspace(20, -20, N * G, device="cuda").view(N, G)
    sumB, bvec = precompute_bvec_gpu(B_q, scale, offset, block_size)
    ref_sumB, ref_bvec = prepare_bvec_reference(B_q.contiguous(), scale, offset, block_size)
    assert torch.equal(sumB, ref_sumB)
    assert torch.equal(bvec.view(torch.int32), ref_bvec.view(torch.int32))  # bits, signed zeros included
