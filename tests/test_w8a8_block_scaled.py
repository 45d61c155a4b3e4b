"""CPU tests of the block-scaled symmetric W8A8 scheme (cutlass_ops/w8a8/block_scaled.py): the weight
format and quantizer, the activation reference, the float64 GEMM reference, the layouts the Hopper
kernel reads, the entry's checks before any GPU work, and the kernels' builds (NVRTC)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from custom_kernels import nvrtc
from cutlass_ops.w8a8 import tiles
from cutlass_ops.w8a8.block_scaled import (BlockScaledWeight, linear_block_scaled_reference,
                                           linear_w8a8_block_scaled, quantize_activation_block_scaled_reference,
                                           quantize_weight_block_scaled, row_scale_planes, slice_scales)
from cutlass_ops.w8a8.tiles import BLOCK_SCALED_CONFIGS, BLOCK_SCALED_SIZES, TILE_CONFIGS

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _integer_tiles(N: int, K: int, bs: int, gen: torch.Generator):
    """(w float32 [N, K], q int8, scale [NB, G]): q in [-127, 127] with a +-127 in every tile, scales powers
    of two, so w = q * scale is exact in every float format and its quantization is exactly (q, scale)."""
    NB, G = -(-N // bs), K // bs
    q = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int32)
    for b in range(NB):
        for j in range(G):
            q[b * bs, j * bs] = 127 if (b + j) % 2 else -127
    scale = 2.0 ** torch.randint(-12, 4, (NB, G), generator=gen).float()
    w = q.float() * scale.repeat_interleave(bs, 0)[:N].repeat_interleave(bs, 1)
    return w, q.to(torch.int8), scale


# ------------------------------------------------------------------------------------------------
# weight format and quantizer
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N, K, bs", [(128, 128, 128), (200, 384, 128), (1, 256, 128), (130, 192, 64),
                                      (300, 512, 256)])
def test_integer_valued_tiles_round_trip_exactly(dtype, N, K, bs):
    w, q, scale = _integer_tiles(N, K, bs, torch.Generator().manual_seed(N + K))
    qw = quantize_weight_block_scaled(w.to(dtype), bs)
    assert (qw.N, qw.K, qw.block_size, qw.num_groups) == (N, K, bs, K // bs)
    assert qw.qweight.dtype == torch.int8 and qw.scale.dtype == torch.float32
    assert qw.scale.shape == (-(-N // bs), K // bs)
    assert torch.equal(qw.qweight, q) and torch.equal(qw.scale, scale)
    assert torch.equal(qw.dequantize(), w)
    assert torch.equal(qw.dequantize(torch.float64), w.double())


def test_ragged_last_n_block_uses_only_its_rows():
    gen = torch.Generator().manual_seed(3)
    N, K, bs = 200, 256, 128
    w = torch.randn(N, K, generator=gen)
    w[:128] *= 100.0  # the first N block is much larger: it must not leak into the second
    qw = quantize_weight_block_scaled(w, bs)
    for b in range(2):
        for j in range(2):
            tile = w[b * bs:(b + 1) * bs, j * bs:(j + 1) * bs]
            want = torch.tensor([tile.abs().max().item()], dtype=torch.float32) / torch.tensor([127.0])
            assert qw.scale[b, j] == want[0], (b, j)
            assert int(qw.qweight[b * bs:(b + 1) * bs, j * bs:(j + 1) * bs].abs().max()) == 127
    # |q - w / scale| <= 1/2 + 127 * 2^-24 (the rounding of w / scale)
    err = (qw.dequantize(torch.float64) - w.double()).abs()
    assert bool((err <= qw.scale_per_element(torch.float64) * (0.5 + 1e-5)).all())


def test_half_even_rounding_and_clamp():
    bs = 64
    w = torch.zeros(64, 64)
    w[0, :6] = torch.tensor([127.0, 2.5, 3.5, -2.5, -0.5, 126.5])  # scale 1: ties go to the even integer
    qw = quantize_weight_block_scaled(w, bs)
    assert qw.scale.item() == 1.0
    assert qw.qweight[0, :6].tolist() == [127, 2, 4, -2, 0, 126]


def test_zero_and_underflowing_tiles_get_scale_zero_and_q_zero():
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    w[:128, 128:] = 0.0
    w[128:, :128] = 1e-44  # amax / 127 underflows to 0 in float32
    qw = quantize_weight_block_scaled(w, 128)
    assert qw.scale[0, 1] == 0 and qw.scale[1, 0] == 0 and bool((qw.scale[0, 0] > 0) & (qw.scale[1, 1] > 0))
    assert not bool(qw.qweight[:128, 128:].any()) and not bool(qw.qweight[128:, :128].any())
    assert bool(torch.isfinite(qw.dequantize()).all())


def test_quantizer_arithmetic_matches_numpy_float32():
    """An independent evaluation (numpy float32, one IEEE rounding per op) of scale and q, tile by tile."""
    gen = torch.Generator().manual_seed(5)
    N, K, bs = 70, 192, 64
    w = (torch.randn(N, K, generator=gen) * torch.logspace(-3, 3, N)[:, None]).to(torch.bfloat16)
    qw = quantize_weight_block_scaled(w, bs)
    wn = w.float().numpy()
    for b in range(-(-N // bs)):
        for j in range(K // bs):
            tile = wn[b * bs:(b + 1) * bs, j * bs:(j + 1) * bs]
            s = np.float32(np.abs(tile).max()) / np.float32(127)
            assert qw.scale[b, j].item() == s
            q = np.clip(np.rint(tile / s), -127, 127).astype(np.int8)
            assert np.array_equal(qw.qweight[b * bs:(b + 1) * bs, j * bs:(j + 1) * bs].numpy(), q)


def test_weight_quantizer_errors_name_the_argument():
    with pytest.raises(ValueError, match="K=200.*block_size=128"):
        quantize_weight_block_scaled(torch.randn(8, 200))
    with pytest.raises(TypeError, match="w must have dtype"):
        quantize_weight_block_scaled(torch.randn(8, 128, dtype=torch.float64))
    with pytest.raises(TypeError, match="w must have dtype"):
        quantize_weight_block_scaled(torch.ones(8, 128, dtype=torch.int32))
    with pytest.raises(ValueError, match="w must be 2-D"):
        quantize_weight_block_scaled(torch.randn(2, 8, 128))
    for bad in (float("nan"), float("inf"), -float("inf")):
        w = torch.randn(8, 128)
        w[3, 7] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            quantize_weight_block_scaled(w)
    with pytest.raises(TypeError, match="block_size"):
        quantize_weight_block_scaled(torch.randn(8, 128), block_size=64.0)
    with pytest.raises(ValueError, match="block_size"):
        quantize_weight_block_scaled(torch.randn(8, 128), block_size=0)


def test_weight_format_checks_its_fields():
    q, s = torch.zeros(200, 256, dtype=torch.int8), torch.ones(2, 2)
    assert BlockScaledWeight(q, s).N == 200
    with pytest.raises(ValueError, match=r"BlockScaledWeight.scale must have shape \(2, 2\)"):
        BlockScaledWeight(q, torch.ones(1, 2))
    with pytest.raises(TypeError, match="BlockScaledWeight.scale must have dtype float32"):
        BlockScaledWeight(q, s.double())
    with pytest.raises(TypeError, match="BlockScaledWeight.qweight must have dtype int8"):
        BlockScaledWeight(q.to(torch.uint8), s)
    with pytest.raises(ValueError, match="K=256 must be a multiple of BlockScaledWeight.block_size=96"):
        BlockScaledWeight(q, torch.ones(3, 2), block_size=96)
    with pytest.raises(ValueError, match="NaN or Inf"):
        BlockScaledWeight(q, torch.full((2, 2), float("nan")))
    qw = BlockScaledWeight(q, s)
    with pytest.raises(AttributeError):
        qw.block_size = 64  # frozen
    moved = qw.to("cpu")
    assert moved.qweight.device.type == "cpu" and moved.block_size == 128


# ------------------------------------------------------------------------------------------------
# activation reference
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_reference_matches_numpy_float32(dtype):
    gen = torch.Generator().manual_seed(7)
    M, K, bs = 9, 384, 128
    x = (torch.randn(M, K, generator=gen) * torch.logspace(-3, 3, M)[:, None]).to(dtype)
    x[2, 128:256] = 0.0  # zero block: scale 1, q 0
    x[3, :128] = -0.0
    x[4, 256:] = 127.0 * torch.randint(-1, 2, (128,), generator=gen)  # amax 127 or 0
    x[5, 256:] = 0.0
    x[5, 256:262] = torch.tensor([127.0, 2.5, 3.5, -2.5, -0.5, 126.5])  # scale 1: ties to even
    A_q, scale = quantize_activation_block_scaled_reference(x, bs)
    assert A_q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (M, K // bs)
    xn = x.float().numpy()
    for m in range(M):
        for j in range(K // bs):
            blk = xn[m, j * bs:(j + 1) * bs]
            s = np.float32(np.abs(blk).max()) / np.float32(127)
            s = np.float32(1) if s == 0 else s
            assert scale[m, j].item() == s, (m, j)
            q = np.clip(np.rint(blk / s), -127, 127).astype(np.int8)
            assert np.array_equal(A_q[m, j * bs:(j + 1) * bs].numpy(), q), (m, j)
    assert scale[2, 1] == 1 and scale[3, 0] == 1 and not bool(A_q[2, 128:256].any())
    assert scale[5, 2] == 1 and A_q[5, 256:262].tolist() == [127, 2, 4, -2, 0, 126]


def test_activation_integer_blocks_round_trip():
    x = torch.randint(-127, 128, (5, 256), dtype=torch.int32).float()
    x[:, 0] = 127.0
    x[:, 128] = -127.0
    A_q, scale = quantize_activation_block_scaled_reference(x.half(), 128)
    assert torch.equal(scale, torch.ones(5, 2)) and torch.equal(A_q.float(), x)


def test_activation_reference_errors():
    with pytest.raises(ValueError, match="K=100 must be a multiple of block_size=64"):
        quantize_activation_block_scaled_reference(torch.randn(3, 100), 64)
    with pytest.raises(TypeError, match="x2d must have dtype"):
        quantize_activation_block_scaled_reference(torch.randn(3, 128).double(), 128)
    with pytest.raises(ValueError, match="x2d must be 2-D"):
        quantize_activation_block_scaled_reference(torch.randn(128), 128)
    x = torch.randn(3, 128)
    x[1, 5] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_activation_block_scaled_reference(x, 128)


# ------------------------------------------------------------------------------------------------
# float64 GEMM reference
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M, N, K, bs, act, with_bias", [(5, 200, 384, 128, 0, True), (1, 128, 128, 128, 1, False),
                                                          (17, 130, 192, 64, 2, True), (3, 300, 512, 256, 1, True)])
def test_reference_equals_float64_einsum_of_dequantized_operands(M, N, K, bs, act, with_bias):
    gen = torch.Generator().manual_seed(M * N)
    w = torch.randn(N, K, generator=gen) * torch.logspace(-2, 2, N)[:, None]
    qw = quantize_weight_block_scaled(w, bs)
    x = torch.randn(M, K, generator=gen) * 3
    bias = torch.randn(N, generator=gen).half() if with_bias else None
    got = linear_block_scaled_reference(x, qw, bias, act)
    assert got.dtype == torch.float64 and got.shape == (M, N)
    A_q, sA = quantize_activation_block_scaled_reference(x, bs)
    x_deq = A_q.double() * sA.double().repeat_interleave(bs, 1)
    want = torch.einsum("mk,nk->mn", x_deq, qw.dequantize(torch.float64))
    if bias is not None:
        want = want + bias.double()
    want = want.clamp_min(0) if act == 1 else want.clamp(0, 6) if act == 2 else want
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))
    if act == 0:  # and the scheme approximates the float product to int8 accuracy
        exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
        assert float((got - exact).norm() / exact.norm()) < 0.05


def test_reference_takes_leading_dims_and_given_quantization():
    gen = torch.Generator().manual_seed(1)
    qw = quantize_weight_block_scaled(torch.randn(64, 256, generator=gen), 128)
    x = torch.randn(2, 3, 256, generator=gen)
    D = linear_block_scaled_reference(x, qw, None, "relu")
    assert D.shape == (2, 3, 64)
    given = quantize_activation_block_scaled_reference(x.reshape(6, 256), 128)
    assert torch.equal(linear_block_scaled_reference(x, qw, None, 1, quantized_A=given).reshape(6, 64),
                       D.reshape(6, 64))
    with pytest.raises(ValueError, match="K=128 columns but weight has K=256"):
        linear_block_scaled_reference(torch.randn(2, 128), qw)
    with pytest.raises(TypeError, match="BlockScaledWeight"):
        linear_block_scaled_reference(x, object())


# ------------------------------------------------------------------------------------------------
# the kernel's layouts
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N, bs, BN", [(1000, 128, 128), (1000, 128, 192), (200, 64, 192), (300, 256, 192),
                                       (129, 256, 128), (64, 64, 128)])
def test_slice_scales_give_each_64_column_slice_its_weight_block(N, bs, BN):
    NB, G = -(-N // bs), 3
    scale = torch.arange(1, NB * G + 1, dtype=torch.float32).reshape(NB, G)
    got = slice_scales(scale, N, bs, BN)
    tiles_n = -(-N // BN)
    assert got.shape == (G, tiles_n, 4) and got.is_contiguous()
    for j in range(G):
        for t in range(tiles_n):
            for s in range(4):
                col = t * BN + 64 * s
                want = scale[col // bs, j].item() if s < BN // 64 and col < N else 0.0
                assert got[j, t, s].item() == want, (j, t, s)
    with pytest.raises(ValueError, match="block_size"):
        slice_scales(scale, N, 32, BN)


@pytest.mark.parametrize("config", sorted(BLOCK_SCALED_CONFIGS))
@pytest.mark.parametrize("bs", BLOCK_SCALED_SIZES)
def test_the_kernels_reads_of_the_two_layouts_give_sA_times_sW(config, bs):
    """What w8a8_kblock_wgmma.cu (W8A8W_BLOCK_SCALED) forms per element (m, n) of CTA tile t = n // BN and
    block j: f = sA_plane[j, m] * slices[j, t, (n % BN) // 64] (the producer copies float4 j * tiles_n + t and
    rows m0.. of plane j) - equal, bit for bit, to sA[m, j] * sW[n // bs, j] in float32."""
    BN = BLOCK_SCALED_CONFIGS[config].BN
    M, N, K = 9, 1000, 3 * 256
    gen = torch.Generator().manual_seed(bs)
    qw = quantize_weight_block_scaled(torch.randn(N, K, generator=gen) * 10.0 ** torch.randint(-3, 3, (N, 1)), bs)
    _, sA = quantize_activation_block_scaled_reference(torch.randn(M, K, generator=gen), bs)
    planes, slices = row_scale_planes(sA), slice_scales(qw.scale, N, bs, BN)
    n = torch.arange(N)
    for j in range(K // bs):
        f = planes[j, :M, None] * slices[j][n // BN, (n % BN) // 64][None, :]
        want = sA[:, j, None] * qw.scale[n // bs, j][None, :]
        assert torch.equal(f, want), j


def test_row_scale_planes_layout():
    scale = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    planes = row_scale_planes(scale)
    assert planes.shape == (3, 8)
    assert torch.equal(planes[:, :5], scale.T) and not bool(planes[:, 5:].any())


# ------------------------------------------------------------------------------------------------
# the GPU entry's checks (all before any GPU work) and the variants
# ------------------------------------------------------------------------------------------------

def test_entry_validates_before_touching_the_gpu():
    qw = quantize_weight_block_scaled(torch.randn(64, 256), 128)
    x = torch.randn(3, 256)
    with pytest.raises(TypeError, match="BlockScaledWeight"):
        linear_w8a8_block_scaled(x, object())
    with pytest.raises(ValueError, match="K=128 columns but weight has K=256"):
        linear_w8a8_block_scaled(torch.randn(3, 128), qw)
    with pytest.raises(TypeError, match="x2d must have dtype"):
        linear_w8a8_block_scaled(x.to(torch.int32), qw)
    with pytest.raises(ValueError, match="bias must have shape"):
        linear_w8a8_block_scaled(x, qw, torch.zeros(7))
    with pytest.raises(ValueError, match="act"):
        linear_w8a8_block_scaled(x, qw, act=5)
    with pytest.raises(ValueError, match="config must be one of"):
        linear_w8a8_block_scaled(x, qw, config="WP")  # an offset-form variant is not a block-scaled one
    with pytest.raises(ValueError, match="block_size in"):
        linear_w8a8_block_scaled(x, quantize_weight_block_scaled(torch.randn(64, 256), 32))
    with pytest.raises(ValueError, match="CUDA"):
        linear_w8a8_block_scaled(x, qw)


def test_block_scaled_variants_are_apart_from_the_offset_form():
    assert not set(BLOCK_SCALED_CONFIGS) & set(TILE_CONFIGS)
    for cfg in TILE_CONFIGS.values():  # the existing variants' defines (and NVRTC cache keys) are unchanged
        assert "W8A8W_BLOCK_SCALED" not in cfg.defines(128)
    for cfg in BLOCK_SCALED_CONFIGS.values():
        assert cfg.block_scaled and cfg.wgmma and cfg.tma and cfg.planes
        assert cfg.defines(128)["W8A8W_BLOCK_SCALED"] == 1
        for bs in BLOCK_SCALED_SIZES:
            # a 1024-byte slot per block and stage: the slice scales (16 bytes) and up to 128 row scales
            assert cfg.smem_bytes(bs) == (cfg.stages * (cfg.BM * 128 + cfg.BN * 128 + 1024 * max(1, 128 // bs))
                                          + 1024 + 16 * cfg.stages)
            assert cfg.smem_bytes(bs) <= 227 * 1024, (cfg.name, bs)  # Hopper's per-block limit
    with pytest.raises(ValueError, match="block-scaled variant is the wgmma kernel"):
        tiles.TileConfig("bad", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True,
                         tma=True, block_scaled=True)
    assert tiles.choose_block_scaled_config(4096, 8192) in BLOCK_SCALED_CONFIGS
    assert tiles.choose_block_scaled_config(1, 8192) in BLOCK_SCALED_CONFIGS


def test_small_m_variant_is_the_64_row_n_split():
    wsb = BLOCK_SCALED_CONFIGS["WSB"]
    assert (wsb.BM, wsb.BN, wsb.nsplit, wsb.stages) == (64, 128, True, 8)
    assert wsb.defines(128)["W8A8W_BM"] == 64
    for cfg in [*TILE_CONFIGS.values(), *(c for c in BLOCK_SCALED_CONFIGS.values() if c.BM == 128)]:
        assert "W8A8W_BM" not in cfg.defines(128)  # the other variants' defines and cache keys are unchanged
    # BM = 64 is the block-scaled N split only
    common = dict(BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True, planes=True)
    with pytest.raises(ValueError, match="128 x BN x 128"):
        tiles.TileConfig("bad", BM=64, nsplit=False, block_scaled=True, **common)
    with pytest.raises(ValueError, match="128 x BN x 128"):
        tiles.TileConfig("bad", BM=64, nsplit=True, block_scaled=False, **common)
    with pytest.raises(ValueError, match="128 x BN x 128"):
        tiles.TileConfig("bad", BM=32, nsplit=True, block_scaled=True, **common)
    # defaults: WSB up to BLOCK_SCALED_SMALL_M, WMB to WP_MIN_M, WPB from there
    assert [tiles.choose_block_scaled_config(M, 8192) for M in (1, 16, 64, 65, 128, 2047, 2048)] == \
        ["WSB", "WSB", "WSB", "WMB", "WMB", "WMB", "WPB"]
    assert tiles.block_scaled_default_Ms() == (1, tiles.BLOCK_SCALED_SMALL_M + 1, tiles.WP_MIN_M)


@pytest.mark.parametrize("K, bs, units", [(8192, 128, 64), (8192, 64, 64), (8192, 256, 32), (192, 64, 2),
                                          (576, 64, 5), (1280, 256, 5), (128, 128, 1)])
def test_k_units_are_whole_blocks_and_whole_k_tiles(K, bs, units):
    assert tiles.k_units(K, bs) == units


@pytest.mark.parametrize("config, M, N, K, sms, splits", [
    ("WSB", 16, 8192, 8192, 132, 2),     # 64 tiles: two slices make 128 CTAs
    ("WSB", 64, 8192, 8192, 132, 2),
    ("WSB", 65, 8192, 8192, 132, 1),     # 128 tiles
    ("WSB", 128, 8192, 8192, 132, 1),
    ("WMB", 16, 8192, 8192, 132, 2),
    ("WPB", 16, 8192, 8192, 132, 3),     # 43 tiles of 192 columns
    ("WSB", 1, 4096, 8192, 132, 4),      # 32 tiles
    ("WSB", 1, 1024, 8192, 132, 16),     # 8 tiles: 16 slices of 4 units
    ("WSB", 1, 128, 8192, 132, 16),      # 1 tile: at most MAX_SPLITS
    ("WSB", 1, 1024, 1024, 132, 2),      # 8 units: each slice keeps >= 4
    ("WSB", 1, 1024, 512, 132, 1),
    ("WSB", 16, 8192, 8192, 78, 1),      # a smaller GPU: 64 tiles already fill most of it
])
def test_split_k_fills_one_wave(config, M, N, K, sms, splits):
    cfg = BLOCK_SCALED_CONFIGS[config]
    got = tiles.choose_splits(cfg, M, N, K, 128, sms)
    assert got == splits
    tiles_mn = -(-M // cfg.BM) * -(-N // cfg.BN)
    assert 1 <= got <= tiles.MAX_SPLITS and got <= tiles.k_units(K, 128)
    assert got == 1 or tiles_mn * got <= sms


def test_splits_are_checked_before_touching_the_gpu():
    qw = quantize_weight_block_scaled(torch.randn(64, 256), 128)
    x = torch.randn(3, 256)
    with pytest.raises(ValueError, match="splits must be >= 1"):
        linear_w8a8_block_scaled(x, qw, splits=0)
    with pytest.raises(TypeError, match="splits must be an int"):
        linear_w8a8_block_scaled(x, qw, splits=2.0)
    with pytest.raises(ValueError, match=r"splits=3 is more than K=256 has"):
        linear_w8a8_block_scaled(x, qw, splits=3)  # two units of 128 columns
    with pytest.raises(ValueError, match="CUDA"):  # a valid count passes the checks
        linear_w8a8_block_scaled(x, qw, splits=2)


# ------------------------------------------------------------------------------------------------
# builds (NVRTC; no GPU needed)
# ------------------------------------------------------------------------------------------------

def _is_cubin(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("config", sorted(BLOCK_SCALED_CONFIGS))
def test_every_block_scaled_variant_compiles_for_hopper(config):
    cfg = BLOCK_SCALED_CONFIGS[config]
    cubin = nvrtc.compile_file(cfg.kernel_file, "90a", defines=cfg.defines(128))
    assert _is_cubin(cubin.data)
    stub = nvrtc.compile_file(cfg.kernel_file, 80, defines=cfg.defines(128))  # elsewhere: the trap stub
    assert _is_cubin(stub.data) and len(cubin.data) > 4 * len(stub.data)


@pytest.mark.parametrize("block_size", [64, 256])
@pytest.mark.parametrize("config", ["WNB", "WSB"])
def test_block_scaled_kernel_compiles_for_the_other_block_sizes(config, block_size):
    cfg = BLOCK_SCALED_CONFIGS[config]
    assert _is_cubin(nvrtc.compile_file(cfg.kernel_file, "90a", defines=cfg.defines(block_size)).data)


def test_split_k_reduce_is_in_the_block_scaled_module_only():
    from cutlass_ops.w8a8.block_scaled_plan import REDUCE_KERNEL

    name = REDUCE_KERNEL.encode()
    cfg = BLOCK_SCALED_CONFIGS["WSB"]
    assert name in nvrtc.compile_file(cfg.kernel_file, "90a", defines=cfg.defines(128)).data
    offset_form = TILE_CONFIGS["WN"]  # the offset-form modules are as they were: no reduce
    assert name not in nvrtc.compile_file(offset_form.kernel_file, "90a", defines=offset_form.defines(128)).data


def test_bm_64_is_refused_outside_the_block_scaled_n_split():
    defines = {**TILE_CONFIGS["WN"].defines(128), "W8A8W_BM": 64}  # offset form
    with pytest.raises(nvrtc.KernelCompileError, match="BM = 64"):
        nvrtc.compile_file(tiles.WGMMA_KERNEL_FILE, "90a", defines=defines, use_cache=False)


def test_block_scaled_kernel_refuses_block_32():
    # a 64-column slice of a tile would span two weight blocks
    with pytest.raises(nvrtc.KernelCompileError, match="64-column slice"):
        nvrtc.compile_file(tiles.WGMMA_KERNEL_FILE, "90a", defines=BLOCK_SCALED_CONFIGS["WNB"].defines(32),
                           use_cache=False)


@pytest.mark.parametrize("arch", [75, 80, 90, "90a"])
def test_symmetric_quant_a_compiles(arch):
    assert _is_cubin(nvrtc.compile_file("quant_a.cu", arch, defines={"QUANT_A_SYMMETRIC": 1}).data)
