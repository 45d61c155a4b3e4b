"""FP x INT4 / FP x INT8 conv2d with a block-quantized weight (custom_kernels/kernels/conv_weight_only.cu).

``conv2d_weight_only(x, qw, ...)`` computes ``act(conv2d(x, dequantize(qw)) + bias)`` with the
weight dequantized on the fly (w = q * scale + offset, blocks along Ci). Two strategies:

- ``"direct"``: one thread per output element, fp32 accumulation. Any dtype, NCHW or NHWC,
  any Ci and block size, any GPU. The correctness baseline.
- ``"igemm"``: implicit GEMM on tensor cores (mma.sync, sm_80+) for fp16/bf16 with
  Ci % 32 == 0 and block_size % 32 == 0. It reads the input as NHWC; an NCHW input is first
  transposed to NHWC (one extra kernel), and the output is written directly in the caller's
  layout. Small problems are split along K (fp32 partials, then a reduce kernel that adds the
  bias and applies the activation). Weights are dequantized in the input dtype, with scale and
  offset rounded to it (fp16: |scale|, |offset| must stay below 65504).

``"auto"`` picks igemm where it applies, else direct.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch

from cutlass_ops._validate import (
    FLOAT_DTYPES, check_choice, check_cuda, check_dtype, check_ndim, check_same_device, check_shape,
    parse_activation, parse_pair,
)
from cutlass_ops.formats import QuantizedWeight
from cutlass_ops.ops._loader import load_kernel, on_device
from custom_kernels.launcher import Kernel, device_capability

__all__ = ["conv2d_weight_only", "conv2d_output_shape", "STRATEGIES"]

log = logging.getLogger(__name__)

STRATEGIES = ("auto", "direct", "igemm")
_SOURCE = "conv_weight_only.cu"
# dtype -> (CUOPS_CONV_T code of the .cu file, kernel-name tag)
_DTYPE_CODES = {torch.float32: (1, "f32"), torch.float16: (2, "f16"), torch.bfloat16: (3, "bf16")}
_DIRECT_SIGNATURE = "P" * 6 + "i" * 17
_IGEMM_SIGNATURE = "P" * 7 + "i" * 18
_REDUCE_SIGNATURE = "PPP" + "i" * 5
_TRANSPOSE_SIGNATURE = "PPii"
# Tile of the igemm kernel (conv_weight_only.cu: BM, BN, BK, THREADS).
_BM, _BN, _BK, _IGEMM_THREADS = 64, 64, 32, 128
_ELEMENTWISE_THREADS = 256
_MIN_K_TILES_PER_SPLIT = 2
_CTAS_PER_SM_TARGET = 4
_SPLIT_MIN_SAVED_K_TILES = 9
_MAX_SPLITS = 32
_INT32_MAX = 2 ** 31 - 1


def conv2d_output_shape(H: int, W: int, Kh: int, Kw: int, stride, padding, dilation) -> tuple[int, int]:
    """(Oh, Ow) exactly as torch.nn.functional.conv2d computes them."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    return (H + 2 * ph - dh * (Kh - 1) - 1) // sh + 1, (W + 2 * pw - dw * (Kw - 1) - 1) // sw + 1


@functools.lru_cache(maxsize=None)
def _kernel(name: str, signature: str, t_code: int, bits: int, device: int) -> Kernel:
    # One NVRTC module per (dtype, bits): each build stays around a second.
    return load_kernel(_SOURCE, name, signature, defines={"CUOPS_CONV_T": t_code, "CUOPS_CONV_BITS": bits})


