"""FP x INT4 / FP x INT8 conv2d with a block-quantized weight.

``conv2d_weight_only(x, qw, ...)`` computes ``act(conv2d(x, dequantize(qw), groups=groups) + bias)``
with the weight dequantized on the fly (w = q * scale + offset, blocks along K = Kh*Kw*Ci/groups).
Five strategies, one plan class each (built once per geometry, dtype, weight bits, layout and device,
kept in a bounded cache; a call looks its plan up and launches it):

- ``"direct"`` (:mod:`.direct`): one thread per output element, fp32 accumulation. Any dtype,
  NCHW or NHWC, any Ci, groups and block size, any GPU. The correctness baseline, and what runs
  every conv no other strategy takes.
- ``"igemm"`` (:mod:`.igemm`): implicit GEMM on tensor cores (mma.sync, sm_80+) for fp16/bf16
  with Ci/groups % 32 == 0, block_size % 32 == 0 and, when grouped, (Co/groups) % 64 == 0; an
  NCHW input is transposed to NHWC first, small problems are split along K.

- ``"depthwise"`` (:mod:`.depthwise`): groups = Ci (a channel multiplier allowed), dequantized weights
  staged in shared memory, any dtype and layout.
- ``"small_ci"`` (:mod:`.small_ci`): few input channels per group (CNN stems, Ci = 3), a tile of output
  pixels and channels per block over the weights dequantized into shared memory.
- ``"dequant_cudnn"`` (:mod:`.dequant_cudnn`): the weight dequantized into a transient dense tensor, then
  cuDNN (convs at batch, bound by their multiply-adds rather than the weight's bytes). Any conv.

``"auto"`` (:func:`auto_strategy`) picks dequant_cudnn for fp16 / bf16 convs of at least
``DEQUANT_CUDNN_MIN_MACS`` multiply-adds, else igemm where it applies, else depthwise for groups = Ci, else
dequant_cudnn for fp16 / bf16; fp32 convs take small_ci for an ungrouped conv of at most
``AUTO_SMALL_CI_MAX`` input channels (an RGB(A) or grey stem), else direct. Measured on an H200
(scripts/results/nvidia-h200/bench_conv.md, docs/design.md section 5), against ``F.conv2d(x, w, bias)`` in
channels_last: at batch 1 igemm 0.62-1.06x on the ResNet-50 layers, depthwise 0.86-0.99x, the stem 1.00x
through dequant_cudnn (small_ci 1.47x); at batch 32 dequant_cudnn 0.73-1.12x (igemm took 1.5-3.5x; below
1.0x through its bias epilogue), depthwise 3x3 0.69x.

``cutlass_ops.conv2d`` validates the operands (types, dtypes, ranks, devices) and calls
:func:`conv2d_weight_only`, which keeps only the rules of its own arguments (``out``,
``strategy``, ``split_k``), of the chosen kernel, and the cheap checks that keep the kernels
inside their buffers.
"""
from __future__ import annotations

import functools

import torch

from cutlass_ops._validate import (
    FLOAT_DTYPES, check_choice, check_cuda, check_dtype, check_groups, check_int, check_same_device, check_shape,
    parse_activation, parse_pair,
)
from custom_kernels.device import current_device, on_device, sm_count, smem_limits, target_arch

from .direct import DirectPlan
from .geometry import DTYPE_CODES, ConvGeometry, conv2d_output_shape
from .igemm import IgemmPlan, igemm_unsupported

__all__ = ["conv2d_weight_only", "conv2d_output_shape", "plan_for", "ConvGeometry", "STRATEGIES", "STAGED",
           "AUTO_SMALL_CI_MAX", "DEQUANT_CUDNN_MIN_MACS", "auto_strategy", "strategy_problem"]

STRATEGIES = ("auto", "direct", "igemm", "depthwise", "small_ci", "dequant_cudnn")
_INT32_MAX = 2 ** 31 - 1
PLANS_KEPT = 1024  # distinct (geometry, dtype, bits, layout, strategy, split_k, device) plans


@functools.lru_cache(maxsize=PLANS_KEPT)
def plan_for(strategy: str, dtype: torch.dtype, bits: int, channels_last: bool, dims: tuple[int, ...],
             split_k: int | None, device: int):
    """The plan of one conv problem; ``dims`` are the :class:`ConvGeometry` fields in order."""
    if dtype not in DTYPE_CODES:
        check_dtype(torch.empty(0, dtype=dtype), "x", FLOAT_DTYPES)  # the API's error message
    geometry = ConvGeometry(*dims)
    arch = target_arch(device)
    if strategy == "direct":
        return DirectPlan(geometry, dtype, bits, channels_last, device, arch)
    if strategy in STAGED:
        return _staged(strategy)[0](geometry, dtype, bits, channels_last, device, arch)
    if strategy == "dequant_cudnn":
        from .dequant_cudnn import DequantCudnnPlan

        return DequantCudnnPlan(geometry, dtype, bits, channels_last, device, arch)
    return IgemmPlan(geometry, dtype, bits, channels_last, device, arch, sm_count(device), split_k)


