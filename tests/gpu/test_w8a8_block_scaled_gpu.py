"""The block-scaled symmetric W8A8 scheme (cutlass_ops/w8a8/block_scaled.py) on a GPU.

1. The symmetric QuantA (quant_a.cu built with QUANT_A_SYMMETRIC) bit for bit against
   ``quantize_activation_block_scaled_reference`` on the CPU (any GPU).
2. The Hopper kernel (w8a8_kblock_wgmma.cu with W8A8W_BLOCK_SCALED, sm_90a) against the float64
   formula evaluated from the same quantized integers, per output element within

       |D - ref| <= c * S + u_out * (|ref| + c * S)  (+ 2^-24 for fp16),   c = (G + 1 + max(splits, 2)) * 2^-24

   with S = sum_j |sA sW Cq_j| + |bias|. Derivation: Cq_j and its int -> float conversion are exact;
   the row factor sA * sW is one float32 rounding (2^-24 of each term); each of the G FFMAs rounds the
   running sum once (<= 2^-24 * S each); split-K's reduce adds the splits' partial sums (splits - 1
   roundings, each <= 2^-24 * S); the bias add once more; the activation is 1-Lipschitz; the
   output conversion is u_out relative (fp32 0, fp16 2^-11, bf16 2^-8) plus fp16's subnormal spacing.
   (Unsplit that is G + 2 roundings, within the G + 3 of c at splits <= 2.)
   Weights and activations get magnitudes spread over three decades per tile / block, so a scale taken
   from the wrong row, weight block or K block breaks the bound by orders of magnitude (and the largest
   output, ~2e4 at M = 1000, N = K = 4096, stays inside fp16).
"""
from __future__ import annotations

import itertools

import pytest
import torch

from cutlass_ops import plan_cache
from cutlass_ops.w8a8.block_scaled import (BlockScaledWeight, linear_block_scaled_reference,
                                           linear_w8a8_block_scaled, quantize_activation_block_scaled_reference,
                                           quantize_weight_block_scaled)
from cutlass_ops.w8a8.block_scaled_plan import plan_for, quantize_activation_block_scaled_gpu
from cutlass_ops.w8a8.tiles import BLOCK_SCALED_CONFIGS, BLOCK_SCALED_SIZES, choose_block_scaled_config, k_units

pytestmark = pytest.mark.gpu

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not IS_HOPPER, reason="the block-scaled kernel is sm_90a (Hopper) only")

