"""Scheme-2 helper cases (quant_a.cu, scheme2_epilogue.cu): activation quantization, the weight's row sums
and vectors, the dequantize-and-accumulate and bias / activation epilogues."""
from __future__ import annotations

import torch

from sanitize.inputs import _activations, _cuda, _vector
from sanitize.registry import _DT, _DT_NAME, _add, _ref


def _build_scheme2_helper_cases() -> None:
    QA, S2 = "quant_a.cu", "scheme2_epilogue.cu"

    for dtype, M, bs, G in ((torch.float32, 17, 32, 7), (torch.float16, 3, 128, 5), (torch.bfloat16, 1, 256, 2),
                            (torch.float16, 127, 64, 3)):
        def run(dtype=dtype, M=M, bs=bs, G=G):
            from cutlass_ops.w8a8.quant_a import quantize_activation_gpu

            return quantize_activation_gpu(_activations(M, bs * G, dtype, seed=5, scale=3.0), bs)
        # blocks up to 1024 long: one warp per (row, block)
        _add(f"quant_a/{_DT_NAME[dtype]}-M{M}-K{bs * G}-g{bs}", "quant_a",
             [_ref(QA, f"quant_a_warp_{_DT_NAME[dtype]}")], run)

    for K, kernel in ((1000, "quant_a_warp_bf16"), (3000, "quant_a_bf16")):  # longer rows: a block per row
        def run_public(K=K):
            import cutlass_ops

            return cutlass_ops.quantize_activation(_activations(3, K, torch.bfloat16, seed=6), None)
        _add(f"quant_a/bf16-M3-K{K}-one-block-per-row-public", "quant_a", [_ref(QA, kernel)], run_public)

    for dtype, params_2d in ((torch.float32, True), (torch.float16, False), (torch.bfloat16, True)):
        def run_block(dtype=dtype, params_2d=params_2d):
            from cutlass_ops.w8a8.quant_a import quantize_activation_block_gpu

            M, bs, G = 17, 64, 3
            K = bs * G
            wide = _activations(M, K + 24, dtype, seed=7)
            x = wide[:, 8:8 + K]  # row stride K + 24
            A_q = torch.empty((M, bs + 5), dtype=torch.int8, device=_cuda())[:, :bs]
            shape = (M, G) if params_2d else (M,)
            scale = torch.empty(shape, device=_cuda())
            offset = torch.empty(shape, device=_cuda())
            sum_q = torch.empty(shape, dtype=torch.int32, device=_cuda())
            for g in range(G):
                quantize_activation_block_gpu(x, g * bs, bs, A_q, scale, offset, sum_q)
            return A_q
        _add(f"quant_a_block/{_DT_NAME[dtype]}-M17-K192-g64-strided-params{'MxG' if params_2d else 'M'}",
             "quant_a", [_ref(QA, f"quant_a_{_DT_NAME[dtype]}")], run_block)

    for N, bs, G, odd in ((1, 32, 3, False), (17, 64, 5, False), (130, 128, 2, True), (5, 4096, 1, False)):
        def run_sum(N=N, bs=bs, G=G, odd=odd):
            from cutlass_ops.w8a8.quant_a import sum_bq_gpu

            K = bs * G
            g = torch.Generator().manual_seed(N + K)
            q = torch.randint(-128, 128, (N, K + 3), generator=g, dtype=torch.int8).to(_cuda())
            return sum_bq_gpu(q[:, 1:1 + K] if odd else q[:, :K].contiguous(), bs)
        _add(f"precompute_sum_bq/N{N}-K{bs * G}-g{bs}" + ("-odd-address-rows" if odd else ""), "quant_a",
             [_ref(QA, "precompute_sum_bq")], run_sum)

        def run_bvec(N=N, bs=bs, G=G, odd=odd):
            from cutlass_ops.w8a8.quant_a import precompute_bvec_gpu

            K = bs * G
            g = torch.Generator().manual_seed(N + K + 1)
            q = torch.randint(-128, 128, (N, K + 3), generator=g, dtype=torch.int8).to(_cuda())
            scale, offset = (torch.rand(N, G, generator=g).to(_cuda()) for _ in range(2))
            return precompute_bvec_gpu(q[:, 1:1 + K] if odd else q[:, :K].contiguous(), scale, offset, bs)[1]
        _add(f"precompute_bvec/N{N}-K{bs * G}-g{bs}" + ("-odd-address-rows" if odd else ""), "quant_a",
             [_ref(QA, "precompute_bvec")], run_bvec)

    for out_dtype, params_2d in ((torch.float32, True), (torch.float16, False), (torch.bfloat16, True)):
        def run_acc(out_dtype=out_dtype, params_2d=params_2d):
            from cutlass_ops.w8a8.epilogue import dequant_and_acc_gpu

            M, N, bs, G = 17, 41, 64, 4
            g = torch.Generator().manual_seed(M * N)
            dev = _cuda()
            Cq = torch.randint(-2 ** 16, 2 ** 16, (M, N + 8), generator=g, dtype=torch.int32).to(dev)  # ldc > N
            shape = (M, G) if params_2d else (M,)
            sA, oA = torch.rand(shape, generator=g).to(dev) * 0.01, torch.randn(shape, generator=g).to(dev)
            sumA = torch.randint(-4000, 4000, shape, generator=g, dtype=torch.int32).to(dev)
            sB, oB = torch.rand(N, G, generator=g).to(dev) * 0.01, torch.randn(N, G, generator=g).to(dev) * 0.01
            sumB = torch.randint(-4000, 4000, (N, G), generator=g, dtype=torch.int32).to(dev)
            acc = torch.zeros(M, N, dtype=out_dtype, device=dev)
            for i in range(G):
                dequant_and_acc_gpu(Cq, acc, sA, oA, sumA, sB, oB, sumB, i, bs)
            return acc
        _add(f"dequant_and_acc/{_DT_NAME[out_dtype]}-M17-N41-G4-params{'MxG' if params_2d else 'M'}",
             "scheme2_epilogue", [_ref(S2, f"dequant_and_acc_{_DT_NAME[out_dtype]}")], run_acc)

    for src, dst, bias, strided in (("f32", "f32", True, False), ("f16", "f16", True, True),
                                    ("bf16", "bf16", False, False), ("f32", "f16", False, True),
                                    ("f32", "bf16", True, False)):
        def run_bias(src=src, dst=dst, bias=bias, strided=strided):
            from cutlass_ops.w8a8.epilogue import bias_and_activation_gpu

            M, N = 9, 33
            data = _activations(M, N + 7, _DT[src], seed=8, scale=8.0)
            data = data[:, :N] if strided else data[:, :N].contiguous()
            out = None if src == dst else torch.empty((M, N), dtype=_DT[dst], device=_cuda())
            return bias_and_activation_gpu(data, _vector(N, torch.float32) if bias else None, "relu6", out=out)
        _add(f"bias_act/{src}-to-{dst}-M9-N33" + ("-bias" if bias else "") + ("-strided" if strided else "")
             + ("-inplace" if src == dst else ""), "scheme2_epilogue", [_ref(S2, f"bias_act_{src}_{dst}")], run_bias)
