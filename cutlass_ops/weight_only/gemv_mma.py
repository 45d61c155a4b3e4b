"""Strategy "gemv_mma": tensor-core GEMV for M <= 64 (gemv_mma.cu ``gemv_mma_mt{1,2,4,8}``), fp16/bf16,
sm_80+, with the operands swapped (W is the mma A operand) and K split across blocks when N alone
leaves SMs idle (splitk.py).

On Hopper with programmatic dependent launch on (``CUTLASS_OPS_PDL``; :class:`GemvMmaPdlPlan`, chosen by
``weight_only.plan_class``) the GEMV is built with WO_PDL_WAIT and launched as the programmatic dependent of
the previous kernel in the stream: its first weight loads are in flight before that kernel ends, and a GEMV
after it starts while its blocks retire. Act-order (:class:`GemvMmaGatherPlan`) first runs ``gather_k``
(x[:, perm] into a fresh buffer), the GEMV then overlapping the gather the same way."""
from __future__ import annotations

import math

import torch

from custom_kernels.device import sm_count
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import ELEMENT, scale_offset_words, wo_defines
from .splitk import SplitKGemvPlan, reduce_kernel
from .variants import GemvMmaConfig, chunk_elems, default_gemv_mma_config, default_gemv_mma_configs

__all__ = ["GemvMmaArgs", "GatherArgs", "GemvMmaPlan", "GemvMmaPdlPlan", "GemvMmaGatherPlan", "gemv_mma_tiles", "gather_kernel"]

SOURCE = "gemv_mma.cu"


def gemv_mma_tiles(M: int) -> int:
    """M tiles of 8 rows of the entry point that runs M rows: gemv_mma_mt{1,2,4,8}."""
    return next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)


def gather_kernel() -> tuple[str, str, dict[str, int]]:
    """(source, kernel, defines) of the act-order gather (x[:, perm] into a fresh buffer)."""
    return "gather_k.cu", "gather_k", {}


class GemvMmaArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale_offset", Ptr), ("bias", Ptr), ("D", Ptr), ("workspace", Ptr),
                ("M", I32), ("N", I32), ("K", I32), ("G", I32), ("group_shift", I32), ("chunks_per_split", I32),
                ("act", I32)]


class GatherArgs(KernelArgs):
    _fields_ = [("X", Ptr), ("perm", Ptr), ("Y", Ptr), ("M", I32), ("K", I32)]


class GemvMmaPlan(SplitKGemvPlan):
    strategy = "gemv_mma"
    config_type = GemvMmaConfig

    pdl = False     # GemvMmaPdlPlan: launched as a programmatic dependent (sm_90+)
    gather = False  # GemvMmaGatherPlan: the act-order variant

    @classmethod
    def module_defines(cls, dtype, bits: int, config: GemvMmaConfig) -> dict[str, int]:
        """The GEMV module's NVRTC defines (a programmatic dependent waits before it reads A: WO_PDL_WAIT)."""
        return {**wo_defines(dtype, bits, config), **({"WO_PDL_WAIT": 1} if cls.pdl else {})}

    @classmethod
    def kernels(cls, M: int, dtype, bits: int, config: GemvMmaConfig | None = None) -> tuple:
        """(source, kernel, defines) of every kernel the plan for M rows may load: the GEMV, the split-K
        reduction (where the GPU's SM count makes it split K) and, act-order, the gather."""
        configs = (config,) if config else default_gemv_mma_configs(M, bits)
        return (*((SOURCE, f"gemv_mma_mt{gemv_mma_tiles(M)}", cls.module_defines(dtype, bits, c)) for c in configs),
                reduce_kernel(ELEMENT[dtype]), *((gather_kernel(),) if cls.gather else ()))

    def __init__(self, qw, M: int, dtype, device: int, config: GemvMmaConfig | None = None):
        config = config or default_gemv_mma_config(M, qw.bits, qw.N, qw.K, sm_count(device))
        defines = self.module_defines(dtype, qw.bits, config)
        ce = chunk_elems(qw.bits)
        K, N, G = qw.K, qw.N, qw.num_groups
        chunks = K // ce
        group_shift = 30 if G == 1 else int(math.log2(qw.block_size // ce))
        m_tiles = gemv_mma_tiles(M)
        blocks_n = -(-N // (16 * config.row_tiles))
        # Split K across blocks only when N alone leaves SMs idle (aim for 2 blocks per SM then);
        # each split keeps >= one trip (4 chunks) for each of 8 warps.
        sm = sm_count(device)
        if config.splits is not None:
            splits = min(config.splits, max(1, chunks // 4))
        else:
            splits = 1 if blocks_n >= sm else max(1, min(-(-2 * sm // blocks_n), chunks // 32))
        per_split = -(-chunks // splits)
        splits = -(-chunks // per_split)
        warps = config.warps
        while warps > 1 and 4 * warps > per_split:
            warps //= 2
        so = scale_offset_words(qw, dtype)
        kernel = load_kernel(SOURCE, f"gemv_mma_mt{m_tiles}", defines, device=device)
        args = GemvMmaArgs(B=qw.qweight.data_ptr(), scale_offset=so.data_ptr(), M=M, N=N, K=K, G=G,
                           group_shift=group_shift, chunks_per_split=per_split)
        gemv = Launch(kernel, LaunchConfig.of((blocks_n, splits), 32 * warps, pdl=self.pdl), args, device)
        super().__init__(gemv, splits, M, N, ELEMENT[dtype], device, keep=(so,))
        if self.gather:
            vecs = M * K // 8  # one 16-byte vector of x[:, perm] per thread
            self._gather = Launch(load_kernel(*gather_kernel(), device=device),
                                  LaunchConfig.of(min(-(-vecs // 256), 4 * sm), 256), GatherArgs(M=M, K=K), device)


class GemvMmaPdlPlan(GemvMmaPlan):
    """The Hopper plan: the GEMV launched as the programmatic dependent of the kernel before it."""

    pdl = True


class GemvMmaGatherPlan(GemvMmaPdlPlan):
    """The act-order plan (a class of its own: the plain plan's call stays one frame shorter)."""

    gather = True

    def __call__(self, x: torch.Tensor, bias: int, act: int, out: torch.Tensor, perm: int = 0) -> None:
        """perm: the address of the int32 K permutation (act-order; plans with ``gather`` only)."""
        if perm:
            xg = torch.empty_like(x)
            self._gather(X=x.data_ptr(), perm=perm, Y=xg.data_ptr())
            x = xg
        super().__call__(x, bias, act, out)
