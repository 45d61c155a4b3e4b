"""Quantizer cases: weights (quantize_weight.cu) and per-token activations (quant_token.cu)."""
from __future__ import annotations

import torch

from sanitize.inputs import _activations, _cuda
from sanitize.registry import _DT_NAME, _add, _ref


# -- quantize_weight.cu ------------------------------------------------------------------------

def _build_quantize_weight_cases() -> None:
    QW = "quantize_weight.cu"
    tags = {**_DT_NAME, torch.float64: "f64"}
    # (dtype, bits, symmetric, shape, block_size, transposed): linear [N, K] or conv [Co, Ci, Kh, Kw]; ragged
    # N, per channel (None), an RGB stem (K = 147, int4 rows padded to 152), depthwise, a strided linear weight
    problems = ((torch.float16, 8, True, (3, 320), 64, False), (torch.bfloat16, 4, False, (257, 256), 32, False),
                (torch.float32, 8, False, (64, 3, 7, 7), None, False), (torch.float32, 4, True, (5, 1024), None, True),
                (torch.float64, 8, True, (17, 96), 32, False), (torch.float64, 4, False, (64, 3, 7, 7), None, False),
                (torch.float16, 4, False, (8, 16, 3, 3), 48, False),
                (torch.bfloat16, 8, False, (24, 1, 3, 3), 9, False))
    for dtype, bits, symmetric, shape, block_size, transposed in problems:
        def run(dtype=dtype, bits=bits, symmetric=symmetric, shape=shape, block_size=block_size,
                transposed=transposed):
            from cutlass_ops.formats import quantize_conv_weight, quantize_weight

            g = torch.Generator().manual_seed(sum(shape) + bits)
            w = torch.randn(shape[::-1] if transposed else shape, generator=g, dtype=torch.float64).to(dtype)
            w = w.to(_cuda()).t() if transposed else w.to(_cuda())
            quantize = quantize_conv_weight if len(shape) == 4 else quantize_weight
            return quantize(w, bits=bits, block_size=block_size, symmetric=symmetric).qweight
        name = (f"quantize_weight/{tags[dtype]}-W{bits}-{'x'.join(map(str, shape))}-g{block_size}"
                f"-{'sym' if symmetric else 'asym'}" + ("-strided" if transposed else ""))
        _add(name, "quantize_weight", [_ref(QW, f"quantize_weight_w{bits}_{tags[dtype]}")], run)


# -- quant_token.cu ----------------------------------------------------------------------------

def _build_quant_token_cases() -> None:
    QT = "quant_token.cu"
    # (dtype, M, K, row offset): 1, 2, 4 and 8 warps per row; an offset of 1 or 3 elements starts the rows
    # off a 16-byte boundary (a scalar head and tail around the vectors)
    problems = ((torch.float16, 3, 4096, 0), (torch.bfloat16, 17, 4097, 1), (torch.float32, 64, 7, 0),
                (torch.float16, 5, 14336, 3), (torch.float32, 9, 1000, 1), (torch.bfloat16, 1, 1, 0))
    for dtype, M, K, offset in problems:
        def run(dtype=dtype, M=M, K=K, offset=offset):
            from cutlass_ops.torch_ops import quantize_per_token

            x = _activations(M, K + offset, dtype, seed=9, scale=3.0)[:, offset:]
            return quantize_per_token(x)[0]
        _add(f"quant_token/{_DT_NAME[dtype]}-M{M}-K{K}" + (f"-offset{offset}" if offset else ""), "quant_token",
             [_ref(QT, f"quant_token_{_DT_NAME[dtype]}")], run)