STAGED = ("depthwise", "small_ci")  # strategies over weights staged in shared memory, imported on first use
AUTO_SMALL_CI_MAX = 4  # "auto" sends ungrouped convs of <= 4 input channels (RGB(A) / grey stems) to small_ci
# "auto" sends fp16 / bf16 convs of at least this many multiply-adds (batch * Oh * Ow * Co * Kh * Kw * Ci / groups)
# to dequant_cudnn. The ResNet-50 layers at batch 1 do 51-118 M (igemm 0.60-1.08x cuDNN NHWC on an H200), at
# batch 32 1.6-3.8 G (igemm 1.5-3.5x); docs/design.md section 5 has the crossover measured.
DEQUANT_CUDNN_MIN_MACS = 1 << 28
_DEQUANT_CUDNN_DTYPES = (torch.float16, torch.bfloat16)


def _staged(strategy: str):
    """(plan class, unsupported(geometry, dtype) -> reason or None) of a STAGED strategy."""
    if strategy == "depthwise":
        from .depthwise import DepthwisePlan, depthwise_unsupported

        return DepthwisePlan, depthwise_unsupported
    from .small_ci import SmallCiPlan, small_ci_unsupported

    return SmallCiPlan, small_ci_unsupported


def strategy_problem(strategy: str, geometry: ConvGeometry, dtype: torch.dtype) -> str | None:
    """Why the STAGED ``strategy`` (or dequant_cudnn, which runs any conv) cannot run ``geometry`` with
    ``dtype`` activations (None: it can). Pure: no GPU."""
    if strategy == "dequant_cudnn":
        return None
    return _staged(strategy)[1](geometry, dtype)


def auto_strategy(geometry: ConvGeometry, dtype: torch.dtype, igemm_reason: str | None,
                  smem_limit: int | None = None) -> str:
    """The strategy "auto" runs: dequant_cudnn for fp16 / bf16 convs of >= DEQUANT_CUDNN_MIN_MACS
    multiply-adds, else igemm where it applies (``igemm_reason`` None), else depthwise (groups = Ci), else
    dequant_cudnn for fp16 / bf16; for fp32 small_ci (groups = 1, Ci <= AUTO_SMALL_CI_MAX, its shared
    memory within ``smem_limit`` bytes per block: the GPU's opt-in maximum; None: the strategy's own
    budget), else direct. Pure."""
    if at_batch(dtype, macs(geometry)):
        return "dequant_cudnn"
    if igemm_reason is None:
        return "igemm"
    g = geometry
    if g.groups == g.Ci and g.groups > 1 and strategy_problem("depthwise", g, dtype) is None:
        return "depthwise"
    if dtype in _DEQUANT_CUDNN_DTYPES:  # cuDNN on the dequantized weight beats small_ci (stem) and direct
        return "dequant_cudnn"
    if g.groups == 1 and g.Ci <= AUTO_SMALL_CI_MAX:
        from .small_ci import SMEM_BUDGET, small_ci_unsupported

        if small_ci_unsupported(g, dtype, SMEM_BUDGET if smem_limit is None else smem_limit) is None:
            return "small_ci"
    return "direct"


def at_batch(dtype: torch.dtype, multiply_adds: int) -> bool:
    """"auto"'s first rule: a conv of ``dtype`` with this many multiply-adds runs dequant_cudnn."""
    return dtype in _DEQUANT_CUDNN_DTYPES and multiply_adds >= DEQUANT_CUDNN_MIN_MACS


def macs(geometry: ConvGeometry) -> int:
    """Multiply-adds of the conv: M * Co * K = batch * Oh * Ow * Co * Kh * Kw * Ci / groups."""
    return geometry.M * geometry.Co * geometry.K


@functools.lru_cache(maxsize=None)
def _smem_optin(device: int) -> int:
    """The opt-in maximum of dynamic shared memory per block of ``device`` (a constant of the GPU)."""
    return smem_limits(device)[1]


def _pair(value, name: str, minimum: int) -> tuple[int, int]:
    return value if value.__class__ is tuple and len(value) == 2 else parse_pair(value, name, minimum)


def _check_weight(qw, x: torch.Tensor, groups: int) -> tuple[int, int, int, int]:
    """(Co, Kh, Kw, Ci per group): the weight's rules that keep the kernels inside its buffers."""
    if qw.conv_shape is None:
        raise ValueError("qw must be a conv weight (formats.quantize_conv_weight); its conv_shape is None")
    Co, Kh, Kw, Ci = qw.conv_shape
    if groups != 1:
        check_groups(groups, Co, Ci)
    if x.shape[1] != groups * Ci:
        raise ValueError(f"x has {x.shape[1]} channels (dim 1) but qw expects groups * Ci = {groups} * {Ci}")
    if (Kh * Kw * Ci) % qw.block_size != 0:  # the kernels' last block would read past scale / offset
        raise ValueError(f"qw.block_size={qw.block_size} must divide K = Kh*Kw*Ci = {Kh * Kw * Ci} "
                         f"(blocks run along K)")
    if not (qw.qweight.is_contiguous() and qw.scale.is_contiguous() and qw.offset.is_contiguous()):
        for name in ("qweight", "scale", "offset"):
            if not getattr(qw, name).is_contiguous():
                raise ValueError(f"qw.{name} must be contiguous")
    return Co, Kh, Kw, Ci


