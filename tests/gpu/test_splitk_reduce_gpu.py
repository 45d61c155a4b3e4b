"""splitk_reduce.cu on a GPU: the split-K reduction of the weight-only GEMVs, launched directly on a random fp32
workspace [splits, M, N].

The kernel sums the slices in split order in fp32, adds the bias, applies the activation and rounds once to the
output type, so torch's elementwise fp32 arithmetic in the same order gives the same bits: the outputs must equal
that emulation exactly, and lie within fp32 summation plus one output rounding of the float64 sum. Both of the
kernel's paths run: the vector path (N % 4 == 0, D and the bias aligned to four elements) and the scalar one (a
ragged N, or D / the bias one element off an aligned address, with the grid still sized for the vector path).
Outputs are poisoned (NaN) first, so an unwritten element fails.
"""
from __future__ import annotations

import pytest
import torch

from cutlass_ops.reference import apply_activation
from cutlass_ops.weight_only.shared import ELEMENT
from cutlass_ops.weight_only.splitk import reduce_launch

pytestmark = pytest.mark.gpu

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _emulated(workspace: torch.Tensor, bias: torch.Tensor | None, act: int, dtype) -> torch.Tensor:
    v = torch.zeros_like(workspace[0])
    for s in range(workspace.shape[0]):
        v = v + workspace[s]
    if bias is not None:
        v = v + bias.float()
    return apply_activation(v, act).to(dtype)


def _run(workspace, bias, act, dtype, D):
    splits, M, N = workspace.shape
    D.fill_(float("nan"))
    reduce_launch(M, N, splits, ELEMENT[dtype], torch.cuda.current_device())(
        workspace=workspace.data_ptr(), bias=0 if bias is None else bias.data_ptr(), D=D.data_ptr(), act=act)
    torch.cuda.synchronize()
    return D


def _offset_view(shape, dtype, offset: int) -> torch.Tensor:
    """A contiguous tensor of ``shape`` starting ``offset`` elements into a fresh (aligned) allocation."""
    count = 1
    for d in shape:
        count *= d
    return torch.empty(count + offset, dtype=dtype, device="cuda")[offset:].view(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("splits, M, N", [(2, 64, 4096), (3, 7, 1000), (8, 33, 2052), (5, 16, 1031), (2, 1, 3)])
@pytest.mark.parametrize("act", [0, 1, 2])
def test_reduce_sums_in_split_order(dtype, splits, M, N, act):
    gen = torch.Generator().manual_seed(splits * 1000 + N + act)
    workspace = (torch.randn(splits, M, N, generator=gen) * 4).cuda()
    bias = (torch.randn(N, generator=gen)).to(dtype).cuda() if act != 1 else None
    out = _run(workspace, bias, act, dtype, torch.empty(M, N, dtype=dtype, device="cuda"))
    assert torch.equal(out, _emulated(workspace, bias, act, dtype))
    ref = workspace.double().sum(0) + (0 if bias is None else bias.double())
    ref = apply_activation(ref, act)
    tol = splits * 2.0 ** -24 * workspace.double().abs().sum(0) + UNIT_ROUNDOFF[dtype] * ref.abs() * 1.01 + 1e-30
    assert bool(((out.double() - ref).abs() <= tol).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("misaligned", ["D", "bias"])
def test_reduce_misaligned_outputs_take_the_scalar_path(dtype, misaligned):
    """D (or the bias) one element past an aligned address: the scalar path, with the vector path's grid, writes
    the same bits as an aligned call."""
    splits, M, N = 4, 40, 2048
    gen = torch.Generator().manual_seed(7)
    workspace = torch.randn(splits, M, N, generator=gen).cuda()
    bias = torch.randn(N, generator=gen).to(dtype).cuda()
    aligned = _run(workspace, bias, 2, dtype, torch.empty(M, N, dtype=dtype, device="cuda")).clone()
    if misaligned == "bias":
        odd_bias = _offset_view((N,), dtype, 1)
        odd_bias.copy_(bias)
        out = _run(workspace, odd_bias, 2, dtype, torch.empty(M, N, dtype=dtype, device="cuda"))
    else:
        out = _run(workspace, bias, 2, dtype, _offset_view((M, N), dtype, 1))
    assert torch.equal(out, aligned)
    assert torch.equal(aligned, _emulated(workspace, bias, 2, dtype))
