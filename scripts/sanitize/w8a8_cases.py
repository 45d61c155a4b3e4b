"""W8A8 cases: the fused k-block kernels (w8a8_kblock_fused.cu, the wgmma ones) and the block-scaled
symmetric kernel."""
from __future__ import annotations

import math

import torch

from sanitize.inputs import _activations, _cuda, _vector
from sanitize.registry import _DT_NAME, _add, _ref


K_FOR_BLOCK = {32: 4160, 64: 4160, 128: 4352, 256: 4352}  # not multiples of the 128-wide K tile


def _w8a8_weight(N: int, K: int, block_size: int):
    from cutlass_ops.formats import QuantizedWeight

    g = torch.Generator().manual_seed(N + K + block_size)
    G = K // block_size
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    scale = torch.rand(N, G, generator=g) * 0.02 + 1e-3
    offset = torch.randn(N, G, generator=g) * 0.05
    return QuantizedWeight(q.to(_cuda()), scale.to(_cuda()), offset.to(_cuda()), 8, block_size, N, K, None, False)


def _build_w8a8_cases() -> None:
    from cutlass_ops.w8a8 import fused as wf
    from cutlass_ops.w8a8 import tiles

    F = "w8a8_kblock_fused.cu"
    # Every tile variant once, each block size at least once (L: block 128 > BK = 64; L128: block 32,
    # four blocks per K tile), M = 129 and N = 200 ragged in both directions, A pre-quantized.
    plan = (("T", 32, torch.float16, True), ("T32", 256, torch.bfloat16, False), ("S", 128, torch.float32, True),
            ("M", 64, torch.float16, False), ("L", 128, torch.bfloat16, True), ("L128", 32, torch.float32, True))
    for config, bs, dtype, bias in plan:
        if config not in tiles.TILE_CONFIGS:
            continue
        def run(config=config, bs=bs, dtype=dtype, bias=bias):
            M, N, K = 129, 200, K_FOR_BLOCK[bs]
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=9, scale=2.0)
            qa = wf.quantize_activation_torch(x, bs)
            return wf.linear_w8a8_fused(x, qw, _vector(N, dtype) if bias else None, 1, quantized_A=qa, config=config)
        _add(f"w8a8_fused/{config}-g{bs}-{_DT_NAME[dtype]}-M129-N200-K{K_FOR_BLOCK[bs]}", "w8a8_kblock_fused",
             [_ref(F, "w8a8_kblock_gemm", tiles.TILE_CONFIGS[config].defines(bs))], run)
    # The Hopper wgmma kernel: every block size (1, 2, 4 blocks per K tile and 2 tiles per block),
    # the ragged second M tile holds one row; the TMA producers (M and N split) at the extremes
    # (four blocks' parameters per K tile, two K tiles per block).
    for config, bs, dtype, bias in (("W", 32, torch.float16, True), ("W", 64, torch.bfloat16, False),
                                    ("W", 128, torch.float32, True), ("W", 256, torch.float16, False),
                                    ("WT", 32, torch.bfloat16, True), ("WT", 256, torch.float32, False),
                                    ("WN", 32, torch.float16, True), ("WN", 64, torch.bfloat16, False),
                                    ("WN", 128, torch.float32, True), ("WN", 256, torch.bfloat16, True),
                                    ("WP", 32, torch.bfloat16, False), ("WP", 64, torch.float16, True),
                                    ("WP", 128, torch.float32, False), ("WP", 256, torch.float16, True)):
        cfg = tiles.TILE_CONFIGS[config]
        # WN and WP at block 64 quantize inside the call (QuantA writes the row planes); the others
        # pass pre-quantized A (the planar variants then transpose the row parameters themselves)
        quantize_inside = config in ("WN", "WP") and bs == 64
        def run_wgmma(config=config, bs=bs, dtype=dtype, bias=bias, quantize_inside=quantize_inside):
            M, N, K = 129, 200, K_FOR_BLOCK[bs]
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=12, scale=2.0)
            qa = None if quantize_inside else wf.quantize_activation_torch(x, bs)
            return wf.linear_w8a8_fused(x, qw, _vector(N, dtype) if bias else None, 2, quantized_A=qa, config=config)
        refs = [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs))]
        if quantize_inside:
            refs.append(_ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}"))
        elif cfg.planes:
            refs.append(_ref(cfg.kernel_file, tiles.ROW_PLANES_KERNEL, cfg.defines(bs)))
        _add(f"w8a8_fused/{config}-g{bs}-{_DT_NAME[dtype]}-M129-N200-K{K_FOR_BLOCK[bs]}", "w8a8_kblock_wgmma",
             refs, run_wgmma, min_cc=tiles.WGMMA_CC)
    done = {p[0] for p in plan} | {"W", "WT", "WN", "WP"}
    for c in sorted(set(tiles.TILE_CONFIGS) - done):  # variants added later
        def run_extra(c=c):
            qw = _w8a8_weight(200, 4160, 64)
            x = _activations(129, 4160, torch.float16, seed=10)
            return wf.linear_w8a8_fused(x, qw, None, 0, quantized_A=wf.quantize_activation_torch(x, 64), config=c)
        cfg = tiles.TILE_CONFIGS[c]
        _add(f"w8a8_fused/{c}-g64-f16-M129-N200-K4160", "w8a8_kblock_wgmma" if cfg.wgmma else "w8a8_kblock_fused",
             [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(64))], run_extra,
             min_cc=tiles.WGMMA_CC if cfg.wgmma else 0)
    # Default variant choice (choose_config) with the GPU QuantA inside the call; the last through the
    # public API (linear_w8a8, path="fused": no CUTLASS involved).
    for M, N, bs, dtype, public in ((1, 4097, 64, torch.float16, False), (17, 1000, 128, torch.bfloat16, False),
                                    (32, 640, 64, torch.float32, True)):
        K = K_FOR_BLOCK[bs]
        cfg = tiles.choose_config(M, N)  # M <= 32: the mma.sync kernel on every GPU (wgmma cases above)
        def run_default(M=M, N=N, K=K, bs=bs, dtype=dtype, public=public):
            qw = _w8a8_weight(N, K, bs)
            x = _activations(M, K, dtype, seed=11)
            b = _vector(N, dtype)
            if public:
                import cutlass_ops

                return cutlass_ops.linear_w8a8(x, qw, b, "relu6", path="fused")
            return wf.linear_w8a8_fused(x, qw, b, 2)
        _add(f"w8a8_fused/default-{cfg}-g{bs}-{_DT_NAME[dtype]}-M{M}-N{N}-K{K}" + ("-public" if public else ""),
             "w8a8_kblock_fused",
             [_ref(F, "w8a8_kblock_gemm", tiles.TILE_CONFIGS[cfg].defines(bs)),
              _ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}")], run_default)


def _build_block_scaled_cases() -> None:
    from cutlass_ops.w8a8 import block_scaled as bsc
    from cutlass_ops.w8a8 import tiles
    from cutlass_ops.w8a8.block_scaled_plan import REDUCE_KERNEL, SYMMETRIC

    # The block-scaled symmetric kernel (W8A8W_BLOCK_SCALED): every variant once, each block size, ragged M
    # (one row in the second M tile, or fewer than a tile) and N, K not a multiple of the 128-wide K tile
    # (block 64) or blocks spanning two K tiles (256); split-K (grid y, fp32 workspace + reduce) forced where
    # splits > 1, the last slice short; A quantized inside the call (symmetric QuantA) or passed in.
    problems = (("WSB", 64, torch.float16, 17, 200, 576, 3, True), ("WSB", 128, torch.bfloat16, 3, 320, 1024, 1, False),
                ("WSB", 256, torch.float32, 63, 192, 1280, 2, True),
                ("WMB", 64, torch.bfloat16, 129, 200, 576, 5, False),
                ("WNB", 128, torch.float16, 129, 200, 1024, 1, True),
                ("WPB", 256, torch.bfloat16, 129, 1000, 1280, 2, True),
                ("WPB128", 128, torch.float32, 129, 200, 1024, 3, False))
    for config, bs, dtype, M, N, K, splits, inside in problems:
        cfg = tiles.BLOCK_SCALED_CONFIGS[config]
        def run(bs=bs, dtype=dtype, M=M, N=N, K=K, config=config, splits=splits, inside=inside):
            g = torch.Generator().manual_seed(M + N + K + bs)
            weight = bsc.quantize_weight_block_scaled(torch.randn(N, K, generator=g), bs).to(_cuda())
            x = _activations(M, K, dtype, seed=13, scale=2.0)
            qa = None if inside else tuple(t.to(_cuda()) for t in
                                           bsc.quantize_activation_block_scaled_reference(x.cpu(), bs))
            return bsc.linear_w8a8_block_scaled(x, weight, _vector(N, dtype), 1, quantized_A=qa, config=config,
                                                splits=splits)
        refs = [_ref(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs))]
        if splits > 1:
            refs.append(_ref(cfg.kernel_file, REDUCE_KERNEL, cfg.defines(bs)))
        if inside:
            refs.append(_ref("quant_a.cu", f"quant_a_warp_{_DT_NAME[dtype]}", dict(SYMMETRIC)))
        _add(f"w8a8_block_scaled/{config}-g{bs}-{_DT_NAME[dtype]}-M{M}-N{N}-K{K}-s{splits}", "w8a8_kblock_wgmma",
             refs, run, min_cc=tiles.WGMMA_CC)


