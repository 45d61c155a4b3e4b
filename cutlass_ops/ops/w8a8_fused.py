"""Scheme 2 (W8A8 per K block) as ONE fused NVRTC kernel: ``custom_kernels/kernels/w8a8_kblock_fused.cu``.

    D[m, n] = act( sum_i [ sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB ] + bias[n] )

A = QuantA(x) per row and K block (asymmetric, offset form), B = the int8 weight per column and
K block (offset form), Cq_i = int32 dot product of block i. The kernel runs int8 mma.sync tiles
and promotes each block's int32 sum into fp32 accumulators; nothing but D is written.

Per weight, ``prepare_weight_w8a8`` builds (once, cached on the weight object) the GPU copy of
B_q and bvec[g, n] = (sB, oB, q = sB*sumB + bs*oB, 0) as float32 [G, N, 4].
"""
from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

import torch

from custom_kernels.launcher import device_capability
from cutlass_ops._validate import check_dtype, check_ndim, check_shape, parse_activation

log = logging.getLogger(__name__)

# Compute capability per device index, asked of torch once (the choice below runs per call).
_capability = functools.lru_cache(maxsize=None)(device_capability)

__all__ = [
    "BLOCK_SIZES", "TILE_CONFIGS", "TileConfig", "choose_config", "prepare_weight_w8a8",
    "quantize_activation_torch", "linear_w8a8_fused",
]

KERNEL_FILE = "w8a8_kblock_fused.cu"
KERNEL_NAME = "w8a8_kblock_gemm"
# The Hopper variant (wgmma + warp-specialized ring filled by cp.async or TMA): same arguments (TMA
# variants: plus the tensor maps of A and B), sm_90a only.
WGMMA_KERNEL_FILE = "w8a8_kblock_wgmma.cu"
WGMMA_KERNEL_NAME = "w8a8_kblock_wgmma"
ROW_PLANES_KERNEL = "w8a8_row_planes"  # planar variants: sA, oA, sumA [M, G] -> planes [G, 3, M rounded to 4]
# A_q, sA, oA, sumA, B_q, bvec, bias, D, M, N, K, G, act, out_kind
SIGNATURE = "PPPPPPPPiiiiii"
BLOCK_SIZES = (32, 64, 128, 256)  # |Cq| <= 2^22 (the kernel's exact int->float trick) needs bs <= 256
OUT_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_PREP_ATTR = "_w8a8_fused_prep"
_DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a launch gets without opting in
_MAX_SMEM = 227 * 1024  # the most one block may opt in to (sm_80 163 KiB: a launch there fails loudly)


@dataclass(frozen=True)
class TileConfig:
    """One compiled variant of the kernel: CTA tile BM x BN, K tile BK, warp grid, pipeline depth.

    ``wgmma`` variants are the Hopper kernel (w8a8_kblock_wgmma.cu): two consumer warpgroups of
    64 rows plus a producer warpgroup, a 128 x BN x 128 tile (BN = 128, or 192 with the ping-pong
    consumer)."""

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

    def __post_init__(self):
        if self.nsplit and not self.planes:
            raise ValueError(f"tile config {self.name!r}: the N split reads its parameters as planes (planes=True)")
        if self.pingpong and (not self.planes or self.nsplit):
            raise ValueError(f"tile config {self.name!r}: the ping-pong consumer is the M split with planes")
        if self.wgmma and (self.BM, self.BK) != (128, 128):
            raise ValueError(f"tile config {self.name!r}: the wgmma kernel's tile is 128 x BN x 128")
        if self.wgmma and self.BN not in (128, 192):
            raise ValueError(f"tile config {self.name!r}: the wgmma kernel takes BN = 128 or 192, not {self.BN}")
        if self.wgmma and self.BN == 192 and not self.pingpong:
            raise ValueError(f"tile config {self.name!r}: BN = 192 needs the ping-pong consumer (pingpong=True)")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n + (128 if self.wgmma else 0)

    @property
    def signature(self) -> str:
        return SIGNATURE + ("TT" if self.tma else "")

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
            params = 4096 if self.planes else 16 * self.BN  # one block's parameters (see the .cu header)
            return self.stages * (self.BM * self.BK + self.BN * self.BK + params * slots) + 1024 + 16 * self.stages
        return self.stages * (self.BM * self.BK + self.BN * self.BK + 16 * (self.BM + self.BN) * slots) \
            + 16 * (self.BM + self.BN)

    def defines(self, block_size: int) -> dict[str, int]:
        if self.wgmma:
            return {"W8A8_BLOCK_SIZE": block_size, "W8A8W_STAGES": self.stages, "W8A8W_TMA": int(self.tma),
                    "W8A8W_NSPLIT": int(self.nsplit), "W8A8W_PLANES": int(self.planes), "W8A8W_BN": self.BN,
                    "W8A8W_PINGPONG": int(self.pingpong)}
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


