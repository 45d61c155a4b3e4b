"""Weight-only linear cases (gemv_{mma,stream,simt}.cu + splitk_reduce.cu, gemm_{mma,simt}.cu, gemm_small_m.cu, gemm_wgmma.cu,
dequant_weight.cu, gemv_dp4a.cu)."""
from __future__ import annotations

import torch

from sanitize.inputs import _activations, _linear_weight, _vector
from sanitize.registry import _DT_NAME, _add, _ref


def _wo_defines(dtype, bits: int, config=None) -> dict:
    from cutlass_ops.weight_only.shared import wo_defines

    return wo_defines(dtype, bits, config)


def _wo_module_defines(family: str, strategy: str | None, dtype, bits: int, M: int, config, perm: bool) -> dict:
    """{source file: defines} of the modules the case's plan loads, from the plan class's own ``kernels``
    (so the default variant of a strategy, e.g. gemv_mma's small-M int4 config, is the one claimed)."""
    from cutlass_ops import weight_only as wo

    plan = wo.plan_class(strategy or {"dequant_weight": "dequant_cublas"}.get(family, family), 90, perm, True)
    found: dict[str, dict] = {}
    for file, _, defines in plan.kernels(M, dtype, bits, config):
        found.setdefault(file, defines)
    return found


def _wo_case(family: str, strategy: str | None, dtype, bits: int, M: int, N: int, K: int, block_size: int | None,
             names: list[tuple[str, str]], *, tag: str = "", config=None, bias: bool = True, act: int = 2,
             symmetric: bool = False, x_scale: float = 1.0, public: bool = False, small_m_gemv: str | None = None,
             min_cc: int = 0, note: str = "", optional: bool = False, perm: bool = False) -> None:
    """A weight-only linear case; ``names`` = (file, kernel) pairs it reaches. perm: act-order (a random K
    permutation: gather_k + the GEMV built with WO_PDL_WAIT on sm_90)."""
    bs = "pc" if block_size is None else str(block_size)
    label = strategy or "default"
    name = (f"{label}/{_DT_NAME[dtype]}-int{bits}-M{M}-N{N}-K{K}-g{bs}"
            + (f"-{tag}" if tag else ""))
    module_defines = _wo_module_defines(family, strategy, dtype, bits, M, config, perm)
    refs = [_ref(file, kname, module_defines[file]) for file, kname in names]

    def run():
        from cutlass_ops import weight_only as wo

        qw = _linear_weight(N, K, bits, block_size, symmetric)
        if small_m_gemv is not None:  # the default-dispatch table, flipped like the GPU test does
            from cutlass_ops.formats import QuantizedWeight

            qw = QuantizedWeight(qw.qweight.clone(), qw.scale.clone(), qw.offset.clone(), bits, qw.block_size,
                                 N, K, symmetric=symmetric)  # fresh weight: no cached default plan
        x = _activations(M, K, dtype, seed=bits, scale=x_scale)
        b = _vector(N, dtype) if bias else None
        if public:
            import cutlass_ops

            return cutlass_ops.linear(x, qw, b, (None, "relu", "relu6")[act])
        saved = dict(wo.SMALL_M_GEMV)
        try:
            if small_m_gemv is not None:
                wo.SMALL_M_GEMV[M] = small_m_gemv
            p = torch.randperm(K, generator=torch.Generator().manual_seed(K)).int().cuda() if perm else None
            return wo.linear_weight_only(x, qw, b, act, strategy=strategy, config=config, perm=p)
        finally:
            wo.SMALL_M_GEMV.clear()
            wo.SMALL_M_GEMV.update(saved)

    _add(name, family, refs, run, min_cc, note, optional)


def _gemv_mma_tile(M: int) -> int:
    return next(mt for mt in (1, 2, 4, 8) if M <= 8 * mt)


