"""Block-scaled symmetric W8A8 in the PyTorch layer on a Hopper GPU: ``QuantLinear(mode="w8a8_block_scaled")``
built by ``W8A8BlockScaledConfig``, the public function and the custom op
``torch.ops.cutlass_ops.linear_w8a8_block_scaled`` (opcheck, torch.compile, gradients, round trips).

Outputs are checked per element against the float64 formula evaluated from the reference quantization of x
(the GPU QuantA gives the same bits) with the bound of tests/gpu/test_w8a8_block_scaled_gpu.py:

    |D - ref| <= c * S + u_out * (|ref| + c * S)  (+ 2^-24 for fp16),   c = (G + 3) * 2^-24,

S = sum_j |sA sW Cq_j| + |bias| (that file's docstring derives it). The CPU side of the same layer is in
tests/test_w8a8_block_scaled_module.py.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import cutlass_ops
from _module_checks import check_linear_grads, check_round_trips
from cutlass_ops.nn import QuantLinear
from cutlass_ops.quantize_model import W8A8BlockScaledConfig
from cutlass_ops.w8a8.block_scaled import (BlockScaledWeight, linear_block_scaled_reference,
                                           quantize_activation_block_scaled_reference)

pytestmark = pytest.mark.gpu
ops = torch.ops.cutlass_ops

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not IS_HOPPER, reason="the block-scaled kernel is sm_90a (Hopper) only")

UNIT_ROUNDOFF = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _layer(N: int, K: int, block_size: int, dtype: torch.dtype, act: int = 0, seed: int = 0) -> QuantLinear:
    """A CUDA QuantLinear from a random nn.Linear (bias spread to about +-4)."""
    torch.manual_seed(seed)
    lin = nn.Linear(K, N)
    with torch.no_grad():
        lin.bias.mul_(4 * K ** 0.5)
    q = QuantLinear.from_float(lin.to("cuda", dtype), W8A8BlockScaledConfig(block_size=block_size))
    q.act = act
    return q


def _magnitude(A_q: torch.Tensor, sA: torch.Tensor, w: BlockScaledWeight, bias) -> torch.Tensor:
    """S = sum_j |sA sW Cq_j| + |bias| as float64 [M, N] (Cq_j exact in float64)."""
    M, G, bs, N = A_q.shape[0], w.num_groups, w.block_size, w.N
    A = A_q.double().reshape(M, G, bs)
    B = w.qweight.double().reshape(N, G, bs)
    sW = w.scale.double().repeat_interleave(bs, 0)[:N]
    S = torch.zeros(M, N, dtype=torch.float64) if bias is None else bias.double().abs().expand(M, N).clone()
    for j in range(G):
        S += ((sA.double()[:, j, None] * sW[None, :, j]) * (A[:, j] @ B[:, j].T)).abs()
    return S


def _check(y: torch.Tensor, x: torch.Tensor, w: BlockScaledWeight, bias, act: int) -> None:
    """y (the GPU output for x [..., K]) within the bound of the module docstring, element by element."""
    assert bool(torch.isfinite(y).all()), "NaN/Inf in the output"
    w = w.to("cpu")
    x2d = x.detach().reshape(-1, w.K).cpu()
    bias = None if bias is None else bias.detach().cpu()
    A_q, sA = quantize_activation_block_scaled_reference(x2d, w.block_size)
    ref = linear_block_scaled_reference(x2d, w, bias, act, quantized_A=(A_q, sA))
    S = _magnitude(A_q, sA, w, bias)
    c = (w.num_groups + 3) * 2.0 ** -24
    bound = c * S + UNIT_ROUNDOFF[y.dtype] * (ref.abs() + c * S)
    if y.dtype == torch.float16:
        bound += 2.0 ** -24
    err = (y.detach().reshape(-1, w.N).cpu().double() - ref).abs()
    worst = int((err - bound).argmax())
    m, n = divmod(worst, w.N)
    assert bool((err <= bound).all()), (f"{int((err > bound).sum())} elements out of bound; worst at (m={m}, n={n}): "
                                        f"error {float(err[m, n])}, bound {float(bound[m, n])}")


# (N, K, block_size): N = 200 / 37 not multiples of 128 (a short last weight block; 37 odd: one-element
# stores), K = 320 not a multiple of the 128-column K tile (the last tile holds one 64-block)
SHAPES = [(200, 384, 128), (37, 320, 64), (1000, 768, 256)]
ROWS = {1: (1,), 17: (17,), 300: (3, 100)}  # M = 300 as x [3, 100, K]: leading dims


@hopper
@pytest.mark.parametrize("M", list(ROWS))
@pytest.mark.parametrize("N, K, block_size", SHAPES)
def test_forward_matches_float64_reference(M, N, K, block_size):
    i = SHAPES.index((N, K, block_size)) * len(ROWS) + list(ROWS).index(M)
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    act = i % 3
    q = _layer(N, K, block_size, dtype, act, seed=i)
    x = torch.randn(*ROWS[M], K, device="cuda", dtype=dtype)
    with torch.no_grad():
        y = q(x)
    assert y.shape == (*ROWS[M], N) and y.dtype == dtype
    _check(y, x, q.weight(), q.bias, act)


@hopper
def test_public_function_equals_the_op_and_the_module():
    q = _layer(200, 384, 128, torch.bfloat16, act=1, seed=3)
    x = torch.randn(2, 9, 384, device="cuda", dtype=torch.bfloat16)
    w = q.weight()
    y = cutlass_ops.linear_w8a8_block_scaled(x, w, q.bias, "relu")
    _check(y, x, w, q.bias, 1)
    assert torch.equal(y, ops.linear_w8a8_block_scaled(x, w.qweight, w.scale, q.bias, 1, 128))
    assert torch.equal(q(x), y)
    moved = copy.deepcopy(q).cpu().cuda()  # buffers replaced: the weight view is rebuilt
    assert moved.weight() is not w and torch.equal(moved(x), y)


def _op_args(M: int, requires_grad: bool = False):
    q = _layer(200, 384, 128, torch.float16, seed=M)
    x = torch.randn(M, 384, device="cuda", dtype=torch.float16, requires_grad=requires_grad)
    bias = q.bias.detach().clone().requires_grad_(requires_grad)
    return x, q.qweight, q.scale, bias, 2, 128


@hopper
@pytest.mark.parametrize("M, requires_grad", [(1, False), (17, False), (17, True)])
def test_opcheck_gpu(M, requires_grad):
    torch.library.opcheck(ops.linear_w8a8_block_scaled, _op_args(M, requires_grad))


class _MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 384), nn.Linear(384, 200)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))  # relu: exact, so compiled and eager outputs are equal


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return _MLP().cuda().half()


@hopper
def test_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    model = _mlp()
    summary = cutlass_ops.quantize_(model, W8A8BlockScaledConfig())
    assert summary.converted == ["up", "down"] and not summary.skipped
    x = torch.randn(2, 7, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    assert torch.equal(compiled, eager)


@hopper
def test_backward_matches_float64_reference():
    q = _layer(200, 256, 128, torch.float32, seed=5)
    x = check_linear_grads(q)
    assert q.qweight.grad is None and q.scale.grad is None
    q.scale.requires_grad_(True)
    with pytest.raises(RuntimeError, match="scale requires grad, but the weight is not differentiable"):
        q(x.detach())


@hopper
def test_round_trips_gpu(tmp_path):
    model = _mlp()
    cutlass_ops.quantize_(model, W8A8BlockScaledConfig(block_size=64))
    x = torch.randn(2, 5, 256, device="cuda", dtype=torch.float16)
    fresh = _mlp(seed=1)
    check_round_trips(model, fresh, x, tmp_path / "block_scaled.safetensors")
    assert fresh.up.mode == "w8a8_block_scaled" and fresh.up.quant_config == W8A8BlockScaledConfig(64)


@pytest.mark.skipif(IS_HOPPER, reason="checks the refusal off Hopper")
def test_other_gpus_get_a_clear_error():
    q = _layer(64, 256, 128, torch.float16)
    with pytest.raises(ValueError, match="Hopper"):
        q(torch.randn(3, 256, device="cuda", dtype=torch.float16))
