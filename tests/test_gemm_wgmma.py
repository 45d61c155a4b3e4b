"""CPU tests of strategy "gemm_wgmma" (custom_kernels/kernels/gemm_wgmma.cu, cutlass_ops/weight_only/gemm_wgmma.py):
the kernel builds with NVRTC for sm_90a in every config field's variants (and as a trapping stub for sm_80) and with
plain nvcc, the host mirrors the kernel's constants and parameters, and the config, shared-memory and launch-shape
logic is right. No GPU needed (the GPU tests are tests/gpu/test_gemm_wgmma_gpu.py).
"""
from __future__ import annotations

import re

import pytest

from custom_kernels import compile_file
from custom_kernels.nvrtc import KERNEL_DIR
from cutlass_ops import weight_only as wo
from cutlass_ops.weight_only import gemm_wgmma, variants
from cutlass_ops.weight_only.variants import (
    GemmWgmmaConfig, default_gemm_wgmma_config, gemm_wgmma_smem, wgmma_launch_shape, wgmma_tiles,
)
from _nvcc import nvcc_build, nvcc_cubin

SOURCE = "gemm_wgmma.cu"
ENTRIES = [f"gemm_wgmma_mt{mt}" for mt in variants.WGMMA_M_TILES]
VARIANTS = [default_gemm_wgmma_config(64), GemmWgmmaConfig(), default_gemm_wgmma_config(1),
            GemmWgmmaConfig(warpgroups=1, stages=2), GemmWgmmaConfig(overlap=1, prefetch=4, stages=3),
            GemmWgmmaConfig(stages=6, prefetch=8, min_blocks=2), GemmWgmmaConfig(warpgroups=4, stages=3, cluster=1)]
# every (element, bits) target with the int4 default; each other variant with one target in turn
TARGETS = [(0, 4), (1, 4), (0, 8), (1, 8)]
BUILDS = [(e, b, VARIANTS[0]) for e, b in TARGETS] + [(*TARGETS[i % 4], cfg) for i, cfg in enumerate(VARIANTS[1:])]


def _has(data: bytes, name: str) -> bool:
    return b"\0" + name.encode() + b"\0" in data


@pytest.mark.parametrize("build", BUILDS, ids=lambda b: f"e{b[0]}-int{b[1]}-{'-'.join(map(str, b[2].defines().values())) or 'default'}")
def test_nvrtc_builds_every_variant_for_sm90a(build):
    element, bits, cfg = build
    cubin = compile_file(SOURCE, "90a", defines={"WO_ELEMENT": element, "WO_BITS": bits, **cfg.defines()})
    assert cubin.data[:4] == b"\x7fELF"
    assert all(_has(cubin.data, e) for e in ENTRIES)


def test_other_archs_build_the_stub():
    """Off sm_90a the entry points exist (one module per file and arch) and only trap: the host never picks them."""
    cubin = compile_file(SOURCE, "80", defines={"WO_ELEMENT": 0, "WO_BITS": 4})
    assert all(_has(cubin.data, e) for e in ENTRIES)


def test_plain_nvcc_builds(tmp_path):
    cubin = nvcc_cubin(SOURCE, tmp_path, arch="sm_90a")
    assert all(_has(cubin, e) for e in ENTRIES)


def _source() -> str:
    return (KERNEL_DIR / SOURCE).read_text()


def _define(name: str) -> int:
    match = re.search(rf"#define {name} (\d+)\n", _source())
    assert match, f"{SOURCE} has no #define {name}"
    return int(match.group(1))


def test_host_mirrors_kernel_constants():
    base = GemmWgmmaConfig()
    for field in ("warpgroups", "stages", "prefetch", "min_blocks", "overlap", "cluster"):
        assert getattr(base, field) == _define(f"GEMM_WGMMA_{field.upper()}"), field
    assert base.defines() == {}
    assert re.search(rf"constexpr int kStageElems = {variants.WGMMA_STAGE_ELEMS};", _source())
    assert re.search(rf"constexpr int kMaxClusterSplits = {variants.WGMMA_MAX_CLUSTER};", _source())
    assert [int(m) for m in re.findall(r"^GEMM_WGMMA_ENTRY\((\d+)\)$", _source(), re.M)] == list(variants.WGMMA_M_TILES)


def test_config_checks_and_defines():
    assert GemmWgmmaConfig(stages=3, min_blocks=2, overlap=1).defines() == {
        "GEMM_WGMMA_STAGES": 3, "GEMM_WGMMA_MIN_BLOCKS": 2, "GEMM_WGMMA_OVERLAP": 1}
    for kwargs in ({"warpgroups": 3}, {"stages": 1}, {"stages": 7}, {"prefetch": 3}, {"overlap": 2},
                   {"min_blocks": 0}, {"splits": 0}, {"splits": True}, {"cluster": 2}):
        with pytest.raises(ValueError, match=f"GemmWgmmaConfig.{next(iter(kwargs))}"):
            GemmWgmmaConfig(**kwargs)
    with pytest.raises(ValueError, match="GemmWgmmaConfig.stages must be >= 3 with overlap=1"):
        GemmWgmmaConfig(overlap=1, stages=2)
    assert GemmWgmmaConfig(warpgroups=1).rows_per_block == 64


