"""The geometry of one conv2d call, and what the conv kernels share: dtype codes, module loading.

:class:`ConvGeometry` names the 18 integers every conv kernel takes (``conv_common.cuh``'s
``CUOPS_CONV_INT_ARGS``, in that order). It is built once per plan (on a plan-cache miss); the
per-call cache key is the plain tuple :meth:`ConvGeometry.key` would return, which costs less to
build and hash than the dataclass.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import torch

from custom_kernels.launch import I32, Kernel, load_kernel

__all__ = ["ConvGeometry", "conv2d_output_shape", "DTYPE_CODES", "GEOMETRY_FIELDS", "GEOMETRY_ARGS", "conv_defines",
           "conv_kernel"]

# dtype -> (CUOPS_CONV_T code of the .cu files, kernel-name tag)
DTYPE_CODES = {torch.float32: (1, "f32"), torch.float16: (2, "f16"), torch.bfloat16: (3, "bf16")}


def conv2d_output_shape(H: int, W: int, Kh: int, Kw: int, stride, padding, dilation) -> tuple[int, int]:
    """(Oh, Ow) exactly as torch.nn.functional.conv2d computes them."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    return (H + 2 * ph - dh * (Kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (Kw - 1) - 1) // sw + 1


@dataclass(frozen=True)
class ConvGeometry:
    """One conv problem: x [batch, Ci, H, W] * w [Co, Ci / groups, Kh, Kw] -> [batch, Co, Oh, Ow], the
    weight quantized in blocks of ``block_size`` along its K, activation code ``act`` (0 none, 1 relu,
    2 relu6); output channel co reads the input channels of group co // (Co / groups). The field
    names are the kernels' parameter names."""

    batch: int
    H: int
    W: int
    Ci: int
    Oh: int
    Ow: int
    Co: int
    Kh: int
    Kw: int
    sh: int  # stride
    sw: int
    ph: int  # padding
    pw: int
    dh: int  # dilation
    dw: int
    block_size: int
    act: int
    groups: int = 1

    @property
    def M(self) -> int:
        """Output pixels: the implicit GEMM's M = batch * Oh * Ow."""
        return self.batch * self.Oh * self.Ow

    @property
    def Cg(self) -> int:
        """Input channels per group: the weight's Ci."""
        return self.Ci // self.groups

    @property
    def K(self) -> int:
        """The implicit GEMM's K = Kh * Kw * Ci / groups (one group's reduction)."""
        return self.Kh * self.Kw * self.Cg

    def kernel_fields(self) -> dict[str, int]:
        """{parameter name: value} for a KernelArgs block."""
        return dict(zip(GEOMETRY_FIELDS, astuple(self)))


GEOMETRY_FIELDS = tuple(f.name for f in fields(ConvGeometry))
# The ctypes fields of the 18 geometry parameters, for the kernels' KernelArgs classes.
GEOMETRY_ARGS = [(name, I32) for name in GEOMETRY_FIELDS]


def conv_defines(dtype: torch.dtype, bits: int) -> dict[str, int]:
    """The NVRTC defines of the conv kernels' (dtype, bits) module."""
    return {"CUOPS_CONV_T": DTYPE_CODES[dtype][0], "CUOPS_CONV_BITS": bits}


def conv_kernel(source: str, name: str, dtype: torch.dtype, bits: int, arch: str) -> Kernel:
    """Kernel ``name`` of ``source`` from its (dtype, bits) module (one NVRTC build each, about a second)."""
    return load_kernel(source, name, defines=conv_defines(dtype, bits), arch=arch)
