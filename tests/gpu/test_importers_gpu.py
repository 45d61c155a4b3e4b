"""Imported checkpoint weights (GPTQ with and without act-order, AWQ, compressed-tensors, GGUF) on the GPU:
``cutlass_ops.linear`` and ``QuantLinear.from_imported`` against the float64 reference of the source's own
weight (x @ W_src^T + bias) at ragged M (1, 3, 17, 130: GEMV, GEMM and dequant + cuBLAS paths) and N, K
that are not powers of two but valid for each source's packing.

Tolerance per output element, as in test_weight_only_gpu.py (derived from the format): the weight
dequantized in the activation type, |dw| <= 2u (|q s| + |o|) per element, summed over K with independent
errors (allowed: 12 u S, S = sqrt(sum_k x_k^2 (|q s| + |o|)^2)); fp32 accumulation 6 * 2^-24 sqrt(K) S;
output rounding u |ref|. A wrong group, a wrong perm or a dropped chunk moves outputs by O(|ref|).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import cutlass_ops
from cutlass_ops.importers import (
    Imported, apply_perm, from_awq, from_compressed_tensors, from_gguf, from_gptq,
)
from cutlass_ops.nn import QuantLinear
from _quant_writers import awq_reference, gptq_reference, make_awq, make_ct_packed, make_gptq

pytestmark = pytest.mark.gpu

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
M_VALUES = (1, 3, 17, 130)
# (case id, N, K): N a multiple of 8 (GPTQ / AWQ pack 8 columns per word), K a multiple of 32 (GGUF blocks,
# int4 words, 16-byte chunks) and of the group size; none a power of two.
CASES = ["gptq4", "gptq4_act_order", "gptq8_act_order_g128", "gptq8", "awq", "ct4_asym", "ct8",
         "gguf_q8_0", "gguf_q4_0", "gguf_q4_1"]


def _source(case: str) -> tuple[Imported, torch.Tensor]:
    """(the imported weight, the source's own dequantized float32 W [N, K]) for a case id."""
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    N, K = 200, 352
    if case.startswith("gptq"):
        bits, act_order = int(case[4]), "act_order" in case
        gs = 128 if case.endswith("g128") else 32
        K = 384 if gs == 128 else K
        qweight, qzeros, scales, g_idx = make_gptq(gen, K, N, bits, gs, "gptq", False, act_order=act_order)
        scales = (scales.float() / 2 ** (bits - 4)).half()  # weights of the same size for 4 and 8 bits
        imp = from_gptq(qweight, qzeros, scales, g_idx, bits=bits, group_size=gs, sym=False)
        assert (imp.perm is not None) == act_order
        return imp, gptq_reference(qweight, qzeros, scales, g_idx, bits, "gptq", torch.float32)
    if case == "awq":
        qweight, qzeros, scales = make_awq(gen, K, N, 32)
        return (from_awq(qweight, qzeros, scales, group_size=32),
                awq_reference(qweight, qzeros, scales.float(), 32))
    if case.startswith("ct"):
        bits, sym = int(case[2]), not case.endswith("asym")
        sd, w = make_ct_packed(gen, N, K, bits, 32, sym)
        return from_compressed_tensors(**sd, num_bits=bits, strategy="group", group_size=32), w
    gguf = pytest.importorskip("gguf")
    qtype = gguf.GGMLQuantizationType[case.removeprefix("gguf_").upper()]
    a = (np.random.default_rng(len(case)).standard_normal((N, K)) * 0.05).astype(np.float32)
    data = gguf.quants.quantize(a, qtype)
    return from_gguf((data, qtype, (K, N))), torch.from_numpy(gguf.quants.dequantize(data, qtype).copy())


def _tolerance(xp: torch.Tensor, imp: Imported, ref: torch.Tensor, dtype) -> torch.Tensor:
    qw = imp.weight.to("cpu")
    q = qw.int_values().to(torch.float64).reshape(qw.N, qw.num_groups, qw.block_size)
    mag = ((q * qw.scale.double()[..., None]).abs() + qw.offset.double().abs()[..., None]).reshape(qw.N, qw.K)
    S = ((xp.double().cpu() ** 2) @ (mag ** 2).T).sqrt()
    u = UNIT_ROUNDOFF[dtype]
    return 1.01 * u * ref.abs() + 12 * u * S + 6 * 2.0 ** -24 * math.sqrt(qw.K) * S + 2.0 ** -25


@pytest.fixture(scope="module", params=CASES)
def source(request):
    imp, w = _source(request.param)
    assert torch.equal(imp.weight.dequantize(), w if imp.perm is None else w[:, imp.perm].contiguous())
    return imp, w


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("M", M_VALUES)
def test_imported_linear_matches_reference(source, M, dtype):
    imp, w = source
    N, K = w.shape
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, K, generator=gen).to(dtype)
    bias = (torch.randn(N, generator=gen) * 0.5).to(dtype)
    ref = x.double() @ w.double().T + bias.double()  # the source's own weight, in nn.Linear's K order
    tol = _tolerance(apply_perm(x, imp.perm), imp, ref, dtype)

    qw = imp.weight.to("cuda")
    xg, bg = x.cuda(), bias.cuda()
    perm = None if imp.perm is None else imp.perm.cuda()
    y_api = cutlass_ops.linear(apply_perm(xg, perm), qw, bg)
    layer = QuantLinear.from_imported(Imported(qw, perm), bg)
    y_mod = layer(xg)
    torch.cuda.synchronize()
    for name, y in (("cutlass_ops.linear", y_api), ("QuantLinear", y_mod)):
        assert y.shape == (M, N) and y.dtype == dtype, name
        err = (y.double().cpu() - ref).abs()
        bad = err > tol
        assert not bad.any(), (f"{name}: {int(bad.sum())} of {M * N} outputs outside the tolerance, worst "
                               f"{float((err / tol).max()):.2f}x")
    assert torch.equal(y_mod, y_api)  # the module is the gather + the same kernel