@functools.lru_cache(maxsize=None)
def _kernel_for(config_name: str, block_size: int, device_index: int):
    """(Kernel, dynamic smem bytes) of one variant, compiled for the device and ready to launch."""
    from cutlass_ops.ops._loader import load_kernel, target_arch

    cfg = TILE_CONFIGS[config_name]
    arch = target_arch(device_index)
    if cfg.wgmma and arch != "90a":
        raise ValueError(f"config {config_name!r} is the wgmma kernel, which needs compute capability 9.0; "
                         f"device {device_index} is sm_{arch}")
    with torch.cuda.device(device_index):
        kernel = load_kernel(cfg.kernel_file, cfg.kernel_name, cfg.signature, cfg.defines(block_size), arch=arch)
    smem = cfg.smem_bytes(block_size)
    if smem > _MAX_SMEM:
        raise ValueError(f"config {config_name!r} needs {smem} bytes of shared memory at block_size={block_size}; "
                         f"the limit is {_MAX_SMEM}: use a variant with fewer stages")
    if smem > _DEFAULT_SMEM:
        kernel.set_max_dynamic_smem(smem)
    return kernel, smem


@functools.lru_cache(maxsize=None)
def _row_planes_kernel(config_name: str, block_size: int, device_index: int):
    """The row-parameter transpose of the planar variants (from the same module as the GEMM)."""
    from cutlass_ops.ops._loader import load_kernel, target_arch

    cfg = TILE_CONFIGS[config_name]
    with torch.cuda.device(device_index):
        return load_kernel(cfg.kernel_file, ROW_PLANES_KERNEL, "PPPPiii", cfg.defines(block_size),
                           arch=target_arch(device_index))


@functools.lru_cache(maxsize=1)
def _planes_quantizer():
    """QuantA writing the row parameters as planes (cutlass_ops.ops.quant), or None without it."""
    try:
        from cutlass_ops.ops.quant import quantize_activation_planes_gpu
    except ImportError:
        return None
    return quantize_activation_planes_gpu


@functools.lru_cache(maxsize=1)
def _activation_quantizer():
    """The QuantA GPU kernel when its module exists, else the torch version below."""
    try:
        from cutlass_ops.ops.quant import quantize_activation_gpu
    except ImportError:
        log.info("cutlass_ops.ops.quant is not available; quantizing activations with torch ops")
        return quantize_activation_torch
    return quantize_activation_gpu


def quantize_activation_torch(x2d: torch.Tensor, block_size: int):
    """QuantA with torch ops on x's device: (A_q int8 [M,K], scale f32 [M,G], offset f32 [M,G], sum_q int32 [M,G]).

    The same IEEE-rounded float32 operations, in the same order, as
    ``formats.quantize_activation_reference`` (so the results are bit-identical to it):
    scale = (max - min) / 255, offset = max - scale * 127, zero-range blocks get scale 1 and
    offset max, q = clamp(round_half_even((x - offset) / scale), -128, 127).
    """
    M, K = x2d.shape
    G = K // block_size
    xb = x2d.to(torch.float32).reshape(M, G, block_size)
    x_max, x_min = xb.amax(dim=-1), xb.amin(dim=-1)
    scale = (x_max - x_min) / torch.full_like(x_max, 255.0)
    offset = x_max - scale * 127.0
    zero_range = scale == 0
    scale = torch.where(zero_range, torch.ones_like(scale), scale)
    offset = torch.where(zero_range, x_max, offset)
    q = torch.round((xb - offset[..., None]) / scale[..., None]).clamp_(-128, 127).to(torch.int8)
    sum_q = q.sum(dim=-1, dtype=torch.int32)
    return q.reshape(M, K), scale, offset, sum_q


def _check_block_size(block_size: int, K: int) -> None:
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"the fused W8A8 kernel needs block_size in {BLOCK_SIZES}, got block_size={block_size}")
    if K % block_size != 0 or K % 16 != 0:
        raise ValueError(f"K={K} must be a multiple of block_size={block_size} and of 16")


def _weight_key(qw, device: torch.device) -> tuple:
    """What the prepared copy depends on: device, storage and in-place version of each tensor."""
    return (str(device),) + tuple((t.data_ptr(), t._version) for t in (qw.qweight, qw.scale, qw.offset))


