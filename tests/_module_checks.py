"""Checks of quantized modules shared by the GPU tests (tests/gpu/): the gradients of a quantized linear
(input and bias gradients equal float64 autograd through its dequantized weight), and the round trips of a
quantized model (deepcopy, pickle, safetensors, .cpu().cuda()) reproducing its outputs bit for bit."""
from __future__ import annotations

import copy
import pickle

import torch
import torch.nn.functional as F

import cutlass_ops


def check_linear_grads(q, M: int = 5, rtol: float = 1e-4, atol: float = 1e-4) -> torch.Tensor:
    """Backward of ``q`` (a CUDA float32 QuantLinear with a bias) for random x [M, K] and upstream
    gradient against ``F.linear`` in float64 on ``q.weight().dequantize``; returns x (its .grad set)."""
    q.bias.requires_grad_(True)
    x = torch.randn(M, q.in_features, device="cuda", requires_grad=True)
    g = torch.randn(M, q.out_features, device="cuda")
    q(x).backward(g)
    x64 = x.detach().double().requires_grad_(True)
    b64 = q.bias.detach().double().requires_grad_(True)
    F.linear(x64, q.weight().dequantize(torch.float64), b64).backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=rtol, atol=atol)
    torch.testing.assert_close(q.bias.grad.double(), b64.grad, rtol=rtol, atol=atol)
    return x


def check_round_trips(model, fresh, x: torch.Tensor, path) -> None:
    """A quantized CUDA ``model`` gives, bit for bit, its own output on ``x`` after deepcopy, pickle, a
    safetensors round trip into ``fresh`` (a float model of the same structure; ``path`` the file) and
    ``.cpu().cuda()`` (its buffers replaced: the weight views are rebuilt)."""
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(copy.deepcopy(model)(x), expected)
        assert torch.equal(pickle.loads(pickle.dumps(model))(x), expected)
        cutlass_ops.save_quantized(model, path)
        cutlass_ops.load_quantized_state(fresh, path)
        assert torch.equal(fresh(x), expected)
        assert torch.equal(copy.deepcopy(model).cpu().cuda()(x), expected)