def test_act_order_layer_gradients_on_gpu():
    imp, w = _source("gptq4_act_order")
    layer = QuantLinear.from_imported(imp).cuda().half()
    assert layer.perm.is_cuda and layer.perm.dtype == torch.int64 and layer.scale.dtype == torch.float32
    x = torch.randn(17, w.shape[1], device="cuda", dtype=torch.float16, requires_grad=True)
    g = torch.randn(17, w.shape[0], device="cuda", dtype=torch.float16)
    layer(x).backward(g)
    ref = g.double() @ w.double().cuda()  # d(x W^T)/dx = g W
    torch.testing.assert_close(x.grad.double(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


@pytest.mark.parametrize("case", ["gptq4_act_order", "gptq8_act_order_g128"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("M", (1, 5, 17, 64, 130))
def test_act_order_plan_equals_gather_then_kernel(case, M, dtype):
    """linear(x, qw, perm=): on Hopper, gemv_mma's act-order plan (gather_k, then the GEMV as its programmatic
    dependent) where the default strategy is gemv_mma, index_select then the kernel otherwise; either way bit-identical to gathering x and
    calling the kernel without perm (same products, same order)."""
    from custom_kernels.device import capability
    from cutlass_ops.weight_only import choose_strategy, get_plan

    imp, w = _source(case)
    qw, perm = imp.weight.to("cuda"), imp.perm.cuda()
    x = torch.randn(M, w.shape[1], device="cuda", generator=torch.Generator("cuda").manual_seed(M)).to(dtype)
    bias = torch.randn(w.shape[0], device="cuda").to(dtype)
    fused = cutlass_ops.linear(x, qw, bias, "relu", perm=perm)
    plain = cutlass_ops.linear(x.index_select(1, perm), qw, bias, "relu")
    torch.cuda.synchronize()
    assert torch.equal(fused, plain)
    plan = get_plan(qw, M, dtype, x.device.index, gather=True)  # the plan linear() used
    cc = capability(x.device.index)
    assert getattr(plan, "gather", False) == (cc >= 90 and choose_strategy(M, dtype, qw, cc) == "gemv_mma")
    # the module's eager path is the same call; under CUDA graphs too (the PDL edge is captured)
    layer = QuantLinear.from_imported(Imported(qw, perm), bias, activation="relu")
    assert torch.equal(layer(x), fused)
    graph, y = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        y = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, fused)


def test_act_order_perm_errors_name_perm():
    imp, w = _source("gptq4_act_order")
    qw = imp.weight.to("cuda")
    x = torch.randn(1, w.shape[1], device="cuda", dtype=torch.float16)
    bad = imp.perm.cuda().clone()
    bad[3] = w.shape[1]  # out of range
    with pytest.raises(ValueError, match="perm values must lie in"):
        cutlass_ops.linear(x, qw, perm=bad)
    with pytest.raises(ValueError, match="perm must be an int32 or int64 tensor"):
        cutlass_ops.linear(x, qw, perm=imp.perm.cuda().float())
    with pytest.raises(ValueError, match="perm"):
        cutlass_ops.linear(x, qw, perm=imp.perm)  # on the CPU
    torch.cuda.synchronize()
    # an in-place change of a perm already used is seen (checked again, not served from the cache)
    good = imp.perm.cuda().clone()
    cutlass_ops.linear(x, qw, perm=good)
    good[0] = -1
    with pytest.raises(ValueError, match="perm values must lie in"):
        cutlass_ops.linear(x, qw, perm=good)