def conv2d_weight_only(x: torch.Tensor, qw, bias: torch.Tensor | None = None, stride=1, padding=0, dilation=1,
                       act=0, groups: int = 1, *, out: torch.Tensor | None = None, strategy: str = "auto",
                       split_k: int | None = None) -> torch.Tensor:
    """act(conv2d(x, dequantize(qw), bias, stride, padding, dilation, groups)) on the GPU.

    x: CUDA [B, Ci, H, W] fp32/fp16/bf16, NCHW-contiguous or channels_last (any other layout is
    made NCHW-contiguous first). qw: a conv QuantizedWeight [Co, Ci / groups, Kh, Kw] (int4 or int8,
    blocks along K) on x's device. bias: None or [Co] (used in x's dtype). stride/padding/dilation:
    int or (h, w). act: 0/None none, 1/"relu", 2/"relu6". groups: as torch.nn.functional.conv2d
    (groups = Ci: depthwise). The output [B, Co, Oh, Ow] has x's dtype and memory format;
    ``out`` may supply it (same shape, dtype and memory format). ``strategy``: "auto", "direct",
    "igemm", "depthwise", "small_ci" or "dequant_cudnn"; ``split_k`` forces the igemm K split (None: chosen from the GPU's
    SM count).
    """
    if not x.is_cuda:  # a host pointer would reach the kernel
        check_cuda(x, "x")
    if strategy not in STRATEGIES:
        check_choice(strategy, "strategy", STRATEGIES)
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"split_k must be None or an int >= 1, got {split_k!r}")
    if groups.__class__ is not int:
        check_int(groups, "groups", minimum=1)
    Co, Kh, Kw, Ci = _check_weight(qw, x, groups)
    stride = _pair(stride, "stride", 1)
    padding = _pair(padding, "padding", 0)
    dilation = _pair(dilation, "dilation", 1)
    if act.__class__ is not int:
        act = parse_activation(act, "act")

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
        if bias.shape != (Co,):
            check_shape(bias, "bias", (Co,), "[Co]")
        if bias.dtype != x.dtype or not bias.is_contiguous():
            bias = bias.to(x.dtype).contiguous()

    device = x.device.index
    current = current_device()
    if device is None:
        device = current
    dims = (batch, H, W, groups * Ci, Oh, Ow, Co, Kh, Kw, *stride, *padding, *dilation, qw.block_size, act, groups)
    if strategy == "auto":
        if at_batch(x.dtype, batch * Oh * Ow * Co * Kh * Kw * Ci):  # auto_strategy's first rule, no ConvGeometry
            strategy = "dequant_cudnn"
    if strategy == "auto" or strategy == "igemm":
        reason = igemm_unsupported(x, channels_last, qw, Ci, device, groups)
        if reason is not None and strategy == "igemm":
            raise ValueError(f"strategy='igemm' cannot run this conv: {reason}")
        strategy = ("igemm" if reason is None
                    else auto_strategy(ConvGeometry(*dims), x.dtype, reason, _smem_optin(device)))
    elif strategy in STAGED:
        reason = strategy_problem(strategy, ConvGeometry(*dims), x.dtype)
        if reason is not None:
            raise ValueError(f"strategy={strategy!r} cannot run this conv: {reason}")

    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    if out is not None:
        check_dtype(out, "out", (x.dtype,))
        check_shape(out, "out", (batch, Co, Oh, Ow), "[B, Co, Oh, Ow]")
        check_same_device({"out": out}, x.device, "x")
        if not out.is_contiguous(memory_format=memory_format):
            raise ValueError(f"out must be {'channels_last' if channels_last else 'NCHW'}-contiguous like x")
    if batch * Co * Oh * Ow == 0:  # batch 0 (or Co 0): nothing to launch
        return torch.empty((batch, Co, Oh, Ow), dtype=x.dtype, device=x.device,
                           memory_format=memory_format) if out is None else out
    if out is None and strategy != "dequant_cudnn":  # dequant_cudnn returns cuDNN's output (no copy)
        out = torch.empty((batch, Co, Oh, Ow), dtype=x.dtype, device=x.device, memory_format=memory_format)
    plan = plan_for(strategy, x.dtype, qw.bits, channels_last, dims, split_k, device)
    if device == current:
        result = plan(x, qw, bias, out)
    else:
        with on_device(device):
            result = plan(x, qw, bias, out)
    if out is None:  # dequant_cudnn's own output: torch keeps x's memory format, except in corner cases
        return result if result.is_contiguous(memory_format=memory_format) else result.contiguous(
            memory_format=memory_format)
    return out
