"""One check for the gradients of a quantized linear layer on the GPU (tests/gpu/): the input and bias
gradients of ``q`` equal float64 autograd through its dequantized weight."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
