"""The fused scheme-2 kernel's compiled variants: :class:`TileConfig`, :data:`TILE_CONFIGS` and the
default choice per problem and GPU (:func:`choose_config`).

Two kernels: ``w8a8_kblock_fused.cu`` (int8 mma.sync tiles, sm_75+; the sm_80 cp.async ring) and
``w8a8_kblock_wgmma.cu`` (Hopper: wgmma with a warp-specialized ring filled by cp.async or TMA;
same arguments, TMA variants plus the tensor maps of A and B; sm_90a only). The block-scaled
symmetric scheme (:mod:`.block_scaled`) compiles the wgmma kernel with ``W8A8W_BLOCK_SCALED``: its
variants are :data:`BLOCK_SCALED_CONFIGS`, kept apart from :data:`TILE_CONFIGS` (another formula).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BLOCK_SIZES", "KERNEL_FILE", "KERNEL_NAME", "WGMMA_KERNEL_FILE", "WGMMA_KERNEL_NAME", "ROW_PLANES_KERNEL",
    "WGMMA_CC", "WP_MIN_M", "TileConfig", "TILE_CONFIGS", "choose_config", "default_configs",
    "BLOCK_SCALED_SIZES", "BLOCK_SCALED_CONFIGS", "BLOCK_SCALED_SMALL_M", "MAX_SPLITS", "choose_block_scaled_config",
    "block_scaled_default_Ms", "k_units", "choose_splits",
]

KERNEL_FILE = "w8a8_kblock_fused.cu"
KERNEL_NAME = "w8a8_kblock_gemm"
WGMMA_KERNEL_FILE = "w8a8_kblock_wgmma.cu"
WGMMA_KERNEL_NAME = "w8a8_kblock_wgmma"
ROW_PLANES_KERNEL = "w8a8_row_planes"  # planar variants: sA, oA, sumA [M, G] -> planes [G, 3, M rounded to 4]
BLOCK_SIZES = (32, 64, 128, 256)  # |Cq| <= 2^22 (the kernel's exact int->float trick) needs bs <= 256


@dataclass(frozen=True)
class TileConfig:
    """One compiled variant of the kernel: CTA tile BM x BN, K tile BK, warp grid, pipeline depth.

    ``wgmma`` variants are the Hopper kernel (w8a8_kblock_wgmma.cu): two consumer warpgroups of
    64 rows plus a producer warpgroup, a 128 x BN x 128 tile (BN = 128, or 192 with the ping-pong
    consumer); the block-scaled N split also takes BM = 64 (both warpgroups on the same 64 rows)."""

    name: str
    BM: int
    BN: int
    BK: int
    warps_m: int
    warps_n: int
    stages: int
    min_blocks: int
    offset_lag: int = 1  # offset terms one k-step after the int32 -> fp32 step (spreads FP work)
    wgmma: bool = False  # the sm_90a kernel
    tma: bool = False  # wgmma: tiles loaded by TMA (two tensor maps appended to the arguments)
    nsplit: bool = False  # wgmma + planes: each consumer warpgroup takes 64 columns (two m64n64 wgmmas)
    planes: bool = False  # wgmma + TMA: row and column parameters as planes [G, 3, rows rounded to 4], staged by TMA
    pingpong: bool = False  # wgmma + planes, M split: one int32 set per warpgroup, the two take turns on the tensor cores
    block_scaled: bool = False  # wgmma + planes: the block-scaled symmetric formula (W8A8W_BLOCK_SCALED)

    def __post_init__(self):
        if self.nsplit and not self.planes:
            raise ValueError(f"tile config {self.name!r}: the N split reads its parameters as planes (planes=True)")
        if self.pingpong and (not self.planes or self.nsplit):
            raise ValueError(f"tile config {self.name!r}: the ping-pong consumer is the M split with planes")
        if self.wgmma and self.BK != 128:
            raise ValueError(f"tile config {self.name!r}: the wgmma kernel's K tile is BK = 128")
        if self.wgmma and self.BM != 128 and not (self.BM == 64 and self.nsplit and self.block_scaled):
            raise ValueError(f"tile config {self.name!r}: the wgmma kernel's tile is 128 x BN x 128 (64 x BN x 128 "
                             f"only in the block-scaled N split), not BM = {self.BM}")
        if self.wgmma and self.BN not in (128, 192):
            raise ValueError(f"tile config {self.name!r}: the wgmma kernel takes BN = 128 or 192, not {self.BN}")
        if self.wgmma and self.BN == 192 and not self.pingpong:
            raise ValueError(f"tile config {self.name!r}: BN = 192 needs the ping-pong consumer (pingpong=True)")
        if self.block_scaled and not (self.wgmma and self.planes):
            raise ValueError(f"tile config {self.name!r}: the block-scaled variant is the wgmma kernel with its "
                             f"scales staged as planes (wgmma=True, planes=True)")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n + (128 if self.wgmma else 0)

    @property
    def kernel_file(self) -> str:
        return WGMMA_KERNEL_FILE if self.wgmma else KERNEL_FILE

    @property
    def kernel_name(self) -> str:
        return WGMMA_KERNEL_NAME if self.wgmma else KERNEL_NAME

    def smem_bytes(self, block_size: int) -> int:
        """Dynamic shared memory of one CTA (the formula in the .cu file's header)."""
        slots = max(1, self.BK // block_size)
        if self.wgmma:
            # one block's parameters (see the .cu header)
            params = 1024 if self.block_scaled else 4096 if self.planes else 16 * self.BN
            return self.stages * (self.BM * self.BK + self.BN * self.BK + params * slots) + 1024 + 16 * self.stages
        return self.stages * (self.BM * self.BK + self.BN * self.BK + 16 * (self.BM + self.BN) * slots) \
            + 16 * (self.BM + self.BN)

    def defines(self, block_size: int) -> dict[str, int]:
        if self.wgmma:
            defines = {"W8A8_BLOCK_SIZE": block_size, "W8A8W_STAGES": self.stages, "W8A8W_TMA": int(self.tma),
                       "W8A8W_NSPLIT": int(self.nsplit), "W8A8W_PLANES": int(self.planes), "W8A8W_BN": self.BN,
                       "W8A8W_PINGPONG": int(self.pingpong)}
            if self.block_scaled:  # only then: the other variants' defines (and cache keys) stay as they were
                defines["W8A8W_BLOCK_SCALED"] = 1
            if self.BM != 128:  # likewise (the kernel's default BM is 128)
                defines["W8A8W_BM"] = self.BM
            return defines
        return {
            "W8A8_BLOCK_SIZE": block_size, "W8A8_BM": self.BM, "W8A8_BN": self.BN, "W8A8_BK": self.BK,
            "W8A8_WARPS_M": self.warps_m, "W8A8_WARPS_N": self.warps_n, "W8A8_STAGES": self.stages,
            "W8A8_MIN_BLOCKS": self.min_blocks, "W8A8_OFFSET_LAG": self.offset_lag,
        }


TILE_CONFIGS: dict[str, TileConfig] = {c.name: c for c in (
    TileConfig("L", BM=128, BN=128, BK=64, warps_m=2, warps_n=4, stages=4, min_blocks=1),
    TileConfig("L128", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=3, min_blocks=1),
    TileConfig("M", BM=64, BN=128, BK=64, warps_m=2, warps_n=2, stages=4, min_blocks=2),
    TileConfig("S", BM=32, BN=64, BK=128, warps_m=1, warps_n=4, stages=4, min_blocks=2),
    TileConfig("T", BM=16, BN=64, BK=128, warps_m=1, warps_n=4, stages=6, min_blocks=2),
    TileConfig("T32", BM=16, BN=32, BK=128, warps_m=1, warps_n=2, stages=6, min_blocks=4),
    TileConfig("W", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True),
    TileConfig("WT", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True),
    TileConfig("WN", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True, nsplit=True),
    TileConfig("WM", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True),
    TileConfig("WP", BM=128, BN=192, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True, pingpong=True),
)}
WGMMA_CC = 90  # compute capability the wgmma variants run on (sm_90a)
WP_MIN_M = 2048  # from this M the 128 x 192 ping-pong tiles fill the SMs (choose_config)


def choose_config(M: int, N: int, cc: int = 80) -> str:
    """Tile variant for an M x N output on a GPU of compute capability ``cc``, from the variant
    sweep of scripts/bench_w8a8_fused.py.

    H200, N = K = 8192, block 128 (kernel us): M=16: T 24.1, T32 25.7, S 30.1, M 68.3;
    M=256: M 113.4, L128 115.0, L 123.0; M=4096: M 1767, L128 1804, L 1929.
    H100 (sm_90a), same shapes: M=128: M 75.0, W 95.2; M=256: W 93-99, W5 93-96, M 114.0;
    M=4096: W 1352-1434, W5 1375-1452, M 1726-1751 (scripts/results/2026-11-22-nvidia-h100-bench_w8a8_fused.md);
    TMA producer: M=128: WT 90.1 (M 75.0); M=256: WT 92.2, W 92.4; M=4096: WT 1300.5, W 1372.7, WT5 1342.2
    (scripts/results/2026-11-22-nvidia-h100-bench_w8a8_fused-s4-tma.md); N split with staged row parameters:
    M=256: WN 87.9, WT 94.1; M=4096: WN 1109.0, WT 1285.1 (...-bench_w8a8_fused-s4-nsplit.md). Five-stage
    rings (W5, WT5) were never faster than four and are gone.
    M split with planar parameters (WM), CUDA-graph us: M=128: WM 76.3, WN 73.4, M 76.5; M=256: WM 79.1,
    WN 76.3; M=4096: WM 1150, WN 1142 (its mainloop alone is 588 us against WN's 768, but the promotion
    bounds both; scripts/results/2026-11-22-nvidia-h100-w8a8_probe-s6.md).
    Ping-pong consumer with 128 x 192 tiles (WP), CUDA-graph us, WN / WP: M=256 76.8 / 99.7 (86 CTAs
    on 132 SMs); M=512 146.4 / 195.9; M=1024 288.0 / 284.6; M=2048 572.2 / 567.1; M=4096 1139 / 1007
    (scripts/results/2026-11-22-nvidia-h100-w8a8_probe-s7.md).
    """
    del N  # every variant keeps >= 1 CTA per SM at N = 8192; N-dependent choices need more data
    if cc == WGMMA_CC and M >= WP_MIN_M:
        return "WP"
    if cc == WGMMA_CC and M > 128:
        return "WN"
    if M <= 16:
        return "T"
    if M <= 32:
        return "S"
    return "M"


def default_configs(cc: int = 80, N: int = 8192) -> tuple[str, ...]:
    """Every variant :func:`choose_config` picks for some M on sm_``cc`` (it is the same for every M from
    ``WP_MIN_M`` on), in order of first use."""
    return tuple(dict.fromkeys(choose_config(M, N, cc) for M in range(1, WP_MIN_M + 2)))


# The block-scaled symmetric scheme (:mod:`.block_scaled`): the same wgmma structures with one I2FP + FFMA
# per element and block. Measured at N = K = 8192, bs 128 on an H200 (scripts/bench_w8a8_fused.py
# --block-scaled): M = 16 / 256: WMB 42.0 / 45.7 us (WNB 49.1 / 51.6); M = 4096: WPB 641 us (WMB 714).
# At M = 16 the 128 x 128 tiles make 64 CTAs for 132 SMs (7/8 of each tile's rows empty): WSB (64 x 128
# tiles, 8 stages) with split-K (:func:`choose_splits`) is the small-M variant. Measured (H200, us, WSB / WMB
# at the split count choose_splits gives; nvidia-h200/bench_w8a8_block_scaled_small_m.md): M = 16 25.6 / 36.8,
# M = 64 27.6 / 31.0, M = 128 35.0 (1 split) / 32.2 (2 splits), M = 256 67.3 / 45.6: WSB up to M = 64.
BLOCK_SCALED_SIZES = (64, 128, 256)  # a 64-column slice of a tile must lie in one weight block: bs >= 64
BLOCK_SCALED_CONFIGS: dict[str, TileConfig] = {c.name: c for c in (
    TileConfig("WMB", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True, block_scaled=True),
    TileConfig("WNB", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True, nsplit=True, block_scaled=True),
    TileConfig("WPB", BM=128, BN=192, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True, tma=True,
               planes=True, pingpong=True, block_scaled=True),
    TileConfig("WPB128", BM=128, BN=128, BK=128, warps_m=2, warps_n=4, stages=4, min_blocks=1, wgmma=True,
               tma=True, planes=True, pingpong=True, block_scaled=True),
    # small M: 64 x 128 tiles (both warpgroups on the same 64 rows, one m64n64 wgmma each per k-step), and
    # 8 stages so that ~6 weight tiles per SM are in flight (the ring, not the tensor cores, bounds it there)
    TileConfig("WSB", BM=64, BN=128, BK=128, warps_m=2, warps_n=4, stages=8, min_blocks=1, wgmma=True, tma=True,
               planes=True, nsplit=True, block_scaled=True),
)}
BLOCK_SCALED_SMALL_M = 64  # WSB up to this M (measured above: WMB with 2 splits is ahead at M = 128)
MAX_SPLITS = 16  # split-K: at most this many K slices (each a workspace [M, N] of fp32 partial sums)
_MIN_UNITS_PER_SPLIT = 4  # split-K: each slice keeps >= 4 K tiles (the ring fills; the reduce stays worth it)


def choose_block_scaled_config(M: int, N: int) -> str:
    """Block-scaled variant for an M x N output on sm_90a (measured above)."""
    del N
    if M >= WP_MIN_M:
        return "WPB"
    return "WSB" if M <= BLOCK_SCALED_SMALL_M else "WMB"


def block_scaled_default_Ms() -> tuple[int, ...]:
    """The first M of each variant :func:`choose_block_scaled_config` picks (from ``WP_MIN_M`` on it picks one)."""
    first: dict[str, int] = {}
    for M in range(1, WP_MIN_M + 1):
        first.setdefault(choose_block_scaled_config(M, 8192), M)
    return tuple(first.values())


def k_units(K: int, block_size: int) -> int:
    """Split-K's units of K: max(block_size, BK = 128) columns each (whole K blocks and whole K tiles; the
    kernel's ``k_slice``); a split takes a run of them, so there are at most this many splits."""
    return -(-K // max(block_size, 128))


def choose_splits(cfg: TileConfig, M: int, N: int, K: int, block_size: int, sm_count: int) -> int:
    """K slices for the block-scaled kernel at an M x N x K problem on ``sm_count`` SMs: the most that keep
    the CTAs within one wave (output tiles x splits <= SMs; so 1 once the tiles alone fill half the SMs),
    each slice at least 4 K units (:func:`k_units`), at most ``MAX_SPLITS``. N = K = 8192, 132 SMs: WSB at
    M <= 64 -> 2 splits (128 CTAs), WMB at M = 128 -> 2, at M = 256 -> 1 (128 tiles)."""
    tiles = -(-M // cfg.BM) * -(-N // cfg.BN)
    splits = min(sm_count // max(tiles, 1), k_units(K, block_size) // _MIN_UNITS_PER_SPLIT, MAX_SPLITS)
    return max(1, splits)