def prepare_weight_w8a8(qw, device=None) -> dict:
    """Per-weight data of the fused kernel, built once and cached on ``qw`` (an attribute).

    qw: a bits=8 ``QuantizedWeight`` (qweight int8 [N, K], scale/offset float32 [N, G]).
    Returns {"B_q": int8 [N, K], "bvec": float32 [G, N, 4] = (sB, oB, sB*sumB + bs*oB, 0),
    "sumB": int32 [N, G], "N", "K", "G", "block_size", "device"} with tensors on ``device``
    (default: the weight's CUDA device, else the current CUDA device). The cache is rebuilt when
    the weight's tensors are replaced or modified in place.
    """
    if getattr(qw, "bits", None) != 8:
        raise ValueError(f"qw must be an int8 weight (bits=8), got bits={getattr(qw, 'bits', None)!r}")
    N, K, bs = qw.N, qw.K, qw.block_size
    _check_block_size(bs, K)
    check_dtype(qw.qweight, "qw.qweight", (torch.int8,))
    check_shape(qw.qweight, "qw.qweight", (N, K), "[N, K]")
    if device is None:
        device = qw.qweight.device if qw.qweight.is_cuda else torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    key = _weight_key(qw, device)
    cached = getattr(qw, _PREP_ATTR, None)
    if cached is not None and cached[0] == key:
        return cached[1]

    G = K // bs
    B_q = qw.qweight.to(device).contiguous()
    sumB = B_q.reshape(N, G, bs).sum(dim=-1, dtype=torch.int32)
    sB = qw.scale.to(device, torch.float32)
    oB = qw.offset.to(device, torch.float32)
    # q in float64, rounded once to float32 (the kernel multiplies it by oA)
    q = (sB.double() * sumB.double() + bs * oB.double()).float()
    bvec = torch.stack((sB, oB, q, torch.zeros_like(q)), dim=-1).transpose(0, 1).contiguous()  # [G, N, 4]
    prep = {"B_q": B_q, "bvec": bvec, "sumB": sumB, "N": N, "K": K, "G": G, "block_size": bs, "device": device}
    # object.__setattr__: also works on frozen dataclasses; the cache is an attribute of qw itself
    object.__setattr__(qw, _PREP_ATTR, (key, prep))
    return prep


