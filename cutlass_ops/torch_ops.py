"""The public GPU ops as ``torch.library`` custom ops in the ``cutlass_ops`` namespace.

Each op takes a ``QuantizedWeight`` as its tensors (qweight, scale, offset) and its ints (bits,
block_size, N, K) - ``linear_w8a8_block_scaled`` a ``BlockScaledWeight`` as (qweight, scale) and its
block_size -, has a fake kernel (shapes and dtypes only, for ``torch.compile`` and ``FakeTensorMode``)
and, where the maths has one, an autograd formula:

    linear, linear_w8a8, linear_w8a8_channel,  grad_x = act'(out) * grad_out @ W_deq   (straight-through
    linear_w8a8_block_scaled                   for the activation quantization of the W8A8 ops)
    conv2d                                     grad_x = conv2d_input(W_deq, act'(out) * grad_out, groups)
    bias (all of them)                         grad_bias = sum of act'(out) * grad_out
    int8_gemm*, quantize_activation            not differentiable: a float input that requires grad raises

The quantized weight never gets a gradient: a ``scale`` or ``offset`` that requires grad raises.
Real kernels: CUDA tensors run the GPU implementation (the packages below ``cutlass_ops.api``),
CPU tensors the float64 reference of ``cutlass_ops.reference`` rounded to the output dtype (so the
modules of ``cutlass_ops.nn`` run, slowly, on the CPU and ``torch.library.opcheck`` runs without a
GPU). The ops do not validate their arguments: ``cutlass_ops.api`` and ``cutlass_ops.nn`` do, once.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple, Optional

import torch

import epilogues
from cutlass_ops import plan_cache, reference
from cutlass_ops.formats import QuantizedWeight, packed_K, quantize_activation_reference, unpack_int4

if TYPE_CHECKING:
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight

__all__ = ["weight_view", "block_scaled_view", "quantize_per_token", "quantize_per_token_reference",
           "linear_w8a8_channel_impl", "DEQUANT_EPILOGUES", "OPS"]

DEQUANT_EPILOGUES = ("dequant", "dequant_relu", "dequant_relu6")  # index = activation code
_DTYPE_NAMES = {v: k for k, v in epilogues.OUTPUT_DTYPES.items()}


def weight_view(qweight, scale, offset, bits: int, block_size: int, N: int, K: int,
                conv_shape=None) -> QuantizedWeight:
    """A QuantizedWeight over the given tensors; validated only when its fields are new to the
    per-weight cache (the plans are found by the tensors' identity, so a view costs no rebuild)."""
    qw = object.__new__(QuantizedWeight)
    qw.__dict__.update(qweight=qweight, scale=scale, offset=offset, bits=bits, block_size=block_size, N=N, K=K,
                       conv_shape=None if conv_shape is None else tuple(conv_shape), symmetric=True)
    entry = plan_cache.entry(qw)
    fields = (bits, block_size, N, K, qw.conv_shape)
    if entry.validated != fields:
        qw.validate()
        entry.validated = fields
    return qw


class _BlockScaledKey(NamedTuple):
    """``plan_cache`` finds a weight by (qweight, scale, offset); a block-scaled weight has no offset, so its
    scale stands in for it, as in ``block_scaled_plan.plan_for`` (the same cache entry as the plans)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor


def block_scaled_view(qweight, scale, block_size: int) -> BlockScaledWeight:
    """A BlockScaledWeight over the given tensors, checked (``BlockScaledWeight.__post_init__``: dtypes,
    shapes, finite scales, a host synchronisation) only when the tensors, an in-place change of them or
    block_size are new to the per-weight cache."""
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight  # pure torch; import cutlass_ops loads no w8a8 module
    entry = plan_cache.entry(_BlockScaledKey(qweight, scale, scale))
    fields = ("block_scaled", block_size)
    if entry.validated != fields:
        weight = BlockScaledWeight(qweight, scale, block_size)
        entry.validated = fields
        return weight
    weight = object.__new__(BlockScaledWeight)  # frozen dataclass: fill its fields without the checks
    weight.__dict__.update(qweight=qweight, scale=scale, block_size=block_size)
    return weight


def _arch(arch: Optional[str]):
    return None if arch is None else int(arch) if arch.isdigit() else arch


def _no_weight_grad(op: str, scale, offset) -> None:
    for name, t in (("scale", scale), ("offset", offset)):
        if t is not None and t.requires_grad:
            raise RuntimeError(f"cutlass_ops.{op}: the quantized weight's {name} requires grad, but the weight is "
                               f"not differentiable (qweight/scale/offset are buffers, not parameters); train an "
                               f"adapter beside it or fine-tune the float model and quantize again")


def _act_grad(grad: torch.Tensor, out: Optional[torch.Tensor], act: int) -> torch.Tensor:
    """act'(out) * grad: relu passes where out > 0, relu6 where 0 < out < 6."""
    if act == 1:
        return grad * (out > 0)
    if act == 2:
        return grad * ((out > 0) & (out < 6))
    return grad


def _not_differentiable(op: str):
    def setup_context(ctx, inputs, output):
        names = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        raise RuntimeError(f"cutlass_ops.{op} is not differentiable (input {names} requires grad); "
                           f"call it under torch.no_grad() or on detached tensors")
    return setup_context


def _unreachable(ctx, *grads):
    raise RuntimeError("unreachable: the forward raised")


# --------------------------------------------------------------------------------------------
# dequantize (used by the backward formulas)
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("cutlass_ops::dequantize", mutates_args=())
def dequantize(qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int, block_size: int,
               N: int, K: int, dtype: torch.dtype) -> torch.Tensor:
    """W = q * scale + offset as ``dtype`` [N, K] (the stored K order also for a conv weight)."""
    qw = weight_view(qweight, scale, offset, bits, block_size, N, K)
    if qweight.is_cuda and dtype != torch.float64:
        from cutlass_ops.weight_only import dequantize_weight
        from cutlass_ops.weight_only.dispatch import dequant_problem
        if dequant_problem(qw) is None:
            return dequantize_weight(qw, dtype)
    return qw.dequantize(dtype, flat=True)


@dequantize.register_fake
def _(qweight, scale, offset, bits, block_size, N, K, dtype):
    return qweight.new_empty((N, K), dtype=dtype)


# --------------------------------------------------------------------------------------------
# linear (weight-only), linear_w8a8 (per K block), linear_w8a8_channel (per token x per channel),
# linear_w8a8_block_scaled (symmetric per 1 x bs activation block x per bs x bs weight tile)
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("cutlass_ops::linear", mutates_args=())
def linear(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int,
           block_size: int, N: int, K: int, bias: Optional[torch.Tensor], act: int) -> torch.Tensor:
    qw = weight_view(qweight, scale, offset, bits, block_size, N, K)
    if not x.is_cuda:
        return reference.linear_reference(x, qw, bias, act).to(x.dtype)
    from cutlass_ops.weight_only import linear_weight_only
    x2d = x.reshape(-1, K).contiguous()
    if x2d.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], N)
    return linear_weight_only(x2d, qw, bias, act).reshape(*x.shape[:-1], N)