def test_tiles_and_default_config():
    assert [wgmma_tiles(M) for M in (1, 8, 9, 16, 17, 64, 65, 128)] == [1, 1, 2, 2, 4, 8, 16, 16]
    for M in (0, 129):
        with pytest.raises(ValueError, match="1 <= M <= 128"):
            wgmma_tiles(M)
    assert default_gemm_wgmma_config(64, 8) == default_gemm_wgmma_config(32, 4) == GemmWgmmaConfig(stages=3, min_blocks=2)
    assert default_gemm_wgmma_config(65, 8) == default_gemm_wgmma_config(33, 4) == GemmWgmmaConfig(warpgroups=4, stages=3)
    assert gemm_wgmma_smem(8, 3) == 3 * 64 * 256 + 1024
    # the cluster sum puts 4 warpgroups' fp32 accumulators (256 rows x 64 M) where the 3 stages were: 64 KB
    assert gemm_wgmma_smem(8, 3, 4) == 256 * 64 * 4 + 1024
    assert gemm_wgmma_smem(8, 3, 2) == gemm_wgmma_smem(8, 3)


def test_launch_shape():
    # 8B gate at 132 SMs with 2 blocks each: 112 blocks along N, K split in 2 (whole 128-element stages)
    shape = wgmma_launch_shape(14336, 4096, 4, 132, GemmWgmmaConfig(), 2)
    assert (shape.blocks_n, shape.splits, shape.chunks_per_split) == (112, 2, 64)
    # enough blocks along N: no split; int8 stages are 8 chunks
    assert wgmma_launch_shape(28672, 4096, 8, 132, GemmWgmmaConfig(), 1).splits == 1
    shape = wgmma_launch_shape(4096, 4096, 8, 132, GemmWgmmaConfig(), 2)
    assert shape.blocks_n == 32 and shape.chunks_per_split % 8 == 0 and shape.splits * shape.chunks_per_split >= 256
    # a split keeps >= 2 stages; a forced count is capped at one stage per split
    assert wgmma_launch_shape(64, 512, 4, 132, GemmWgmmaConfig(), 4).splits == 2
    assert wgmma_launch_shape(64, 96, 4, 132, GemmWgmmaConfig(splits=5), 1).splits == 1
    # the cluster sum: at most WGMMA_MAX_CLUSTER (8) splits, the rule's or a forced count
    assert wgmma_launch_shape(1024, 8192, 4, 132, GemmWgmmaConfig(), 1).splits == 16
    shape = wgmma_launch_shape(1024, 8192, 4, 132, GemmWgmmaConfig(cluster=1), 1)
    assert (shape.splits, shape.chunks_per_split) == (variants.WGMMA_MAX_CLUSTER, 32)
    assert wgmma_launch_shape(1024, 8192, 4, 132, GemmWgmmaConfig(cluster=1, splits=12), 1).splits == 8


def _gpc_clusters(gpcs: int, sms_per_gpc: int, blocks_per_sm: int):
    """Clusters of S blocks resident at once when every cluster lies within one GPC of ``sms_per_gpc`` SMs."""
    return lambda splits: gpcs * (sms_per_gpc * blocks_per_sm // splits)


def test_cluster_launch_shape_fits_one_wave_of_clusters():
    # 8B o, 2 warpgroups (32 blocks along N) at 2 blocks per SM: the rule's 8 splits make 32 clusters of 8; 8 GPCs
    # of 16 SMs hold 8 x (32 // 8) = 32 of them (fits), 7 GPCs of 18 SMs 7 x (36 // 8) = 28 (7 splits: 35 fit)
    fits = wgmma_launch_shape(4096, 4096, 4, 132, GemmWgmmaConfig(cluster=1), 2, _gpc_clusters(8, 16, 2))
    assert fits.splits == 8
    shape = wgmma_launch_shape(4096, 4096, 4, 132, GemmWgmmaConfig(cluster=1), 2, _gpc_clusters(7, 18, 2))
    clusters = _gpc_clusters(7, 18, 2)(shape.splits)
    assert shape.blocks_n == 32 and shape.splits == 7 and clusters == 35 >= shape.blocks_n
    # a forced count is lowered the same way; nothing fits: no split (a plain launch)
    assert wgmma_launch_shape(4096, 4096, 4, 132, GemmWgmmaConfig(cluster=1, splits=8), 2,
                              _gpc_clusters(7, 18, 2)).splits == 7
    assert wgmma_launch_shape(4096, 4096, 4, 132, GemmWgmmaConfig(cluster=1), 2, lambda splits: 0).splits == 1
    # the workspace form ignores cluster counts
    assert wgmma_launch_shape(4096, 4096, 4, 132, GemmWgmmaConfig(), 2, lambda splits: 0).splits == 8


def test_plan_kernels_name_the_module_and_reduction():
    (src, name, defines), reduce = gemm_wgmma.GemmWgmmaPlan.kernels(40, wo.torch.float16, 4)
    assert (src, name) == (SOURCE, "gemm_wgmma_mt8")
    assert defines == {"WO_ELEMENT": 0, "WO_BITS": 4, **default_gemm_wgmma_config(40).defines()}
    assert reduce[0] == "splitk_reduce.cu"


@pytest.mark.parametrize("cfg", [GemmWgmmaConfig(), default_gemm_wgmma_config(64), default_gemm_wgmma_config(1),
                                 GemmWgmmaConfig(overlap=1), GemmWgmmaConfig(cluster=1)],
                         ids=["class-default", "default-wide", "default-small", "overlap", "cluster"])
def test_ptxas_keeps_the_wgmmas_asynchronous(tmp_path, cfg):
    """ptxas serializes every wgmma (a wait after each) when one sits in a branch it cannot prove block-uniform,
    and says so only as an info line (C7518): that would undo the overlap silently."""
    _, messages = nvcc_build(SOURCE, tmp_path, "sm_90a", {"WO_ELEMENT": 0, "WO_BITS": 4, **cfg.defines()},
                             ("-Xptxas", "-v"))
    assert "C7518" not in messages and "serialized" not in messages, messages
    assert "spill" in messages  # the verbose report was read