UNIT_ROUNDOFF = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _weight(N: int, K: int, bs: int, gen: torch.Generator, zero_tile: bool = False) -> BlockScaledWeight:
    """Gaussian weights times a magnitude per bs x bs tile spread over 10^-2 .. 10^1."""
    NB, G = -(-N // bs), K // bs
    magnitude = 10.0 ** (torch.rand(NB, G, generator=gen, device="cuda") * 3 - 2)
    per_element = magnitude.repeat_interleave(bs, 0)[:N].repeat_interleave(bs, 1)
    w = torch.randn(N, K, generator=gen, device="cuda") * per_element
    if zero_tile:
        w[:bs, :bs] = 0.0  # scale 0, q 0
    return quantize_weight_block_scaled(w, bs)


def _activations(M: int, K: int, bs: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Gaussian activations times a magnitude per (row, K block) over 10^-1.5 .. 10^1.5, one zero block."""
    G = K // bs
    magnitude = 10.0 ** (torch.rand(M, G, generator=gen, device="cuda") * 3 - 1.5)
    x = torch.randn(M, K, generator=gen, device="cuda") * magnitude.repeat_interleave(bs, 1)
    x[M // 2, :bs] = 0.0  # scale 1, q 0
    return x.to(dtype)


def _reference(A_q: torch.Tensor, sA: torch.Tensor, weight: BlockScaledWeight, bias, act: int):
    """(ref, S) of the module docstring as float64 [M, N] on the GPU."""
    bs, G, N = weight.block_size, weight.num_groups, weight.N
    A = A_q.double().reshape(A_q.shape[0], G, bs)
    B = weight.qweight.double().reshape(N, G, bs)
    sW = weight.scale.double().repeat_interleave(bs, 0)[:N]
    ref = torch.zeros(A_q.shape[0], N, dtype=torch.float64, device="cuda")
    S = torch.zeros_like(ref)
    for j in range(G):
        term = (sA.double()[:, j, None] * sW[None, :, j]) * (A[:, j] @ B[:, j].T)  # Cq exact in float64
        ref += term
        S += term.abs()
    if bias is not None:
        ref += bias.double()[None, :]
        S += bias.double().abs()[None, :]
    if act == 1:
        ref = ref.clamp_min(0)
    elif act == 2:
        ref = ref.clamp(0, 6)
    return ref, S


def _check(D: torch.Tensor, ref: torch.Tensor, S: torch.Tensor, G: int, splits: int = 1) -> None:
    assert bool(torch.isfinite(D).all()), "NaN/Inf in the output (an unwritten element, or a bad scale)"
    c = (G + 1 + max(splits, 2)) * 2.0 ** -24
    u = UNIT_ROUNDOFF[D.dtype]
    bound = c * S + u * (ref.abs() + c * S)
    if D.dtype == torch.float16:
        bound += 2.0 ** -24
    err = (D.double() - ref).abs()
    worst = int((err - bound).argmax())
    m, n = divmod(worst, D.shape[1])
    assert bool((err <= bound).all()), (f"{int((err > bound).sum())} elements out of bound; worst at (m={m}, "
                                        f"n={n}): got {float(D[m, n])}, want {float(ref[m, n])} +- "
                                        f"{float(bound[m, n])}")


def _splits_used(weight: BlockScaledWeight, M: int, config, splits) -> int:
    """The K slices a call with these arguments runs (its plan's default where ``splits`` is None)."""
    if splits is not None:
        return splits
    name = config or choose_block_scaled_config(M, weight.N)
    return plan_for(weight, name, torch.cuda.current_device()).splits_for(M)


def _run(M, N, K, bs, dtype, with_bias, act, config=None, seed=0, zero_tile=False, splits=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weight = _weight(N, K, bs, gen, zero_tile)
    x = _activations(M, K, bs, dtype, gen)
    bias = (torch.randn(N, generator=gen, device="cuda") * 4).to(dtype) if with_bias else None
    # the reference's quantization (CPU), given to the kernel: the kernel alone is under test
    A_q, sA = (t.cuda() for t in quantize_activation_block_scaled_reference(x.cpu(), bs))
    out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")  # poison: every element must be written
    D = linear_w8a8_block_scaled(x, weight, bias, act, quantized_A=(A_q, sA), out=out, config=config, splits=splits)
    torch.cuda.synchronize()
    assert D is out
    ref, S = _reference(A_q, sA, weight, bias, act)
    _check(D, ref, S, K // bs, _splits_used(weight, M, config, splits))
    # quantized inside the call (GPU QuantA, bit-identical): the same bits out (split-K's order is fixed)
    D2 = linear_w8a8_block_scaled(x, weight, bias, act, config=config, splits=splits)
    assert torch.equal(D2.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       D.view(torch.int16 if dtype != torch.float32 else torch.int32))
    return D


# ------------------------------------------------------------------------------------------------
# the symmetric QuantA (any GPU)
# ------------------------------------------------------------------------------------------------

def _hard_activations(M: int, K: int, bs: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(M * K + bs)
    G = K // bs
    magnitude = 10.0 ** (torch.rand(M, G, generator=gen, device="cuda") * 6 - 3)
    x = (torch.randn(M, K, generator=gen, device="cuda") * magnitude.repeat_interleave(bs, 1)).to(dtype)
    if M > 2:
        x[1, :bs] = 0.0                                    # zero block: scale 1, q 0
        x[2, :bs] = -0.0
        x[2, bs - 6:bs] = torch.tensor([127.0, 2.5, 3.5, -2.5, -0.5, 126.5], device="cuda")  # scale 1: ties to even
    if M > 3 and dtype == torch.float32:
        x[3, :bs] = 1e-44                                  # amax / 127 underflows: scale 1, q 0
    if M > 4 and dtype == torch.float16:
        x[4, :bs] = 2.0 ** -24 * torch.randint(-3, 4, (bs,), device="cuda")  # fp16 subnormals
    return x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M, K, bs", [(1, 128, 128), (3, 384, 128), (17, 4096, 128), (129, 4096, 64),
                                      (37, 4096, 256), (5, 4096, 2048)])  # 2048: the block-per-item kernel
def test_quantizer_is_bit_identical_to_the_reference(dtype, M, K, bs):
    x = _hard_activations(M, K, bs, dtype)
    want_q, want_s = quantize_activation_block_scaled_reference(x.cpu(), bs)
    A_q, planes = quantize_activation_block_scaled_gpu(x, bs)
    Mp = -(-M // 4) * 4
    assert planes.shape == (K // bs, Mp) and A_q.shape == (M, K)
    assert torch.equal(A_q.cpu(), want_q)
    assert torch.equal(planes[:, :M].T.cpu().view(torch.int32), want_s.view(torch.int32))  # bits
    A_q2, scale = quantize_activation_block_scaled_gpu(x, bs, planes=False)
    assert scale.shape == (M, K // bs)
    assert torch.equal(A_q2.cpu(), want_q) and torch.equal(scale.cpu().view(torch.int32), want_s.view(torch.int32))


def test_quantizer_takes_strided_rows():
    wide = _hard_activations(9, 640, 128, torch.bfloat16)
    x = wide[:, 128:640]  # rows 640 elements apart
    A_q, scale = quantize_activation_block_scaled_gpu(x, 128, planes=False)
    want_q, want_s = quantize_activation_block_scaled_reference(x.cpu().contiguous(), 128)
    assert torch.equal(A_q.cpu(), want_q) and torch.equal(scale.cpu(), want_s)


def test_quantizer_errors():
    with pytest.raises(ValueError, match="K=200 must be a multiple of block_size=128"):
        quantize_activation_block_scaled_gpu(torch.randn(2, 200, device="cuda"), 128)
    with pytest.raises(ValueError, match="CUDA"):
        quantize_activation_block_scaled_gpu(torch.randn(2, 256), 128)


# ------------------------------------------------------------------------------------------------
# the GEMM (Hopper)
# ------------------------------------------------------------------------------------------------

SHAPES = list(itertools.product((1, 3, 17, 128, 129, 1000), (128, 200, 384, 1000), (128, 384, 4096)))


@hopper
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_default_variant_matches_float64_reference(M, N, K):
    i = SHAPES.index((M, N, K))
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    act = (i // 2) % 3
    with_bias = (i // 6) % 2 == 0
    _run(M, N, K, 128, dtype, with_bias, act, seed=i)


@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_dtype_activation_and_bias(dtype, act, with_bias):
    _run(129, 1000, 384, 128, dtype, with_bias, act, seed=act + 3 * with_bias)


@hopper
@pytest.mark.parametrize("block_size", BLOCK_SCALED_SIZES)
@pytest.mark.parametrize("config", sorted(BLOCK_SCALED_CONFIGS))
def test_every_variant_and_block_size(config, block_size):
    # N = 1000: 192-wide tiles start at n0 % 128 = 0 and 64 (a tile spans two or three weight blocks);
    # K = 768: G = 3..12, and for block 256 the block spans two K tiles
    for M in (129, 1):
        _run(M, 1000, 768, block_size, torch.float16, True, 0, config=config, seed=block_size + M)


# Small M (issue 18): the WSB variant (64 x 128 tiles) and split-K forced, ragged M and N (tiles of 128
# columns: N = 192 and 320 end mid-tile and mid weight block), K of several blocks: block 64 with K = 576 (the
# last 128-wide K tile half full, the last split one block), block 256 with K = 1280 (each block two K tiles).
SMALL_M = [(M, N, bs, K) for M in (1, 3, 16, 17, 63) for N in (192, 320)
           for bs, K in ((128, 1024), (64, 576), (256, 1280))]


@hopper
@pytest.mark.parametrize("M, N, bs, K", SMALL_M)
def test_small_m_variant_with_split_k(M, N, bs, K):
    i = SMALL_M.index((M, N, bs, K))
    dtype = (torch.float16, torch.bfloat16, torch.float32)[i % 3]
    for splits in sorted({1, 2, 3, k_units(K, bs)}):  # k_units: one unit (some one block) per split
        _run(M, N, K, bs, dtype, i % 2 == 0, i % 3, config="WSB", splits=splits, seed=100 * i + splits)


@hopper
@pytest.mark.parametrize("block_size", BLOCK_SCALED_SIZES)
@pytest.mark.parametrize("config", sorted(BLOCK_SCALED_CONFIGS))
def test_every_variant_with_split_k(config, block_size):
    # N = 1000, K = 768 as above; 3 splits (block 256: one block per split), M = 17 and a second M tile
    for M in (17, 129):
        _run(M, 1000, 768, block_size, torch.bfloat16, True, 1, config=config, splits=3, seed=block_size + M)


@hopper
def test_default_splits_at_small_m_match_the_reference():
    # the default at M = 16: WSB; N = 2048 makes 16 tiles, so choose_splits takes several K slices
    gen = torch.Generator(device="cuda").manual_seed(23)
    weight = _weight(2048, 2048, 128, gen)
    assert _splits_used(weight, 16, None, None) > 1
    _run(16, 2048, 2048, 128, torch.float16, True, 0, seed=23)


@hopper
def test_split_k_is_deterministic_and_close_to_unsplit():
    gen = torch.Generator(device="cuda").manual_seed(29)
    weight = _weight(320, 1024, 128, gen)
    x = _activations(17, 1024, 128, torch.float32, gen)
    D1 = linear_w8a8_block_scaled(x, weight, config="WSB", splits=1)
    D4 = linear_w8a8_block_scaled(x, weight, config="WSB", splits=4)
    for _ in range(3):  # the fixed summation order: the same bits every time
        assert torch.equal(linear_w8a8_block_scaled(x, weight, config="WSB", splits=4).view(torch.int32),
                           D4.view(torch.int32))
    A_q, sA = (t.cuda() for t in quantize_activation_block_scaled_reference(x.cpu(), 128))
    ref, S = _reference(A_q, sA, weight, None, 0)
    _check(D1, ref, S, 8, 1)
    _check(D4, ref, S, 8, 4)


@hopper
@pytest.mark.parametrize("config", sorted(BLOCK_SCALED_CONFIGS))
def test_large_problem(config):
    _run(1000, 4096, 4096, 128, torch.bfloat16, True, 1, config=config, seed=5)


@hopper
def test_zero_tiles_and_zero_blocks_stay_finite():
    D = _run(130, 384, 512, 128, torch.float16, False, 0, seed=11, zero_tile=True)
    assert not bool(D[:, :128].isnan().any())


@hopper
def test_end_to_end_matches_the_library_reference():
    gen = torch.Generator(device="cuda").manual_seed(13)
    weight = _weight(300, 1024, 128, gen)
    x = _activations(33, 1024, 128, torch.bfloat16, gen)
    bias = torch.randn(300, generator=gen, device="cuda")
    D = linear_w8a8_block_scaled(x, weight, bias, "relu6")
    want = linear_block_scaled_reference(x.cpu(), weight.to("cpu"), bias.cpu(), "relu6").cuda()
    A_q, sA = (t.cuda() for t in quantize_activation_block_scaled_reference(x.cpu(), 128))
    _, S = _reference(A_q, sA, weight, bias, 2)
    _check(D, want, S, 8, _splits_used(weight, 33, None, None))


@hopper
def test_plan_is_cached_per_weight_and_rebuilt_after_an_in_place_change():
    gen = torch.Generator(device="cuda").manual_seed(17)
    weight = _weight(256, 512, 128, gen)
    x = _activations(40, 512, 128, torch.float16, gen)
    D1 = linear_w8a8_block_scaled(x, weight)
    plans = plan_cache.stats()["plans"]
    D2 = linear_w8a8_block_scaled(x[:37], weight)  # another M: the same plan, another grid
    assert plan_cache.stats()["plans"] <= plans
    torch.testing.assert_close(D2, D1[:37], rtol=0, atol=0)
    weight.scale.mul_(2)  # the plan's slice scales derive from it: rebuilt
    D3 = linear_w8a8_block_scaled(x, weight)
    torch.testing.assert_close(D3.float(), 2 * D1.float(), rtol=2 ** -10, atol=1e-3)


@hopper
def test_graph_capture_replays_the_kernel():
    gen = torch.Generator(device="cuda").manual_seed(19)
    weight = _weight(512, 1024, 128, gen)
    x = _activations(64, 1024, 128, torch.bfloat16, gen)
    expected = linear_w8a8_block_scaled(x, weight)
    out = torch.empty_like(expected)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        linear_w8a8_block_scaled(x, weight, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.skipif(IS_HOPPER, reason="checks the refusal off Hopper")
def test_other_gpus_get_a_clear_error():
    weight = quantize_weight_block_scaled(torch.randn(64, 256, device="cuda"), 128)
    with pytest.raises(ValueError, match="Hopper"):
        linear_w8a8_block_scaled(torch.randn(3, 256, device="cuda"), weight)