def _small_m_cases(wo) -> None:
    """gemm_small_m (fp16/bf16, sm_80+): every M tile count, split-K and not, block 32/64/128/per-channel,
    K tails inside a trip and a stage, N tails inside a warp's rows and past whole warps; the variants of
    GemmSmallMConfig (row tiles, warps, stages) with --tunables."""
    Config = getattr(wo, "GemmSmallMConfig", None)
    if Config is None:
        return
    SM, R = "gemm_small_m.cu", "splitk_reduce.cu"
    mt = lambda M: next(t for t in (1, 2, 4, 8) if M <= 8 * t)  # noqa: E731
    one = Config(splits=1)
    for dtype in (torch.float16, torch.bfloat16):
        for bits in (4, 8):
            # (M, N, K, block, config, tag): K = 992 / 4160 / 4224 end inside a trip / a stage; N = 4097 ends
            # inside a warp's rows, N = 259 leaves most warps of its block without rows; default splits (None)
            # split K wherever N / 256 leaves SMs idle (every shape here on a GPU with >= 17 SMs).
            for M, N, K, bs, cfg, tag in ((1, 4097, 992, 32, one, "nosplit"), (13, 259, 4160, 64, None, "splitk"),
                                          (33, 4097, 4224, 128, one, "nosplit"), (64, 515, 4160, None, None, "splitk"),
                                          (7, 48, 1056, 32, None, "splitk"), (17, 16, 96, 32, one, "tiny-k")):
                names = [(SM, f"gemm_small_m_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg is None else [])
                _wo_case("gemm_small_m", "gemm_small_m", dtype, bits, M, N, K, bs, names, tag=tag, config=cfg,
                         min_cc=80, act=M % 3, bias=M != 13)
    for i, kwargs in enumerate(({"row_tiles": 1, "warps": 4, "stages": 2}, {"row_tiles": 4, "warps": 4},
                                {"stages": 4, "splits": 3}, {"row_tiles": 1, "stages": 4, "splits": 1})):
        cfg = Config(**kwargs)
        dtype, bits = ((torch.float16, 4), (torch.bfloat16, 8))[i % 2]
        M = 32 if cfg.row_tiles == 4 else (9, 64)[i % 2]
        tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
        names = [(SM, f"gemm_small_m_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg.splits != 1 else [])
        _wo_case("gemm_small_m", "gemm_small_m", dtype, bits, M, 1031, 4160, 64, names, tag=tag, config=cfg,
                 min_cc=80, optional=True)


def _wgmma_cases(wo) -> None:
    """gemm_wgmma (fp16/bf16, sm_90a): every M tile count, split-K and not, block 32/64/128/per-channel, K tails
    inside a trip and a stage, N tails inside a warpgroup's rows and past a whole warpgroup; the variants of
    GemmWgmmaConfig (warpgroups, stages, prefetch, overlap) with --tunables."""
    Config = getattr(wo, "GemmWgmmaConfig", None)
    if Config is None:
        return
    W, R = "gemm_wgmma.cu", "splitk_reduce.cu"
    mt = lambda M: next(t for t in (1, 2, 4, 8, 16) if M <= 8 * t)  # noqa: E731
    one = Config(splits=1)
    for dtype in (torch.float16, torch.bfloat16):
        for bits in (4, 8):
            for M, N, K, bs, cfg, tag in ((1, 4097, 992, 32, one, "nosplit"), (13, 259, 4160, 64, None, "splitk"),
                                          (33, 4097, 4224, 128, one, "nosplit"), (64, 70, 4160, None, None, "splitk"),
                                          (100, 515, 1056, 32, None, "splitk"), (17, 16, 96, 32, one, "tiny-k")):
                names = [(W, f"gemm_wgmma_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg is None else [])
                _wo_case("gemm_wgmma", "gemm_wgmma", dtype, bits, M, N, K, bs, names, tag=tag, config=cfg,
                         min_cc=90, act=M % 3, bias=M != 13)
    for i, kwargs in enumerate(({"warpgroups": 1, "stages": 2}, {"overlap": 1, "prefetch": 4, "stages": 3},
                                {"stages": 6, "prefetch": 8, "splits": 3}, {"min_blocks": 2, "splits": 1})):
        cfg = Config(**kwargs)
        dtype, bits = ((torch.float16, 4), (torch.bfloat16, 8))[i % 2]
        M = (9, 64, 120, 40)[i]
        tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
        names = [(W, f"gemm_wgmma_mt{mt(M)}")] + ([(R, "splitk_reduce")] if cfg.splits != 1 else [])
        _wo_case("gemm_wgmma", "gemm_wgmma", dtype, bits, M, 1031, 4160, 64, names, tag=tag, config=cfg,
                 min_cc=90, optional=True)


def _build_weight_only_cases() -> None:
    from cutlass_ops import weight_only as wo

    GM, GS, GT, R = "gemv_mma.cu", "gemv_stream.cu", "gemv_simt.cu", "splitk_reduce.cu"
    D, Q, PM, PT = "dequant_weight.cu", "gemv_dp4a.cu", "gemm_mma.cu", "gemm_simt.cu"
    half_types = (torch.float16, torch.bfloat16)
    all_types = (torch.float16, torch.bfloat16, torch.float32)

    # gemv_mma (fp16/bf16, sm_80+): every M tile count, split-K and not, block 32/64/128/per-channel.
    # Split-K (fp32 workspace + splitk_reduce) happens when N / 32 blocks leave SMs idle and K has
    # >= 64 chunks: N = 259 splits on any GPU with more than 9 SMs; K = 992 (< 64 chunks) never splits.
    for dtype in half_types:
        for bits in (4, 8):
            mt = _gemv_mma_tile
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 1, 4097, 992, 32, [(GM, f"gemv_mma_mt{mt(1)}")],
                     tag="nosplit", min_cc=80)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 3, 259, 4160, 64,
                     [(GM, f"gemv_mma_mt{mt(3)}"), (R, "splitk_reduce")], tag="splitk", min_cc=80, act=1)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 13, 4097, 4160, 64, [(GM, f"gemv_mma_mt{mt(13)}")],
                     min_cc=80, bias=False)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 17, 4097, 4160, None, [(GM, f"gemv_mma_mt{mt(17)}")],
                     min_cc=80)
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, 47, 515, 4224, 128,
                     [(GM, f"gemv_mma_mt{mt(47)}"), (R, "splitk_reduce")], tag="splitk", min_cc=80, act=0)
    for dtype, bits in ((torch.float16, 4), (torch.bfloat16, 8)):  # each M-tile count at its boundaries
        for M in (8, 9, 16, 33, 64):
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, M, 4097, 4160, 64,
                     [(GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")], tag="m-boundary", min_cc=80, act=M % 3)
    # The gemv_mma variants of GemvMmaConfig (row tiles, unroll, warps, forced splits), where the
    # module has them: each is its own NVRTC module (a minute or more to compile), so --tunables only.
    GemvMmaConfig = getattr(wo, "GemvMmaConfig", None)
    if GemvMmaConfig is not None:
        variants = []
        for kwargs in ({"row_tiles": 1, "splits": 3}, {"row_tiles": 4, "unroll": 2, "warps": 4},
                       {"unroll": 8, "min_blocks": 1, "splits": 2}):
            try:
                variants.append((kwargs, GemvMmaConfig(**kwargs)))
            except (TypeError, ValueError):
                pass
        for i, (kwargs, cfg) in enumerate(variants):
            dtype, bits, M = ((torch.float16, 4, 5), (torch.bfloat16, 8, 9), (torch.float16, 8, 2))[i % 3]
            tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
            names = [(GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")] + ([(R, "splitk_reduce")]
                                                               if kwargs.get("splits", 1) > 1 else [])
            _wo_case("gemv_mma", "gemv_mma", dtype, bits, M, 1031, 4160, 64, names, tag=tag, config=cfg,
                     min_cc=80, optional=True)

    # gemv_stream (fp16/bf16, any arch): every M = 1..8 on the main ragged shape (N = 4097: a partial
    # row group; K = 4160, block 64 asymmetric), then the block / split / overflow-guard paths.
    for dtype in half_types:
        for bits in (4, 8):
            for M in range(1, 9):
                _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 4097, 4160, 64,
                         [(GS, f"gemv_stream_m{M}")], act=M % 3, bias=M != 4)
    for dtype, bits, M, N, K, bs, tag in ((torch.float16, 4, 3, 4097, 4160, None, "perchannel"),
                                          (torch.bfloat16, 8, 5, 4097, 4224, 96, "div-block"),
                                          (torch.float16, 8, 3, 3, 1056, 32, "tiny-n"),
                                          (torch.bfloat16, 4, 2, 77, 1056, 32, "n77")):
        _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, N, K, bs, [(GS, f"gemv_stream_m{M}")], tag=tag)
    for dtype, bits, M in ((torch.float16, 4, 7), (torch.bfloat16, 8, 1)):
        # N = 259: row groups fill few warp slots, K is split (>= 64 chunks per split)
        _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 259, 8192, 128,
                 [(GS, f"gemv_stream_m{M}"), (R, "splitk_reduce")], tag="splitk", act=0)
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 4, 8, 1031, 16384, 128,
             [(GS, "gemv_stream_m8"), (R, "splitk_reduce")], tag="smem-split")
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 4, 3, 515, 2048, 64, [(GS, "gemv_stream_m3")],
             tag="f16-overflow-guard", x_scale=4000.0, act=0, bias=False)
    _wo_case("gemv_stream", "gemv_stream", torch.float16, 8, 3, 515, 2048, 64, [(GS, "gemv_stream_m3")],
             tag="f16-overflow-guard", x_scale=125.0, act=0)
    _wo_case("gemv_stream", None, torch.float16, 4, 1, 1031, 4160, 64, [(GS, "gemv_stream_m1")],
             tag="SMALL_M_GEMV-stream", small_m_gemv="gemv_stream", min_cc=80,
             note="default dispatch with weight_only.SMALL_M_GEMV[1] = 'gemv_stream'")
    StreamConfig = getattr(wo, "StreamConfig", None)
    if StreamConfig is not None:
        for i, kwargs in enumerate(({"rows": 2, "warps": 4}, {"rows": 8, "warps": 16, "min_blocks": 1})):
            try:
                cfg = StreamConfig(**kwargs)
            except (TypeError, ValueError):
                continue
            dtype, bits, M = ((torch.float16, 8, 4), (torch.bfloat16, 4, 6))[i % 2]
            tag = "cfg-" + "-".join(f"{k}{v}" for k, v in kwargs.items())
            _wo_case("gemv_stream", "gemv_stream", dtype, bits, M, 4097, 4160, 64, [(GS, f"gemv_stream_m{M}")],
                     tag=tag, config=cfg, optional=True)

    # gemv_simt (every dtype): every M = 1..8, N = 515 (a partial 4-row block), K = 1056 (block 32).
    for dtype in all_types:
        for bits in (4, 8):
            for M in range(1, 9):
                _wo_case("gemv_simt", "gemv_simt", dtype, bits, M, 515, 1056, 32, [(GT, f"gemv_simt_m{M}")],
                         act=M % 3, bias=M % 2 == 1)
    _wo_case("gemv_simt", "gemv_simt", torch.float32, 4, 3, 4097, 4224, 96, [(GT, "gemv_simt_m3")],
             tag="div-block")
    _wo_case("gemv_simt", "gemv_simt", torch.bfloat16, 8, 6, 4097, 4160, None, [(GT, "gemv_simt_m6")],
             tag="perchannel")
    _wo_case("gemv_mma", None, torch.bfloat16, 8, 6, 4097, 4160, 64,
             [(GM, f"gemv_mma_mt{_gemv_mma_tile(6)}")], public=True, min_cc=80,
             note="public cutlass_ops.linear, default dispatch (gemv_mma on sm_80+)")
    # act-order on Hopper: gather_k, then gemv_mma (WO_PDL_WAIT) as its programmatic dependent; split-K too
    for M, N in ((1, 4097), (11, 259)):
        _wo_case("gemv_mma", "gemv_mma", torch.float16, 4, M, N, 4160, 64,
                 [("gather_k.cu", "gather_k"), (GM, f"gemv_mma_mt{_gemv_mma_tile(M)}")]
                 + ([(R, "splitk_reduce")] if N < 1000 else []), tag="act-order", min_cc=90, perm=True)

    _small_m_cases(wo)
    _wgmma_cases(wo)

    # gemm_mma (fp16/bf16, sm_80+): both CTA tiles (GemmConfig 64 / 128), ragged N and K, the
    # division path (block 48), per-channel.
    for i, (dtype, bits) in enumerate((d, b) for d in half_types for b in (4, 8)):
        for cfg in wo.GEMM_CONFIGS:
            M, N, K, bs = ((17, 4097, 4160, 64), (70, 77, 1056, 32), (129, 515, 4224, 128),
                           (33, 4097, 4160, None))[(i + cfg.m_tile // 64) % 4]
            _wo_case("gemm_mma", "gemm_mma", dtype, bits, M, N, K, bs, [(PM, cfg.kernel_name())],
                     tag=f"mtile{cfg.m_tile}", config=cfg, min_cc=80, act=i % 3)
    for cfg in wo.GEMM_CONFIGS:
        _wo_case("gemm_mma", "gemm_mma", torch.float16, 8, 70, 300, 960, 48, [(PM, cfg.kernel_name())],
                 tag=f"mtile{cfg.m_tile}-div-block", config=cfg, min_cc=80, act=0)
        _wo_case("gemm_mma", "gemm_mma", torch.float16, 4, 300, 4097, 4224, 128, [(PM, cfg.kernel_name())],
                 tag=f"mtile{cfg.m_tile}-several-m-tiles", config=cfg, min_cc=80, act=1)
    # gemm_simt (every dtype, the fallback)
    for dtype in all_types:
        for bits in (4, 8):
            M, N, K, bs = (17, 515, 1056, 32) if bits == 4 else (70, 77, 1056, 32)
            _wo_case("gemm_simt", "gemm_simt", dtype, bits, M, N, K, bs, [(PT, "gemm_simt")], act=bits % 3)
    _wo_case("gemm_simt", "gemm_simt", torch.float16, 8, 70, 300, 960, 48, [(PT, "gemm_simt")], tag="div-block")
    _wo_case("gemm_simt", "gemm_simt", torch.float32, 4, 9, 4097, 4160, None, [(PT, "gemm_simt")],
             tag="perchannel")

    # dequant_weight alone (dequantize_weight), over the tile / tail / group-per-word / division paths
    dequant_shapes = ((4097, 4160, 64), (77, 1056, 32), (300, None, None), (129, 960, 48), (64, 512, "min"))
    for dtype in all_types:
        for bits in (4, 8):
            for N, K, bs in dequant_shapes:
                if K is None:  # per-channel, K % 32 != 0 (int4) / K % 16 != 0 (int8): chunks straddle rows
                    K = 1064 if bits == 4 else 1060
                if bs == "min":
                    bs = 8 if bits == 4 else 4  # the smallest block: one group per word
                _add_dequant_case(dtype, bits, N, K, bs)
    # ... and the dequant_cublas strategy (dequant_weight, then cuBLAS), forced and by default dispatch
    for dtype, bits, M in ((torch.float16, 4, 17), (torch.bfloat16, 8, 3), (torch.float32, 4, 5),
                           (torch.float32, 8, 33)):
        _wo_case("dequant_weight", "dequant_cublas", dtype, bits, M, 515, 1056, 32, [(D, "dequant_weight")],
                 act=M % 3)
    _wo_case("dequant_weight", None, torch.bfloat16, 4, wo.DEQUANT_CUBLAS_MIN_M, 515, 1056, None,
             [(D, "dequant_weight")], tag="default-dispatch",
             note="default dispatch at M = DEQUANT_CUBLAS_MIN_M picks dequant_cublas")

    # gemv_dp4a (int8 weights, every activation type): quantize_q8_1 then gemv_dp4a_m{M}
    for dtype in all_types:
        for M in range(1, 9):
            N, K, bs = (4097, 4160, 64) if M in (1, 8) else (515, 1056, 32)
            _wo_case("gemv_dp4a", "gemv_dp4a", dtype, 8, M, N, K, bs, [(Q, "quantize_q8_1"), (Q, f"gemv_dp4a_m{M}")],
                     act=M % 3, bias=M != 2)
    _wo_case("gemv_dp4a", "gemv_dp4a", torch.float16, 8, 3, 515, 1056, None,
             [(Q, "quantize_q8_1"), (Q, "gemv_dp4a_m3")], tag="perchannel")


def _add_dequant_case(dtype, bits: int, N: int, K: int, block_size: int | None) -> None:
    bs = "pc" if block_size is None else str(block_size)
    name = f"dequantize_weight/{_DT_NAME[dtype]}-int{bits}-N{N}-K{K}-g{bs}"

    def run():
        from cutlass_ops import weight_only as wo

        return wo.dequantize_weight(_linear_weight(N, K, bits, block_size, False), dtype)

    _add(name, "dequant_weight", [_ref("dequant_weight.cu", "dequant_weight", _wo_defines(dtype, bits))], run)