@functools.lru_cache(maxsize=None)
def _capability(device: int) -> int:
    return device_capability(device)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _igemm_unsupported(x: torch.Tensor, channels_last: bool, qw: QuantizedWeight, Ci: int,
                       device: int) -> str | None:
    """Why the igemm strategy cannot run this problem, or None when it can."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"it needs fp16 or bf16 activations, got {x.dtype}"
    if _capability(device) < 80:
        return f"it needs sm_80 or newer, got sm_{_capability(device)}"
    if Ci % _BK != 0:
        return f"it needs Ci % {_BK} == 0, got Ci={Ci}"
    if qw.block_size % _BK != 0:
        return f"it needs block_size % {_BK} == 0, got block_size={qw.block_size}"
    if qw.qweight.data_ptr() % 16 != 0:
        return "it needs qw.qweight 16-byte aligned"
    if channels_last and x.data_ptr() % 16 != 0:  # an NCHW input is copied to a fresh tensor
        return "it needs a 16-byte aligned channels_last x"
    return None


def _choose_splits(M: int, Co: int, KT: int, sms: int) -> int:
    """How many slices to split K into (1 = no split).

    A grid with at least one tile per SM is not split. Otherwise the split aims at about 4 CTAs
    per SM with >= 2 K tiles per slice, and is taken only when it shortens each CTA's K loop by
    more than _SPLIT_MIN_SAVED_K_TILES tiles: measured on an H200 (scripts/bench_conv.py sweeps
    every split), a latency-bound CTA spends about 0.4 us per K tile and the extra reduce
    kernel costs about 3.5 us.
    """
    tiles = math.ceil(M / _BM) * math.ceil(Co / _BN)
    if tiles >= sms:
        return 1
    splits = max(1, min(math.ceil(_CTAS_PER_SM_TARGET * sms / tiles), KT // _MIN_K_TILES_PER_SPLIT, _MAX_SPLITS))
    if KT - math.ceil(KT / splits) <= _SPLIT_MIN_SAVED_K_TILES:
        return 1
    return splits


@dataclass(frozen=True)
class _Launch:
    """Everything about one conv call that depends on shapes only (cached per shape)."""

    strategy: str
    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    int_args: tuple[int, ...]
    splits: int = 1
    transpose: Kernel | None = None  # NCHW -> NHWC copy of the input (igemm on NCHW input)
    reduce: Kernel | None = None
    reduce_grid: tuple[int, int, int] = (1, 1, 1)
    reduce_args: tuple[int, ...] = ()
    workspace_shape: tuple[int, int, int] | None = None


@functools.lru_cache(maxsize=4096)
def _plan(strategy: str, dtype: torch.dtype, bits: int, channels_last: bool, dims: tuple[int, ...],
          split_k: int | None, device: int) -> _Launch:
    batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, sh, sw, ph, pw, dh, dw, block_size, act = dims
    t_code, tag = _DTYPE_CODES[dtype]
    w_tag = f"w{bits}"
    if strategy == "direct":
        name = f"conv_direct_{tag}_{w_tag}_{'nhwc' if channels_last else 'nchw'}"
        total = batch * Co * Oh * Ow
        grid = (math.ceil(total / _ELEMENTWISE_THREADS), 1, 1)
        return _Launch("direct", _kernel(name, _DIRECT_SIGNATURE, t_code, bits, device), grid,
                       (_ELEMENTWISE_THREADS, 1, 1), dims)

    M = batch * Oh * Ow
    KT = Kh * Kw * Ci // _BK
    splits = _choose_splits(M, Co, KT, _sm_count(device)) if split_k is None else min(split_k, KT)
    kt_per_split = math.ceil(KT / splits)
    splits = math.ceil(KT / kt_per_split)  # no empty split
    layout = "nhwc" if channels_last else "nchw"
    kernel = _kernel(f"conv_igemm_{tag}_{w_tag}_{layout}", _IGEMM_SIGNATURE, t_code, bits, device)
    grid = (math.ceil(M / _BM), math.ceil(Co / _BN), splits)
    if grid[1] > 65535:
        raise ValueError(f"Co={Co} is too large for the igemm grid (at most {65535 * _BN})")
    launch = dict(strategy="igemm", kernel=kernel, grid=grid, block=(_IGEMM_THREADS, 1, 1),
                  int_args=dims + (kt_per_split,), splits=splits)
    if not channels_last:
        if batch > 65535:
            raise ValueError(f"batch={batch} is too large for the NCHW transpose grid; pass channels_last input")
        launch["transpose"] = _kernel("conv_nchw_to_nhwc_b16", _TRANSPOSE_SIGNATURE, t_code, bits, device)
    if splits > 1:
        launch.update(
            reduce=_kernel(f"conv_splitk_reduce_{tag}_{layout}", _REDUCE_SIGNATURE, t_code, bits, device),
            reduce_grid=(math.ceil(M * Co / _ELEMENTWISE_THREADS), 1, 1),
            reduce_args=(M, Co, Oh * Ow, splits, act),
            workspace_shape=(splits, Co, M) if not channels_last else (splits, M, Co),
        )
    log.debug("conv igemm plan: M=%d N=%d K=%d grid=%s splits=%d", M, Co, Kh * Kw * Ci, grid, splits)
    return _Launch(**launch)


def _check_qw(qw, x: torch.Tensor) -> tuple[int, int, int, int]:
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"qw must be a QuantizedWeight, got {type(qw).__name__}")
    if qw.conv_shape is None:
        raise ValueError("qw must be a conv weight (formats.quantize_conv_weight); its conv_shape is None")
    Co, Kh, Kw, Ci = qw.conv_shape
    if x.shape[1] != Ci:
        raise ValueError(f"x has {x.shape[1]} channels (dim 1) but qw expects Ci={Ci}")
    if Ci % qw.block_size != 0:
        raise ValueError(f"qw.block_size={qw.block_size} must divide Ci={Ci} (blocks run along Ci)")
    check_same_device({"qw.qweight": qw.qweight, "qw.scale": qw.scale, "qw.offset": qw.offset}, x.device, "x")
    for name in ("qweight", "scale", "offset"):
        if not getattr(qw, name).is_contiguous():
            raise ValueError(f"qw.{name} must be contiguous")
    return Co, Kh, Kw, Ci


def conv2d_weight_only(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None, stride=1,
                       padding=0, dilation=1, act=0, *, out: torch.Tensor | None = None,
                       strategy: str = "auto", split_k: int | None = None) -> torch.Tensor:
    """act(conv2d(x, dequantize(qw), bias, stride, padding, dilation)) on the GPU.

    x: [B, Ci, H, W] fp32/fp16/bf16, NCHW-contiguous or channels_last (any other layout is made
    NCHW-contiguous first). qw: a conv QuantizedWeight (int4 or int8, blocks along Ci). bias:
    None or [Co] (used in x's dtype). stride/padding/dilation: int or (h, w). act: 0/None none,
    1/"relu", 2/"relu6". The output [B, Co, Oh, Ow] has x's dtype and memory format; ``out``
    may supply it (same shape, dtype and memory format). ``strategy``: "auto", "direct" or
    "igemm"; ``split_k`` forces the igemm K split (None: chosen from the GPU's SM count).
    """
    check_dtype(x, "x", FLOAT_DTYPES)
    check_ndim(x, "x", 4, "[B, Ci, H, W]")
    check_cuda(x, "x")
    check_choice(strategy, "strategy", STRATEGIES)
    Co, Kh, Kw, Ci = _check_qw(qw, x)
    stride = parse_pair(stride, "stride", 1)
    padding = parse_pair(padding, "padding", 0)
    dilation = parse_pair(dilation, "dilation", 1)
    act = parse_activation(act, "act")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None or an int >= 1, got {split_k!r}")

    channels_last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    if not channels_last and not x.is_contiguous():
        x = x.contiguous()
    batch, _, H, W = x.shape
    Oh, Ow = conv2d_output_shape(H, W, Kh, Kw, stride, padding, dilation)
    if Oh < 1 or Ow < 1:
        raise ValueError(f"the output would be empty: input {H}x{W}, kernel {Kh}x{Kw}, stride {stride}, "
                         f"padding {padding}, dilation {dilation} give {Oh}x{Ow}")
    if x.numel() > _INT32_MAX or batch * Co * Oh * Ow > _INT32_MAX:
        raise ValueError(f"x {tuple(x.shape)} or the output [{batch}, {Co}, {Oh}, {Ow}] has more than 2^31-1 "
                         f"elements; split the batch")
    if bias is not None:
        check_dtype(bias, "bias", FLOAT_DTYPES)
        check_shape(bias, "bias", (Co,), "[Co]")
        check_same_device({"bias": bias}, x.device, "x")
        if bias.dtype != x.dtype or not bias.is_contiguous():
            bias = bias.to(x.dtype).contiguous()

    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if out is None:
        out = torch.empty((batch, Co, Oh, Ow), dtype=x.dtype, device=x.device, memory_format=memory_format)
    else:
        check_dtype(out, "out", (x.dtype,))
        check_shape(out, "out", (batch, Co, Oh, Ow), "[B, Co, Oh, Ow]")
        check_same_device({"out": out}, x.device, "x")
        if not out.is_contiguous(memory_format=memory_format):
            raise ValueError(f"out must be {'channels_last' if channels_last else 'NCHW'}-contiguous like x")

    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if strategy != "direct":
        reason = _igemm_unsupported(x, channels_last, qw, Ci, device)
        if reason is not None and strategy == "igemm":
            raise ValueError(f"strategy='igemm' cannot run this conv: {reason}")
        strategy = "direct" if reason is not None else "igemm"

    dims = (batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, *stride, *padding, *dilation, qw.block_size, act)
    plan = _plan(strategy, x.dtype, qw.bits, channels_last, dims, split_k, device)
    if device == torch.cuda.current_device():
        _launch(plan, x, qw, bias, out, channels_last)
    else:
        with on_device(device):
            _launch(plan, x, qw, bias, out, channels_last)
    return out


def _launch(plan: _Launch, x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, out: torch.Tensor,
            channels_last: bool) -> None:
    if plan.strategy == "direct":
        plan.kernel.launch(plan.grid, plan.block, (x, qw.qweight, qw.scale, qw.offset, bias, out) + plan.int_args)
        return
    x_nhwc = x
    if not channels_last:  # NCHW caller: one transpose to NHWC; the kernel writes NCHW directly
        batch, C, H, W = x.shape
        x_nhwc = torch.empty_like(x, memory_format=torch.channels_last)
        plan.transpose.launch((math.ceil(H * W / 32), math.ceil(C / 32), batch), (32, 8, 1), (x, x_nhwc, C, H * W))
    workspace = None
    if plan.workspace_shape is not None:
        workspace = torch.empty(plan.workspace_shape, dtype=torch.float32, device=x.device)
    plan.kernel.launch(plan.grid, plan.block,
                       (x_nhwc, qw.qweight, qw.scale, qw.offset, bias, out, workspace) + plan.int_args)
    if plan.reduce is not None:
        plan.reduce.launch(plan.reduce_grid, (_ELEMENTWISE_THREADS, 1, 1), (workspace, bias, out) + plan.reduce_args)
