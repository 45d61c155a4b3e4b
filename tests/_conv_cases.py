"""The conv test case and its float64 check, shared by the conv tests (tests/gpu/test_conv_*_gpu.py and the
host emulations tests/test_conv_*_host_emulation.py).

A Case is one conv2d problem; make() draws its operands (the same generator stream for every test that
names the same case); check_against_reference() compares an output with conv2d_reference under the
tolerance derived from the formats: the weight is rounded to the activation dtype after dequantization
(igemm also rounds scale and offset to it: about 2 unit roundoffs of |q*scale| + |offset|), products
accumulate in fp32 (K 2^-23 relative) and the output is rounded once. With
S = conv(|x|, |q*scale| + |offset|, groups) + |bias| and K = Kh*Kw*Ci/groups,
  |y - ref| <= (3 u + K 2^-23) S + u |ref|,   u = 2^-11 (fp16), 2^-8 (bf16), 2^-24 (fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cutlass_ops.conv import conv2d_output_shape, conv2d_weight_only
from cutlass_ops.conv.geometry import DTYPE_CODES, ConvGeometry
from cutlass_ops.formats import quantize_conv_weight
from cutlass_ops.reference import conv2d_reference

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}


def _pair(v) -> tuple[int, int]:
    """k, stride, padding and dilation: one int for both axes, or (along H, along W)."""
    return v if isinstance(v, tuple) else (v, v)


def _dims_id(v) -> str:
    h, w = _pair(v)
    return str(h) if h == w else f"{h}x{w}"


@dataclass(frozen=True)
class Case:
    batch: int
    Ci: int
    H: int
    W: int
    Co: int
    k: int | tuple[int, int]
    stride: int | tuple[int, int]
    padding: int | tuple[int, int]
    dilation: int | tuple[int, int]
    groups: int
    bits: int
    block_size: int | None  # None: one block per (co, kh, kw) over Ci / groups
    dtype: torch.dtype
    channels_last: bool
    act: int
    bias: bool = True

    def __str__(self) -> str:
        return (f"b{self.batch}_ci{self.Ci}_{self.H}x{self.W}_co{self.Co}_g{self.groups}_k{_dims_id(self.k)}"
                f"_s{_dims_id(self.stride)}_p{_dims_id(self.padding)}_d{_dims_id(self.dilation)}_w{self.bits}"
                f"_bs{self.block_size}_{DTYPE_CODES[self.dtype][1]}_{'nhwc' if self.channels_last else 'nchw'}"
                f"_act{self.act}{'' if self.bias else '_nobias'}")


def make(case: Case, seed: int = 0):
    """x (NCHW, case.dtype), the quantized weight and the bias (None without case.bias), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(case.Co, case.Ci // case.groups, *_pair(case.k), generator=g) * 0.2
    qw = quantize_conv_weight(w, bits=case.bits, block_size=case.block_size, symmetric=False)
    x = torch.randn(case.batch, case.Ci, case.H, case.W, generator=g).to(case.dtype)
    bias = (torch.randn(case.Co, generator=g) * 0.5).to(case.dtype) if case.bias else None
    return x, qw, bias


def output_hw(case: Case) -> tuple[int, int]:
    """(Oh, Ow) of case."""
    return conv2d_output_shape(case.H, case.W, *_pair(case.k), _pair(case.stride), _pair(case.padding),
                               _pair(case.dilation))


def kernel_geometry(case: Case, block_size: int) -> ConvGeometry:
    """The 18 ints the conv kernels take for ``case`` (block_size: the quantized weight's)."""
    return ConvGeometry(case.batch, case.H, case.W, case.Ci, *output_hw(case), case.Co, *_pair(case.k),
                        *_pair(case.stride), *_pair(case.padding), *_pair(case.dilation), block_size, case.act,
                        case.groups)


def tolerance(x, qw, bias, case: Case, ref: torch.Tensor) -> torch.Tensor:
    """(3 u + K 2^-23) S + u |ref| (the module docstring); bias None counts as zero."""
    Co, Kh, Kw, Cig = qw.conv_shape
    q = qw.int_values().to(torch.float64).reshape(Co, qw.num_groups, qw.block_size)
    mag = (q.abs() * qw.scale.double().abs()[..., None] + qw.offset.double().abs()[..., None])
    mag = mag.reshape(Co, Kh, Kw, Cig).permute(0, 3, 1, 2)
    S = F.conv2d(x.double().abs(), mag, None if bias is None else bias.double().abs(), case.stride, case.padding,
                 case.dilation, case.groups)
    u = UNIT_ROUNDOFF[case.dtype]
    return (3 * u + Kh * Kw * Cig * 2.0 ** -23) * S + u * ref.abs()


def check_against_reference(y: torch.Tensor, case: Case, x, qw, bias, label: str) -> None:
    """y (NCHW, any device) is the float64 reference of (x, qw, bias) under case within tolerance(), every
    element written (no NaN left of a poisoned out)."""
    ref = conv2d_reference(x, qw, bias, case.stride, case.padding, case.dilation, case.act, groups=case.groups)
    tol = tolerance(x, qw, bias, case, ref)
    assert y.shape == ref.shape, f"{label}: shape {tuple(y.shape)}, reference {tuple(ref.shape)}"
    got = y.double().cpu()
    assert bool(torch.isfinite(got).all()), f"{label}: NaN outputs (unwritten, or an unstaged read)"
    err = (got - ref).abs()
    worst = int(torch.argmax(err - tol))
    assert bool((err <= tol).all()), (f"{label}: max err {err.max():.3e}, at the worst index err "
                                      f"{err.flatten()[worst]:.3e} > tol {tol.flatten()[worst]:.3e}")


def check_strategy(case: Case, strategy: str) -> None:
    """conv2d_weight_only(strategy=...) on the GPU, into a NaN-poisoned out of x's memory format."""
    x, qw, bias = make(case)
    fmt = torch.channels_last if case.channels_last else torch.contiguous_format
    xg = x.cuda().contiguous(memory_format=fmt)
    out = torch.full((case.batch, case.Co, *output_hw(case)), float("nan"), dtype=case.dtype, device="cuda")
    out = out.contiguous(memory_format=fmt)  # poisoned: every element must be written
    y = conv2d_weight_only(xg, qw.to("cuda"), None if bias is None else bias.cuda(), case.stride, case.padding,
                           case.dilation, case.act, case.groups, out=out, strategy=strategy)
    torch.cuda.synchronize()
    assert y is out and y.is_contiguous(memory_format=fmt)
    check_against_reference(y, case, x, qw, bias, f"{case} [{strategy}]")
