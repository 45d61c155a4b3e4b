"""CPU tests of the fused scheme-2 W8A8 kernel: it builds (NVRTC and nvcc), and the host side
(validation, QuantA in torch, per-weight preparation) computes what the kernel expects."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from custom_kernels import nvrtc
from custom_kernels.cuda_paths import nvcc_path
from cutlass_ops.formats import QuantizedWeight, quantize_activation_reference
from cutlass_ops import plan_cache
from cutlass_ops.w8a8 import fused as w8a8_fused
from cutlass_ops.w8a8 import tiles
from cutlass_ops.w8a8.fused import linear_w8a8_fused, prepare_weight_w8a8, quantize_activation_torch
from cutlass_ops.w8a8.tiles import BLOCK_SIZES, KERNEL_FILE, TILE_CONFIGS, TileConfig
from _nvcc import nvcc_cubin


def _is_cubin(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", [75, 80, 90, "90a"])
def test_default_variant_compiles(arch):
    assert _is_cubin(nvrtc.compile_file(KERNEL_FILE, arch).data)


@pytest.mark.parametrize("config", sorted(TILE_CONFIGS))
def test_every_tile_variant_compiles_for_hopper(config):
    cfg = TILE_CONFIGS[config]
    cubin = nvrtc.compile_file(cfg.kernel_file, "90a", defines=cfg.defines(128))
    assert _is_cubin(cubin.data)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_wgmma_kernel_compiles_for_every_block_size(block_size):
    cfg = TILE_CONFIGS[tiles.choose_config(4096, 8192, cc=tiles.WGMMA_CC)]  # the Hopper default
    cubin = nvrtc.compile_file(cfg.kernel_file, "90a", defines=cfg.defines(block_size))
    assert _is_cubin(cubin.data)
    # the sm_90a build is the real kernel, not the trap stub that other targets get
    stub = nvrtc.compile_file(cfg.kernel_file, 90, defines=cfg.defines(block_size))
    assert len(cubin.data) > 4 * len(stub.data)


@pytest.mark.parametrize("arch", [75, 80, 90])
def test_wgmma_kernel_builds_a_trap_stub_elsewhere(arch):
    # every kernel compiles for every target; off sm_90a this one only traps (Python never launches it there)
    assert _is_cubin(nvrtc.compile_file(tiles.WGMMA_KERNEL_FILE, arch).data)


def test_wgmma_variant_is_refused_off_hopper():
    assert TILE_CONFIGS[tiles.choose_config(4096, 8192, cc=90)].wgmma
    assert not TILE_CONFIGS[tiles.choose_config(128, 8192, cc=90)].wgmma
    assert not TILE_CONFIGS[tiles.choose_config(4096, 8192, cc=80)].wgmma
    assert not TILE_CONFIGS[tiles.choose_config(16, 8192, cc=90)].wgmma


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("config", ["L", "S"])
def test_every_block_size_compiles_for_sm80(config, block_size):
    defines = TILE_CONFIGS[config].defines(block_size)
    assert _is_cubin(nvrtc.compile_file(KERNEL_FILE, 80, defines=defines).data)


def test_sm75_fallback_compiles_for_every_block_size():
    for block_size in BLOCK_SIZES:
        assert _is_cubin(nvrtc.compile_file(KERNEL_FILE, 75, defines=TILE_CONFIGS["M"].defines(block_size)).data)


def test_bad_block_size_is_a_compile_error():
    with pytest.raises(nvrtc.KernelCompileError, match="block_size"):
        nvrtc.compile_file(KERNEL_FILE, 80, defines={"W8A8_BLOCK_SIZE": 48}, use_cache=False)


def test_plain_nvcc_builds_sm80(tmp_path):
    try:
        nvcc_path()
    except RuntimeError:
        pytest.skip("nvcc is not installed")
    assert _is_cubin(nvcc_cubin(KERNEL_FILE, tmp_path))


def test_smem_formula_matches_the_kernel_header():
    # the .cu header states the formula; the L variant at block 128 needs
    # 4 * (128*64 + 128*64 + 16*256*1) + 16*256 = 86016 bytes
    assert TILE_CONFIGS["L"].smem_bytes(128) == 86016
    # block 32 with BK=128 holds 4 parameter slots per stage
    assert TILE_CONFIGS["S"].smem_bytes(32) == 4 * (32 * 128 + 64 * 128 + 16 * 96 * 4) + 16 * 96
    # wgmma: 4 * (2*128*128 + 128*16) + 1024 alignment + 4 barrier pairs
    assert TILE_CONFIGS["W"].smem_bytes(128) == 4 * (2 * 128 * 128 + 128 * 16) + 1024 + 16 * 4
    assert TILE_CONFIGS["W"].smem_bytes(32) == 4 * (2 * 128 * 128 + 4 * 128 * 16) + 1024 + 16 * 4
    # N split: 4096 bytes of column and row planes per block
    assert TILE_CONFIGS["WN"].smem_bytes(32) == 4 * (2 * 128 * 128 + 4 * 4096) + 1024 + 16 * 4
    # ping-pong 128 x 192: A 128 x 128 + B 192 x 128 + one 4096-byte parameter slot per stage
    assert TILE_CONFIGS["WP"].smem_bytes(128) == 4 * (128 * 128 + 192 * 128 + 4096) + 1024 + 16 * 4
    for cfg in TILE_CONFIGS.values():
        for bs in BLOCK_SIZES:
            assert cfg.smem_bytes(bs) <= 227 * 1024, (cfg.name, bs)  # Hopper's per-block limit


# ----------------------------------------------------------------------------------------------
# host side on the CPU
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_torch_quant_a_is_bit_identical_to_the_reference(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(7, 256, generator=g) * torch.logspace(-3, 2, 7)[:, None]).to(dtype)
    x[2, 64:128] = 0.75  # a zero-range block
    x[3] = 0.0
    for block_size in (32, 64, 128):
        got = quantize_activation_torch(x, block_size)
        want = quantize_activation_reference(x, block_size)
        for a, b, name in zip(got, want, ("A_q", "scale", "offset", "sum_q")):
            assert a.dtype == b.dtype, name
            assert torch.equal(a, b), f"{name} differs for {dtype}, block_size={block_size}"


def _random_weight(N, K, block_size, seed=0) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    G = K // block_size
    scale = torch.rand(N, G, generator=g) * 0.02 + 1e-3
    offset = torch.randn(N, G, generator=g) * 0.05
    return QuantizedWeight(q, scale, offset, 8, block_size, N, K, None, False)


def test_prepare_weight_builds_the_column_vectors():
    qw = _random_weight(5, 128, 32)
    prep = prepare_weight_w8a8(qw, device="cpu")
    sumB = qw.qweight.to(torch.int64).reshape(5, 4, 32).sum(-1)
    assert torch.equal(prep["sumB"], sumB.to(torch.int32))
    bvec = prep["bvec"]
    assert bvec.shape == (4, 5, 4) and bvec.dtype == torch.float32 and bvec.is_contiguous()
    assert torch.equal(bvec[..., 0], qw.scale.T) and torch.equal(bvec[..., 1], qw.offset.T)
    q64 = qw.scale.double() * sumB.double() + 32 * qw.offset.double()
    assert torch.equal(bvec[..., 2], q64.float().T)
    assert torch.equal(bvec[..., 3], torch.zeros(4, 5))
    assert prepare_weight_w8a8(qw, device="cpu") is prep  # cached in the plan cache
    assert not [k for k in vars(qw) if k.startswith("_")]  # nothing stored on the weight
    qw.scale.mul_(2)  # an in-place change invalidates the cache
    again = prepare_weight_w8a8(qw, device="cpu")
    assert again is not prep and torch.equal(again["bvec"][..., 0], qw.scale.T)


def test_prepared_weight_still_pickles():
    import pickle

    qw = _random_weight(5, 128, 32)
    prepare_weight_w8a8(qw, device="cpu")
    back = pickle.loads(pickle.dumps(qw))
    assert torch.equal(back.qweight, qw.qweight) and torch.equal(back.scale, qw.scale)
    assert plan_cache.stats()["plans"] >= 1


def test_rejects_int4_and_unsupported_block_sizes():
    qw = _random_weight(4, 96, 96)
    with pytest.raises(ValueError, match="block_size"):
        prepare_weight_w8a8(qw, device="cpu")
    qw4 = QuantizedWeight(torch.zeros(4, 32, dtype=torch.uint8), torch.ones(4, 2), torch.zeros(4, 2), 4, 32,
                          4, 64, None, True)
    with pytest.raises(ValueError, match="bits=8"):
        prepare_weight_w8a8(qw4, device="cpu")


def test_linear_validates_before_touching_the_gpu():
    qw = _random_weight(8, 128, 64)
    x = torch.randn(3, 128)
    with pytest.raises(ValueError, match="K=96"):
        linear_w8a8_fused(torch.randn(3, 96), qw)
    with pytest.raises(TypeError, match="x2d"):
        linear_w8a8_fused(x.to(torch.int32), qw)
    with pytest.raises(ValueError, match="bias"):
        linear_w8a8_fused(x, qw, torch.zeros(7))
    with pytest.raises(ValueError, match="activation|act"):
        linear_w8a8_fused(x, qw, act=5)
    with pytest.raises(ValueError, match="config"):
        linear_w8a8_fused(x, qw, config="XL")
    with pytest.raises(ValueError, match="CUDA"):
        linear_w8a8_fused(x, qw)


def test_k_not_a_multiple_of_the_block_is_named():
    # a weight whose block does not divide K cannot even be built; the kernel's own check names K
    with pytest.raises(ValueError, match="K=100"):
        w8a8_fused._check_block_size(64, 100)
    with pytest.raises(ValueError, match="block_size=48"):
        w8a8_fused._check_block_size(48, 96)


@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="cuobjdump not installed")
def test_hopper_build_uses_int8_tensor_cores(tmp_path):
    cubin = nvrtc.compile_file(KERNEL_FILE, "90a")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin.data)
    sass = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True).stdout
    assert "IMMA.16832.S8.S8" in sass and "LDSM" in sass and "LDGSTS" in sass


def test_n_split_without_planes_is_refused():
    with pytest.raises(ValueError, match="planes"):
        TileConfig("bad", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True,
                   tma=True, nsplit=True)
    assert TILE_CONFIGS["WN"].defines(128)["W8A8W_PLANES"] == 1 and TILE_CONFIGS["WM"].defines(128)["W8A8W_NSPLIT"] == 0


def _wgmma_config(**kw):
    args = dict(BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
                planes=True)
    args.update(kw)
    return TileConfig("bad", **args)


def test_ping_pong_and_wide_tile_rules():
    with pytest.raises(ValueError, match="ping-pong consumer is the M split"):
        _wgmma_config(pingpong=True, nsplit=True)
    with pytest.raises(ValueError, match="ping-pong consumer is the M split"):
        _wgmma_config(pingpong=True, planes=False)
    with pytest.raises(ValueError, match="BN = 192 needs the ping-pong"):
        _wgmma_config(BN=192)
    with pytest.raises(ValueError, match="BN = 128 or 192"):
        _wgmma_config(BN=256, pingpong=True)
    with pytest.raises(ValueError, match="128 x BN x 128"):
        _wgmma_config(BM=64, pingpong=True)
    wp = TILE_CONFIGS["WP"].defines(128)
    assert (wp["W8A8W_BN"], wp["W8A8W_PINGPONG"], wp["W8A8W_NSPLIT"]) == (192, 1, 0)
    assert TILE_CONFIGS["WN"].defines(128)["W8A8W_PINGPONG"] == 0


def test_hopper_default_by_M():
    cc = tiles.WGMMA_CC
    assert tiles.choose_config(tiles.WP_MIN_M, 8192, cc=cc) == "WP"
    assert tiles.choose_config(tiles.WP_MIN_M - 1, 8192, cc=cc) == "WN"
    assert tiles.choose_config(4096, 8192, cc=80) != "WP"