@linear.register_fake
def _(x, qweight, scale, offset, bits, block_size, N, K, bias, act):
    return x.new_empty((*x.shape[:-1], N))


@torch.library.custom_op("cutlass_ops::linear_w8a8", mutates_args=())
def linear_w8a8(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_size: int,
                N: int, K: int, bias: Optional[torch.Tensor], act: int, path: str) -> torch.Tensor:
    qw = weight_view(qweight, scale, offset, 8, block_size, N, K)
    if not x.is_cuda:
        return reference.w8a8_kblock_reference(x, qw, None, bias, act).to(x.dtype)
    from cutlass_ops.w8a8 import linear_w8a8 as impl
    x2d = x.reshape(-1, K).contiguous()
    if x2d.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], N)
    return impl(x2d, qw, bias, act, path=path).reshape(*x.shape[:-1], N)


@linear_w8a8.register_fake
def _(x, qweight, scale, offset, block_size, N, K, bias, act, path):
    return x.new_empty((*x.shape[:-1], N))


def quantize_per_token_reference(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_per_token` in torch ops (any device and float dtype): float32 x, s = amax |x| / 127
    per row (1 where that is 0), A_q = clamp(round(x / s), -127, 127) (round half to even) as int8.
    On the CPU every op is one IEEE-rounded float32 op; on CUDA torch computes amax / 127.0 as
    amax * float(1 / 127), 1 ulp off on a few % of rows (the CUDA path runs the kernel instead)."""
    xf = x2d.to(torch.float32)
    s = xf.abs().amax(dim=-1, keepdim=True) / 127.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.round(xf / s).clamp_(-127, 127).to(torch.int8), s


_TOKEN_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the CUDA kernel takes
_quantize_per_token_gpu = None  # bound on the first CUDA call: importing torch_ops loads no launcher


def quantize_per_token(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of x2d [M, K]: (A_q int8 [M, K], s float32 [M, 1]) with s = amax / 127 (1 for
    a zero row), A_q = clamp(round(x / s), -127, 127). CUDA fp16 / bf16 / fp32 x: one kernel
    (``cutlass_ops.w8a8.quant_token``), bit for bit :func:`quantize_per_token_reference` on the CPU (a row
    holding NaN / Inf gets s = NaN / +Inf and A_q = 0 in both; nothing checks x for them: the rows of the
    output come out NaN). Anything else: the reference."""
    global _quantize_per_token_gpu
    if x2d.is_cuda and x2d.dtype in _TOKEN_DTYPES and x2d.dim() == 2 and x2d.shape[1]:
        if _quantize_per_token_gpu is None:
            from cutlass_ops.w8a8.quant_token import quantize_per_token_gpu
            _quantize_per_token_gpu = quantize_per_token_gpu
        return _quantize_per_token_gpu(x2d)
    return quantize_per_token_reference(x2d)


def linear_w8a8_channel_impl(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                             bias: Optional[torch.Tensor], act: int) -> torch.Tensor:
    """act((A_q @ W_q^T) * s_token * s_channel + bias): int8 per-token activations (quantized here:
    :func:`quantize_per_token`), int8 per-channel symmetric weight (qweight [N, K], scale [N, 1] float32); one
    CUTLASS int8 GEMM with the fused dequant epilogue (any N and K, as ``cutlass_ops.int8_gemm`` takes them:
    an unaligned N on the any-N kernel or over N padded, K % 16 != 0 on zero-padded operands).

    The Python path of QuantLinear "w8a8_channel": after a CUDA call it registers what it used with the
    C++ path (``cutlass_ops.w8a8.channel_fast``), which the module's eager forward tries first."""
    N, K = qweight.shape
    A_q, s_row = quantize_per_token(x.reshape(-1, K))
    bias32 = None if bias is None else plan_cache.float32_copy(bias)
    if A_q.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], N)
    if x.is_cuda:
        from cutlass_ops.cutlass import plan_for
        from cutlass_ops.w8a8.channel_fast import register
        device, epilogue = x.get_device(), DEQUANT_EPILOGUES[act]
        plan = plan_for(A_q.shape[0], device, epilogue, None, x.dtype)
        out = plan.run(A_q, qweight, None, {"scale_row": s_row, "scale_col": scale, "bias": bias32}, device)
        if x.dtype in _TOKEN_DTYPES:  # x went through the quant_token kernel
            register(device, x.dtype, K, act, plan)
    else:  # the epilogue's float32 arithmetic on an exact int32 accumulator
        acc = reference.int8_gemm_reference(A_q, qweight).to(torch.float32)
        out = acc * s_row * scale.reshape(1, N) + (0.0 if bias32 is None else bias32)
        out = reference.apply_activation(out, act).to(x.dtype)
    return out.reshape(*x.shape[:-1], N)


@torch.library.custom_op("cutlass_ops::linear_w8a8_channel", mutates_args=())
def linear_w8a8_channel(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor],
                        act: int) -> torch.Tensor:
    return linear_w8a8_channel_impl(x, qweight, scale, bias, act)


@linear_w8a8_channel.register_fake
def _(x, qweight, scale, bias, act):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


@torch.library.custom_op("cutlass_ops::linear_w8a8_block_scaled", mutates_args=())
def linear_w8a8_block_scaled(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor,
                             bias: Optional[torch.Tensor], act: int, block_size: int) -> torch.Tensor:
    """Block-scaled symmetric W8A8 (``cutlass_ops.w8a8.block_scaled``): x [..., K] -> [..., N]. CUDA: the
    Hopper kernel (other GPUs raise ValueError); CPU: the float64 reference rounded to x's dtype."""
    from cutlass_ops.w8a8 import block_scaled  # the kernel's GPU code loads on its first call
    weight = block_scaled_view(qweight, scale, block_size)
    N, K = qweight.shape
    if not x.is_cuda:
        return block_scaled.linear_block_scaled_reference(x, weight, bias, act).to(x.dtype)
    x2d = x.reshape(-1, K).contiguous()
    if x2d.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], N)
    return block_scaled.linear_w8a8_block_scaled(x2d, weight, bias, act).reshape(*x.shape[:-1], N)


@linear_w8a8_block_scaled.register_fake
def _(x, qweight, scale, bias, act, block_size):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


# The dequantized weight W [N, K] of each format for the input gradient: dequant(saved weight tensors, dtype).

def _kblock_weight(dequant_args: tuple, tensors, dtype: torch.dtype) -> torch.Tensor:
    """Per K block: W = q * scale + offset, the dequantize op (a GPU kernel on CUDA tensors)."""
    return dequantize(*tensors, *dequant_args, dtype)


def _channel_weight(tensors, dtype: torch.dtype) -> torch.Tensor:
    """Per channel: W = q * scale [N, 1]."""
    qweight, scale = tensors
    return qweight.to(dtype) * scale.to(dtype)


def _block_scaled_weight(block_size: int, tensors, dtype: torch.dtype) -> torch.Tensor:
    """Per block_size x block_size tile: W[n, k] = q[n, k] * scale[n // bs, k // bs]."""
    from cutlass_ops.w8a8.block_scaled import dequantize_tiles  # pure torch; not loaded at import cutlass_ops

    return dequantize_tiles(*tensors, block_size, dtype)


def _save_linear(ctx, op, inputs, output, tensors, dequant, bias_index, act):
    """What every linear backward needs: the weight's tensors and how to dequantize them (``dequant``:
    (tensors, dtype) -> W [N, K]), the output (for act')."""
    _no_weight_grad(op, tensors[1], tensors[2] if len(tensors) == 3 else None)
    bias = inputs[bias_index]
    ctx.dequant, ctx.act, ctx.bias_index, ctx.n_inputs = dequant, act, bias_index, len(inputs)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(*tensors, output if act else None)


def _linear_setup(ctx, inputs, output):
    x, qweight, scale, offset, bits, block_size, N, K, bias, act = inputs
    _save_linear(ctx, "linear", inputs, output, (qweight, scale, offset),
                 functools.partial(_kblock_weight, (bits, block_size, N, K)), 8, act)


def _w8a8_setup(ctx, inputs, output):
    x, qweight, scale, offset, block_size, N, K, bias, act, path = inputs
    _save_linear(ctx, "linear_w8a8", inputs, output, (qweight, scale, offset),
                 functools.partial(_kblock_weight, (8, block_size, N, K)), 7, act)


def _w8a8_channel_setup(ctx, inputs, output):
    x, qweight, scale, bias, act = inputs
    _save_linear(ctx, "linear_w8a8_channel", inputs, output, (qweight, scale), _channel_weight, 3, act)


def _w8a8_block_scaled_setup(ctx, inputs, output):
    x, qweight, scale, bias, act, block_size = inputs
    _save_linear(ctx, "linear_w8a8_block_scaled", inputs, output, (qweight, scale),
                 functools.partial(_block_scaled_weight, block_size), 3, act)


def _linear_backward(ctx, grad):
    *tensors, out = ctx.saved_tensors
    g = _act_grad(grad, out, ctx.act)
    W = ctx.dequant(tensors, g.dtype)  # [N, K]
    N, K = W.shape
    grads = [None] * ctx.n_inputs
    g2d = g.reshape(-1, N)
    if ctx.needs_input_grad[0]:
        grads[0] = (g2d @ W).reshape(*g.shape[:-1], K)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[ctx.bias_index]:
        grads[ctx.bias_index] = g2d.sum(0).to(ctx.bias_dtype)
    return tuple(grads)


torch.library.register_autograd("cutlass_ops::linear", _linear_backward, setup_context=_linear_setup)
torch.library.register_autograd("cutlass_ops::linear_w8a8", _linear_backward, setup_context=_w8a8_setup)
torch.library.register_autograd("cutlass_ops::linear_w8a8_channel", _linear_backward,
                                setup_context=_w8a8_channel_setup)
torch.library.register_autograd("cutlass_ops::linear_w8a8_block_scaled", _linear_backward,
                                setup_context=_w8a8_block_scaled_setup)


# --------------------------------------------------------------------------------------------
# conv2d (weight-only)
# --------------------------------------------------------------------------------------------

def _conv_out_hw(x, conv_shape, stride, padding, dilation):
    return [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (conv_shape[1 + i] - 1) - 1) // stride[i] + 1
            for i in range(2)]


def _channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


# groups comes last, with a default, so that calls written before it existed keep their meaning.
@torch.library.custom_op("cutlass_ops::conv2d", mutates_args=())
def conv2d(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int,
           block_size: int, conv_shape: list[int], bias: Optional[torch.Tensor], stride: list[int],
           padding: list[int], dilation: list[int], act: int, groups: int = 1) -> torch.Tensor:
    Co, Kh, Kw, Ci = conv_shape  # Ci: input channels per group
    qw = weight_view(qweight, scale, offset, bits, block_size, Co, Kh * Kw * Ci, conv_shape)
    if not x.is_cuda:
        fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
        y = reference.conv2d_reference(x, qw, bias, tuple(stride), tuple(padding), tuple(dilation), act, groups)
        return y.to(x.dtype).contiguous(memory_format=fmt)
    from cutlass_ops.conv import conv2d_weight_only
    return conv2d_weight_only(x, qw, bias, tuple(stride), tuple(padding), tuple(dilation), act, groups)


@conv2d.register_fake
def _(x, qweight, scale, offset, bits, block_size, conv_shape, bias, stride, padding, dilation, act, groups=1):
    Oh, Ow = _conv_out_hw(x, conv_shape, stride, padding, dilation)
    fmt = torch.channels_last if _channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], conv_shape[0], Oh, Ow), dtype=x.dtype, device=x.device, memory_format=fmt)


def _conv_setup(ctx, inputs, output):
    x, qweight, scale, offset, bits, block_size, conv_shape, bias, stride, padding, dilation, act, groups = inputs
    _no_weight_grad("conv2d", scale, offset)
    ctx.args = (bits, block_size, tuple(conv_shape), tuple(stride), tuple(padding), tuple(dilation), act, groups)
    ctx.x_shape, ctx.bias_dtype = x.shape, None if bias is None else bias.dtype
    ctx.save_for_backward(qweight, scale, offset, output if act else None)


def _conv_weight(qweight, scale, offset, bits: int, block_size: int, conv_shape, dtype) -> torch.Tensor:
    """The dequantized conv weight [Co, Ci/groups, Kh, Kw] in ``dtype``, for the input gradient."""
    Co, Kh, Kw, Ci = conv_shape
    K = Kh * Kw * Ci
    if packed_K(K, bits, conv=True) == K:  # the shared dequantize op (a GPU kernel on CUDA tensors)
        W = dequantize(qweight, scale, offset, bits, block_size, Co, K, dtype)
    else:  # an int4 row padded to whole words, which the [N, K] op does not take: torch ops, no checks
        q = unpack_int4(qweight, "interleaved")[:, :K].to(dtype).reshape(Co, K // block_size, block_size)
        W = (q * scale.to(dtype)[..., None] + offset.to(dtype)[..., None]).reshape(Co, K)
    return W.reshape(Co, Kh, Kw, Ci).permute(0, 3, 1, 2)


def _conv_backward(ctx, grad):
    qweight, scale, offset, out = ctx.saved_tensors
    bits, block_size, conv_shape, stride, padding, dilation, act, groups = ctx.args
    g = _act_grad(grad, out, act)
    grad_x = grad_b = None
    if ctx.needs_input_grad[0]:
        W = _conv_weight(qweight, scale, offset, bits, block_size, conv_shape, g.dtype)
        grad_x = torch.nn.grad.conv2d_input(ctx.x_shape, W, g, stride, padding, dilation, groups)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[7]:
        grad_b = g.sum((0, 2, 3)).to(ctx.bias_dtype)
    return grad_x, None, None, None, None, None, None, grad_b, None, None, None, None, None


torch.library.register_autograd("cutlass_ops::conv2d", _conv_backward, setup_context=_conv_setup)


# --------------------------------------------------------------------------------------------
# int8 GEMMs: one op per epilogue family (their epilogue inputs differ)
# --------------------------------------------------------------------------------------------

def _gemm(A, B, epilogue: str, arch, out_dtype: torch.dtype, inputs: dict) -> torch.Tensor:
    if A.is_cuda:
        from cutlass_ops.cutlass import int8_gemm_checked
        return int8_gemm_checked(A.contiguous(), B.contiguous(), epilogue, _arch(arch), out_dtype, None, inputs,
                                 A.get_device())
    acc = reference.int8_gemm_reference(A, B)
    if epilogue == "none":
        return acc
    d = epilogues.get(epilogue).reference(acc, _DTYPE_NAMES[out_dtype], **inputs)
    return d.to(out_dtype)


@torch.library.custom_op("cutlass_ops::int8_gemm", mutates_args=())
def int8_gemm(A: torch.Tensor, B: torch.Tensor, arch: Optional[str]) -> torch.Tensor:
    """int32 D = A @ B^T (epilogue "none")."""
    return _gemm(A, B, "none", arch, torch.int32, {})


@int8_gemm.register_fake
def _(A, B, arch):
    return A.new_empty((A.shape[0], B.shape[0]), dtype=torch.int32)


@torch.library.custom_op("cutlass_ops::int8_gemm_dequant", mutates_args=())
def int8_gemm_dequant(A: torch.Tensor, B: torch.Tensor, scale_row: torch.Tensor, scale_col: torch.Tensor,
                      bias: Optional[torch.Tensor], act: int, out_dtype: torch.dtype,
                      arch: Optional[str]) -> torch.Tensor:
    """Epilogues "dequant" / "dequant_relu" / "dequant_relu6" (act 0 / 1 / 2)."""
    return _gemm(A, B, DEQUANT_EPILOGUES[act], arch, out_dtype,
                 {"scale_row": scale_row, "scale_col": scale_col, "bias": bias})


@int8_gemm_dequant.register_fake
def _(A, B, scale_row, scale_col, bias, act, out_dtype, arch):
    return A.new_empty((A.shape[0], B.shape[0]), dtype=out_dtype)


@torch.library.custom_op("cutlass_ops::int8_gemm_requant", mutates_args=())
def int8_gemm_requant(A: torch.Tensor, B: torch.Tensor, multiplier: torch.Tensor, fused_bias: Optional[torch.Tensor],
                      lo: int, hi: int, arch: Optional[str]) -> torch.Tensor:
    """Epilogues "requant" ((lo, hi) = (-128, 127)) and "requant_clamp": int8 D."""
    if (lo, hi) == (-128, 127):
        return _gemm(A, B, "requant", arch, torch.int8, {"multiplier": multiplier, "fused_bias": fused_bias})
    return _gemm(A, B, "requant_clamp", arch, torch.int8,
                 {"multiplier": multiplier, "fused_bias": fused_bias, "lo": float(lo), "hi": float(hi)})


@int8_gemm_requant.register_fake
def _(A, B, multiplier, fused_bias, lo, hi, arch):
    return A.new_empty((A.shape[0], B.shape[0]), dtype=torch.int8)


@torch.library.custom_op("cutlass_ops::int8_gemm_kblock_accumulate", mutates_args=())
def int8_gemm_kblock_accumulate(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, r1: torch.Tensor,
                                c1: torch.Tensor, r2: torch.Tensor, c2: torch.Tensor, r3: torch.Tensor,
                                c3: torch.Tensor, arch: Optional[str]) -> torch.Tensor:
    """Epilogue "kblock_accumulate": float32 D = C + accum * r1 * c1 + r2 * c2 + r3 * c3."""
    return _gemm(A, B, "kblock_accumulate", arch, torch.float32,
                 dict(C=C, r1=r1, c1=c1, r2=r2, c2=c2, r3=r3, c3=c3))


@int8_gemm_kblock_accumulate.register_fake
def _(A, B, C, r1, c1, r2, c2, r3, c3, arch):
    return A.new_empty((A.shape[0], B.shape[0]), dtype=torch.float32)


@torch.library.custom_op("cutlass_ops::quantize_activation", mutates_args=())
def quantize_activation(x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
    """QuantA per row and K block: (A_q int8 [M, K], scale f32 [M, G], offset f32 [M, G], sum_q int32 [M, G])."""
    if not x.is_cuda:
        return quantize_activation_reference(x, block_size)
    from cutlass_ops.w8a8.quant_a import quantize_activation_gpu
    return quantize_activation_gpu(x.contiguous(), block_size)


@quantize_activation.register_fake
def _(x, block_size):
    M, K = x.shape
    G = K // block_size
    return (x.new_empty((M, K), dtype=torch.int8), x.new_empty((M, G), dtype=torch.float32),
            x.new_empty((M, G), dtype=torch.float32), x.new_empty((M, G), dtype=torch.int32))


for _name in ("int8_gemm", "int8_gemm_dequant", "int8_gemm_requant", "int8_gemm_kblock_accumulate",
              "quantize_activation"):
    torch.library.register_autograd(f"cutlass_ops::{_name}", _unreachable, setup_context=_not_differentiable(_name))

OPS = ("dequantize", "linear", "linear_w8a8", "linear_w8a8_channel", "linear_w8a8_block_scaled", "conv2d",
       "int8_gemm", "int8_gemm_dequant", "int8_gemm_requant", "int8_gemm_kblock_accumulate", "quantize_activation")
