"""Strategy "gemv_mma": tensor-core GEMV for M <= 64 (gemv_mma.cu ``gemv_mma_mt{1,2,4,8}``), fp16/bf16,
sm_80+, with the operands swapped (W is the mma A operand) and K split across blocks when N alone
leaves SMs idle (splitk.py)."""
from __future__ import annotations

import math

from custom_kernels.device import sm_count
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

from .shared import ELEMENT, scale_offset_words
from .splitk import SplitKGemvPlan
from .variants import GemvMmaConfig, chunk_elems, default_gemv_mma_config

__all__ = ["GemvMmaArgs", "GemvMmaPlan"]


class GemvMmaArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("B", Ptr), ("scale_offset", Ptr), ("bias", Ptr), ("D", Ptr), ("workspace", Ptr),
                ("M", I32), ("N", I32), ("K", I32), ("G", I32), ("group_shift", I32), ("chunks_per_split", I32),
                ("act", I32)]


class GemvMmaPlan(SplitKGemvPlan):
    strategy = "gemv_mma"
    config_type = GemvMmaConfig

    def __init__(self, qw, M: int, dtype, device: int, config: GemvMmaConfig | None = None):
        config = config or default_gemv_mma_config(M, qw.bits)
        defines = {"WO_ELEMENT": ELEMENT[dtype], "WO_BITS": qw.bits, **config.defines()}
        ce = chunk_elems(qw.bits)
        K, N, G = qw.K, qw.N, qw.num_groups
        chunks = K // ce
        group_shift = 30 if G == 1 else int(math.log2(qw.block_size // ce))
        m_tiles = next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)
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
        kernel = load_kernel("gemv_mma.cu", f"gemv_mma_mt{m_tiles}", defines, device=device)
        args = GemvMmaArgs(B=qw.qweight.data_ptr(), scale_offset=so.data_ptr(), M=M, N=N, K=K, G=G,
                           group_shift=group_shift, chunks_per_split=per_split)
        gemv = Launch(kernel, LaunchConfig.of((blocks_n, splits), 32 * warps), args, device)
        super().__init__(gemv, splits, M, N, ELEMENT[dtype], device, keep=(so,))