def _build_pad_rows_cases() -> None:
    """int8 GEMMs at K % 16 != 0: A zero-padded by pad_rows_i8 (K to 128 and to 16, ragged rows), then the GEMM;
    unpad_rows, the copy of D out of a GEMM's padded N."""
    from cutlass_ops.cutlass import padding
    from cutlass_ops.cutlass.padding import PAD_ROWS_KERNEL, UNPAD_ROWS_KERNEL
    import cutlass_ops as ops

    for M, N, K in ((129, 200, 4097), (3, 40, 100)):
        def run(M=M, N=N, K=K):
            g = torch.Generator().manual_seed(M + K)
            A = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8).to(_cuda())
            B = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8).to(_cuda())
            return ops.int8_gemm(A, B)
        _add(f"pad_rows/M{M}-N{N}-K{K}", "pad_rows", [_ref(PAD_ROWS_KERNEL[0], PAD_ROWS_KERNEL[1])], run)
    # D = D_pad[:, :N] after a GEMM on a padded N: load widths 8 (int8 N = 1000), 4 (int32 N = 257), 2 (fp16 N = 3,
    # a last vector shorter than 16 bytes)
    for M, N, N_pad, dtype in ((64, 1000, 1008, torch.int8), (33, 257, 260, torch.int32), (5, 3, 8, torch.float16)):
        def run(M=M, N=N, N_pad=N_pad, dtype=dtype):
            D_pad = torch.randint(-100, 100, (M, N_pad), dtype=torch.int32).to(dtype).to(_cuda())
            return padding.unpad_rows(D_pad, N)
        width = math.gcd(N * torch.empty((), dtype=dtype).element_size(), 16)
        _add(f"unpad_rows/M{M}-N{N}-{str(dtype).split('.')[-1]}", "pad_rows",
             [_ref(UNPAD_ROWS_KERNEL[0], UNPAD_ROWS_KERNEL[1], {"LOAD_BYTES": width})], run)