def _column_planes(prep: dict) -> torch.Tensor:
    """bvec's (sB, oB, q) as planes [G, 3, N rounded up to 4] (zero padding: 16-byte copies of each
    plane) for the planar variants; made on their first use and kept in the prepared weight."""
    planes = prep.get("bplanes")
    if planes is None:
        G, N, bvec = prep["G"], prep["N"], prep["bvec"]
        planes = torch.zeros(G, 3, -(-N // 4) * 4, dtype=torch.float32, device=bvec.device)
        planes[:, :, :N] = bvec[..., :3].permute(0, 2, 1)
        prep["bplanes"] = planes
    return planes


def _check_quantized_A(quantized_A, M: int, K: int, G: int, device: torch.device):
    if not isinstance(quantized_A, (tuple, list)) or len(quantized_A) != 4:
        raise TypeError("quantized_A must be a tuple (A_q, scale, offset, sum_q) as quantize_activation returns")
    A_q, sA, oA, sumA = quantized_A
    for t, name, dtype, shape, layout in ((A_q, "A_q", torch.int8, (M, K), "[M, K]"),
                                          (sA, "scale", torch.float32, (M, G), "[M, G]"),
                                          (oA, "offset", torch.float32, (M, G), "[M, G]"),
                                          (sumA, "sum_q", torch.int32, (M, G), "[M, G]")):
        check_dtype(t, f"quantized_A {name}", (dtype,))
        check_shape(t, f"quantized_A {name}", shape, layout)
        if t.device != device:
            raise ValueError(f"quantized_A {name} is on {t.device}, expected {device}")
    A_q = A_q.contiguous()
    if A_q.data_ptr() % 16:  # 16-byte cp.async copies
        A_q = A_q.clone()
    return A_q, sA.contiguous(), oA.contiguous(), sumA.contiguous()


def linear_w8a8_fused(x2d: torch.Tensor | None, qw, bias: torch.Tensor | None = None, act=0, *,
                      quantized_A=None, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                      config: str | None = None) -> torch.Tensor:
    """D [M, N] = act(QuantA(x2d) (*) qw + bias), scheme 2, in one kernel launch; D in x2d.dtype.

    x2d: CUDA [M, K] float16/bfloat16/float32 (may be None when ``quantized_A`` and ``out_dtype``
    are given). quantized_A: optional precomputed (A_q, scale, offset, sum_q) of x2d with
    block_size = qw.block_size. act: 0/1/2 or None/"relu"/"relu6". out: optional contiguous
    [M, N] output to write. config: force a tile variant (a key of TILE_CONFIGS).
    """
    if x2d is not None:
        check_dtype(x2d, "x2d", tuple(OUT_KIND))
        check_ndim(x2d, "x2d", 2, "[M, K]")
        M, K = x2d.shape
        device = x2d.device
        out_dtype = x2d.dtype if out_dtype is None else out_dtype
    elif quantized_A is None:
        raise TypeError("linear_w8a8_fused needs x2d or quantized_A")
    else:
        M, K = quantized_A[0].shape
        device = quantized_A[0].device
    if out_dtype not in OUT_KIND:
        raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    if K != qw.K:
        raise ValueError(f"x2d has K={K} columns but qw has K={qw.K}")
    bs = qw.block_size
    _check_block_size(bs, K)
    act = parse_activation(act, "act")
    N, G = qw.N, K // bs
    if bias is not None:
        check_dtype(bias, "bias", tuple(OUT_KIND))
        check_shape(bias, "bias", (N,), "[N]")
    if config is not None and config not in TILE_CONFIGS:
        raise ValueError(f"config must be one of {sorted(TILE_CONFIGS)}, got {config!r}")
    if device.type != "cuda":
        raise ValueError(f"x2d must be a CUDA tensor, got a tensor on {device}")

    prep = prepare_weight_w8a8(qw, device)
    if out is None:
        out = torch.empty(M, N, dtype=out_dtype, device=device)
    else:
        check_dtype(out, "out", (out_dtype,))
        check_shape(out, "out", (M, N), "[M, N]")
        if out.device != device or not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out must be a contiguous, 16-byte aligned tensor on x2d's device")
    if M == 0:
        return out

    current = torch.cuda.current_device()
    index = current if device.index is None else device.index
    cfg = TILE_CONFIGS[config or choose_config(M, N, _capability(index))]
    rows = None  # planar variants: the row parameters as planes [G, 3, M rounded up to 4]
    if quantized_A is None:
        x2d = x2d.contiguous()
        planes_quantizer = _planes_quantizer() if cfg.planes else None
        if planes_quantizer is not None:  # QuantA writes the planes itself: no transpose launch
            A_q, rows = planes_quantizer(x2d, bs)
        else:  # fresh contiguous tensors of the right types and shapes: nothing to check again
            A_q, sA, oA, sumA = _activation_quantizer()(x2d, bs)
    else:
        A_q, sA, oA, sumA = _check_quantized_A(quantized_A, M, K, G, device)
    if bias is not None:
        if bias.device != device:
            raise ValueError(f"bias is on {bias.device}, expected {device}")
        bias = bias.to(torch.float32).contiguous()

    kernel, smem = _kernel_for(cfg.name, bs, index)
    grid = (-(-M // cfg.BM) * -(-N // cfg.BN),)
    if rows is not None:
        sA = oA = sumA = rows
    elif cfg.planes:
        # row parameters as planes [G, 3, M rounded up to 4], copied per K block into shared memory
        # next to the column planes; one small kernel (w8a8_row_planes) transposes them
        Mp = -(-M // 4) * 4
        rows = torch.empty(G, 3, Mp, dtype=torch.float32, device=device)
        planes_kernel = _row_planes_kernel(cfg.name, bs, index)
        launch_on = contextlib.nullcontext() if index == current else torch.cuda.device(index)
        with launch_on:
            planes_kernel.launch((-(-G * M // 256),), (256,), (sA, oA, sumA, rows, M, G, Mp))
        sA = oA = sumA = rows
    args = (A_q, sA, oA, sumA, prep["B_q"], _column_planes(prep) if cfg.planes else prep["bvec"], bias, out, M, N,
            K, G, act, OUT_KIND[out_dtype])
    if cfg.tma:
        from cutlass_ops.ops.tma import tensor_map_2d

        args += (tensor_map_2d(A_q.data_ptr(), M, K, cfg.BM, cfg.BK, index),
                 tensor_map_2d(prep["B_q"].data_ptr(), N, K, cfg.BN, cfg.BK, index))
    if index == current:
        kernel.launch(grid, (cfg.threads,), args, smem=smem)
    else:
        with torch.cuda.device(index):
            kernel.launch(grid, (cfg.threads,), args, smem=smem)
    return out
