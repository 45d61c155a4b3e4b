"""The public API: validate every argument, then dispatch to the GPU implementation.

Order of checks in every GPU function: arguments (dtypes, shapes, block sizes, names) ->
a CUDA GPU is present -> every tensor (and the QuantizedWeight) is on the same CUDA device.
The GPU modules are imported lazily, so ``import cutlass_ops`` needs no GPU runtime.

After the checks each function either calls its implementation directly (eager mode, no gradient
wanted: the fast path, no dispatcher cost) or goes through its custom op ``torch.ops.cutlass_ops.*``
(``cutlass_ops.torch_ops``: while ``torch.compile`` traces, or when an input requires grad). Both
reach the same implementation.
"""
from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import torch

from cutlass_ops._validate import (
    FLOAT_DTYPES, check_block_size, check_conv_operands, check_cuda, check_dtype, check_int, check_ndim, check_same_device,
    check_int8_operands, check_shape, check_choice, parse_activation, parse_pair,
)
from cutlass_ops import torch_ops  # noqa: F401  (registers torch.ops.cutlass_ops.*)
from cutlass_ops.formats import (
    QuantizedWeight, quantize_activation_reference, quantize_conv_weight, quantize_weight,
)
from cutlass_ops import act_order, plan_cache, recipes
from cutlass_ops.finite_check import check_finite_once, check_per_col_inputs
from cutlass_ops.w8a8 import PATHS as W8A8_PATHS  # the family's own list (importing it loads no GPU code)

if TYPE_CHECKING:
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight

# The function object itself: Dynamo knows it (True while tracing), and a module-level name saves
# the attribute lookups on the eager per-call path.
_is_compiling = torch.compiler.is_compiling
# linear's eager fast path: the activation codes parse_activation accepts that it can look up without checks
_ACT_CODES = {None: 0, "none": 0, "relu": 1, "relu6": 2, 0: 0, 1: 1, 2: 2}
_ACT_TYPES = (type(None), str, int)  # not bool: True == 1 as a key, and parse_activation refuses it

__all__ = [
    "QuantizedWeight", "quantize_weight", "quantize_conv_weight", "quantize_activation", "linear",
    "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant", "W8A8_PATHS",
    "linear_w8a8_block_scaled",
]

# --------------------------------------------------------------------------------------------
# shared checks
# --------------------------------------------------------------------------------------------

def _require_gpu(function: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(f"cutlass_ops.{function}() needs an NVIDIA GPU (torch.cuda.is_available() is "
                           f"False); the float64 references of every op live in cutlass_ops.reference")


def _check_qw(qw, name: str = "qw") -> QuantizedWeight:
    if qw.__class__ is not QuantizedWeight and not isinstance(qw, QuantizedWeight):
        raise TypeError(f"{name} must be a QuantizedWeight (see cutlass_ops.quantize_weight), "
                        f"got {type(qw).__name__}")
    if _is_compiling():  # checked once, while tracing (no cache on the traced object)
        qw.validate()
        return qw
    # The dataclass is mutable: validate (~6 us, and a sync for the finite check) only when a field
    # changed since the last check. The weight's plan_cache entry follows its tensors (identity,
    # address, in-place version) and remembers the other fields it was validated with.
    fields = (qw.bits, qw.block_size, qw.N, qw.K, qw.conv_shape)
    entry = plan_cache.entry(qw)
    if entry.validated != fields:
        qw.validate()
        entry.validated = (qw.bits, qw.block_size, qw.N, qw.K, qw.conv_shape)
    return qw


def _check_bias(bias, N: int) -> None:
    if bias is not None:
        check_dtype(bias, "bias", FLOAT_DTYPES)
        check_shape(bias, "bias", (N,), "[N]")


def _check_last_dim(x: torch.Tensor, name: str, K: int) -> None:
    if x.dim() < 1 or x.shape[-1] != K:
        raise ValueError(f"{name} must have shape [..., K] with K={K} (qw.K), got {tuple(x.shape)}")


def _check_devices(function: str, primary_name: str, primary: torch.Tensor,
                   others: dict[str, torch.Tensor | None], qw: QuantizedWeight | None = None) -> None:
    """GPU present, ``primary`` on CUDA, every other tensor and ``qw`` on the same device."""
    if not primary.is_cuda:  # a CUDA tensor implies a GPU (torch.cuda.is_available() costs ~5 us a call)
        _require_gpu(function)
    check_cuda(primary, primary_name)
    check_same_device(others, primary.device, primary_name)
    if qw is not None:
        for field in ("qweight", "scale", "offset"):
            t = getattr(qw, field, None)  # a BlockScaledWeight has no offset
            if t is not None and t.device != primary.device:
                raise ValueError(f"qw.{field} is on {t.device} but {primary_name} is on {primary.device}; "
                                 f"move the weight with qw.to({primary_name}.device)")


def _replayed(x, qweight: torch.Tensor, scale: torch.Tensor, offset, bias, activation,
              bias32: bool = False) -> torch.Tensor | None:
    """An eager call's output from the extension's replay of its problem's launches (:mod:`cutlass_ops.recipes`,
    recorded after the problem's first call through the checked path), or None: anything not plain (a CPU,
    traced or subclassed tensor, an activation to parse, an input wanting a gradient, an unrecorded problem)
    takes the checked path, which raises or records. ``bias32``: the family reads the bias as float32 (the
    W8A8 ones: its kept copy, ``plan_cache.float32_copy``), else in x's dtype."""
    if x.__class__ is not torch.Tensor or not x.is_cuda or _is_compiling():
        return None
    act = _ACT_CODES.get(activation) if activation.__class__ in _ACT_TYPES else None
    if act is None:
        return None
    if bias32 and bias is not None:
        if not isinstance(bias, torch.Tensor):
            return None  # the checked path raises
        bias = plan_cache.float32_copy(bias)
    return recipes.run(x, qweight, scale, offset, bias, act)


def _through_op(x: torch.Tensor, bias, qw=None) -> bool:
    """True when the call must go through its custom op: while torch.compile traces, or when autograd
    must record it (an input, the bias, or - to raise there - the weight's scale/offset requires grad)."""
    if _is_compiling():
        return True
    if not torch.is_grad_enabled():
        return False
    return (x.requires_grad or (bias is not None and bias.requires_grad)
            or (qw is not None and (qw.scale.requires_grad or qw.offset.requires_grad)))


def _no_grad_inputs(function: str, tensors: dict) -> None:
    """RuntimeError naming the first float input that requires grad: ``function`` is not differentiable."""
    if torch.is_grad_enabled():
        for name, t in tensors.items():
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise RuntimeError(f"cutlass_ops.{function}() is not differentiable but {name} requires grad; "
                                   f"call it under torch.no_grad() or pass {name}.detach()")


def _check_arch(arch):
    """None (the current device), an int cc such as 80/90, or a str such as "90a"."""
    if arch is None:
        return None
    if isinstance(arch, bool) or not isinstance(arch, (int, str)):
        raise TypeError(f"arch must be None, an int (e.g. 80) or a str (e.g. '90a'), "
                        f"got {type(arch).__name__}")
    if not re.fullmatch(r"\d{2,3}a?", str(arch)):
        raise ValueError(f"arch must look like 75, 80, 90 or '90a', got {arch!r}")
    return arch


# --------------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------------

def quantize_activation(x: torch.Tensor, block_size: int | None = None):
    """QuantA per row and K block: (A_q int8 [M,K], scale f32 [M,G], offset f32 [M,G], sum_q int32 [M,G]).

    CPU tensors use ``formats.quantize_activation_reference``; CUDA tensors the GPU kernel.
    block_size None => one block per row.
    """
    check_dtype(x, "x", FLOAT_DTYPES)
    check_ndim(x, "x", 2, "[M, K]")
    block_size = check_block_size(block_size, x.shape[1])
    _no_grad_inputs("quantize_activation", {"x": x})
    if _is_compiling():
        return torch.ops.cutlass_ops.quantize_activation(x, block_size)
    if x.device.type == "cpu":
        return quantize_activation_reference(x, block_size)
    check_cuda(x, "x")
    from cutlass_ops.w8a8.quant_a import quantize_activation_gpu
    return quantize_activation_gpu(x.contiguous(), block_size)


def linear(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None,
           activation=None, *, perm: torch.Tensor | None = None) -> torch.Tensor:
    """Weight-only quantized linear: act(x @ dequantize(qw)^T + bias); x [..., K] -> [..., N].

    perm: act-order (GPTQ desc_act), an integer tensor [K] with values in [0, K): the weight's K order
    is x's order permuted, and the result is act(x[..., perm] @ dequantize(qw)^T + bias). On Hopper the
    small-M GEMV runs as the programmatic dependent of its gather kernel (the weight stream overlaps the
    gather); elsewhere x is gathered first. Its range is checked once per tensor and version.
    """
    if perm is None and qw.__class__ is QuantizedWeight:
        out = _replayed(x, qw.qweight, qw.scale, qw.offset, bias, activation)  # eager, once recorded
        if out is not None:
            return out
    _check_qw(qw)
    check_dtype(x, "x", FLOAT_DTYPES)
    _check_last_dim(x, "x", qw.K)
    _check_bias(bias, qw.N)
    act = parse_activation(activation)
    _check_devices("linear", "x", x, {"bias": bias} if perm is None else
                   {"bias": bias, "perm": perm if isinstance(perm, torch.Tensor) else None}, qw)
    if perm is not None:
        perm = act_order.checked_perm(qw, perm)
    if _through_op(x, bias, qw):
        if perm is not None:  # a differentiable, traceable gather, then the op
            x = x.index_select(-1, perm)
        return torch.ops.cutlass_ops.linear(x, qw.qweight, qw.scale, qw.offset, qw.bits, qw.block_size, qw.N, qw.K,
                                            None if bias is None else bias.contiguous(), act)
    from cutlass_ops.weight_only import linear_weight_only
    if x.dim() == 2:  # the common case: no reshapes (each costs ~1.5 us of host time)
        if x.shape[0] == 0:
            return x.new_empty(0, qw.N)
        out = linear_weight_only(x.contiguous(), qw, None if bias is None else bias.contiguous(), act, perm=perm)
    else:
        x2d = x.reshape(-1, qw.K).contiguous()
        if x2d.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], qw.N)
        out = linear_weight_only(x2d, qw, None if bias is None else bias.contiguous(), act,
                                 perm=perm).reshape(*x.shape[:-1], qw.N)
    if perm is None and x.is_cuda:
        recipes.register(x, qw, qw.offset, bias is not None, act, "cutlass_ops.weight_only")
    return out


def conv2d(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None, stride=1, padding=0,
           dilation=1, activation=None, groups=1) -> torch.Tensor:
    """Weight-only quantized conv2d: x [B, Ci, H, W] (NCHW or channels_last) -> [B, Co, Oh, Ow].

    groups as torch.nn.functional.conv2d: qw is [Co, Ci / groups, Kh, Kw] (``quantize_conv_weight``
    of the grouped weight), Co % groups == 0; groups = Ci is a depthwise conv."""
    _check_qw(qw)
    Co, Kh, Kw, Ci = check_conv_operands(x, qw, FLOAT_DTYPES, groups)
    _check_bias(bias, Co)
    stride = parse_pair(stride, "stride", 1)
    padding = parse_pair(padding, "padding", 0)
    dilation = parse_pair(dilation, "dilation", 1)
    act = parse_activation(activation)
    for i, (size, k) in enumerate(zip(x.shape[2:], (Kh, Kw))):
        if size + 2 * padding[i] < dilation[i] * (k - 1) + 1:
            raise ValueError(f"x spatial size {tuple(x.shape[2:])} with padding={padding} is smaller than "
                             f"the dilated kernel ({Kh}, {Kw}) with dilation={dilation}")
    _check_devices("conv2d", "x", x, {"bias": bias}, qw)
    if not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
        x = x.contiguous()
    bias = None if bias is None else bias.contiguous()
    if _through_op(x, bias, qw):
        return torch.ops.cutlass_ops.conv2d(x, qw.qweight, qw.scale, qw.offset, qw.bits, qw.block_size,
                                            list(qw.conv_shape), bias, list(stride), list(padding), list(dilation),
                                            act, groups)
    from cutlass_ops.conv import conv2d_weight_only
    return conv2d_weight_only(x, qw, bias, stride, padding, dilation, act, groups)


def linear_w8a8(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None, activation=None,
                path: str = "fused") -> torch.Tensor:
    """Scheme 2 (W8A8 per K block): QuantA(x, qw.block_size), int8 GEMM per block, 4-term dequant.

    path: "fused" (one kernel), "orchestrator" (per-block CUTLASS GEMMs) or "literal" (the
    documents' kernels one by one). x [..., K] -> [..., N].
    """
    if path == "fused" and qw.__class__ is QuantizedWeight:
        out = _replayed(x, qw.qweight, qw.scale, qw.offset, bias, activation, bias32=True)  # eager, once recorded
        if out is not None:
            return out
    _check_qw(qw)
    if qw.bits != 8:
        raise ValueError(f"qw must be an int8 weight (bits=8) for linear_w8a8, got bits={qw.bits}")
    check_dtype(x, "x", FLOAT_DTYPES)
    _check_last_dim(x, "x", qw.K)
    _check_bias(bias, qw.N)
    act = parse_activation(activation)
    check_choice(path, "path", W8A8_PATHS)
    _check_devices("linear_w8a8", "x", x, {"bias": bias}, qw)
    if _through_op(x, bias, qw):
        return torch.ops.cutlass_ops.linear_w8a8(x, qw.qweight, qw.scale, qw.offset, qw.block_size, qw.N, qw.K,
                                                 None if bias is None else bias.contiguous(), act, path)
    x2d = x.reshape(-1, qw.K).contiguous()
    if x2d.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], qw.N)
    from cutlass_ops.w8a8 import linear_w8a8 as _impl
    out = _impl(x2d, qw, None if bias is None else bias.contiguous(), act, path=path)
    if path == "fused":
        recipes.register(x, qw, qw.offset, bias is not None, act, "cutlass_ops.w8a8.fused")
    return out.reshape(*x.shape[:-1], qw.N)


def _check_block_scaled(qw) -> BlockScaledWeight:
    """``qw`` is a BlockScaledWeight of a block size the kernel takes, its fields checked again after an
    in-place change of its tensors (while torch.compile traces: not again, a data-dependent check)."""
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight  # pure torch, loaded on first use
    from cutlass_ops.w8a8.tiles import BLOCK_SCALED_SIZES
    if not isinstance(qw, BlockScaledWeight):
        raise TypeError(f"qw must be a BlockScaledWeight (see cutlass_ops.quantize_weight_block_scaled), "
                        f"got {type(qw).__name__}")
    if qw.block_size not in BLOCK_SCALED_SIZES:
        raise ValueError(f"the block-scaled W8A8 kernel needs qw.block_size in {BLOCK_SCALED_SIZES}, "
                         f"got {qw.block_size}")
    if not _is_compiling():
        torch_ops.block_scaled_view(qw.qweight, qw.scale, qw.block_size)
    return qw


def linear_w8a8_block_scaled(x: torch.Tensor, qw: BlockScaledWeight, bias: torch.Tensor | None = None,
                             activation=None) -> torch.Tensor:
    """Block-scaled symmetric W8A8 (DeepSeek-V3's recipe in int8; Hopper, sm_90a, only): x quantized
    symmetric per row and K block of qw.block_size, an int8 GEMM per block, one scale per (row, K block)
    times one per weight tile: act(sum_j sA sW Cq_j + bias). x [..., K] -> [..., N].

    qw: a :class:`BlockScaledWeight` (``quantize_weight_block_scaled``) with block_size 64, 128 or 256,
    on x's device. Other GPUs raise ValueError (the kernel is Hopper's wgmma); the float64 reference is
    ``cutlass_ops.w8a8.block_scaled.linear_block_scaled_reference``.
    """
    block_scaled = sys.modules.get("cutlass_ops.w8a8.block_scaled")  # qw can be one only once it is imported
    if block_scaled is not None and qw.__class__ is block_scaled.BlockScaledWeight:
        out = _replayed(x, qw.qweight, qw.scale, None, bias, activation, bias32=True)  # eager, once recorded
        if out is not None:
            return out
    _check_block_scaled(qw)
    check_dtype(x, "x", FLOAT_DTYPES)
    _check_last_dim(x, "x", qw.K)
    _check_bias(bias, qw.N)
    act = parse_activation(activation)
    _check_devices("linear_w8a8_block_scaled", "x", x, {"bias": bias}, qw)
    bias = None if bias is None else bias.contiguous()
    if _through_op(x, bias) or (torch.is_grad_enabled() and qw.scale.requires_grad):
        return torch.ops.cutlass_ops.linear_w8a8_block_scaled(x, qw.qweight, qw.scale, bias, act, qw.block_size)
    x2d = x.reshape(-1, qw.K).contiguous()
    if x2d.shape[0] == 0:
        return x.new_empty(*x.shape[:-1], qw.N)
    from cutlass_ops.w8a8.block_scaled import linear_w8a8_block_scaled as _impl
    out = _impl(x2d, qw, bias, act)
    recipes.register(x, qw, None, bias is not None, act, "cutlass_ops.w8a8.block_scaled_plan")
    return out.reshape(*x.shape[:-1], qw.N)


def _gemm_impl():
    """cutlass_ops.cutlass.plan_for, imported on first use (a per-call import costs host time)."""
    global _gemm_plan_for
    if _gemm_plan_for is None:
        from cutlass_ops.cutlass import plan_for
        _gemm_plan_for = plan_for
    return _gemm_plan_for


_gemm_plan_for = None


_OUT_DTYPES_OK: set = set()  # (epilogue, out.dtype, out_dtype) already checked by _check_out_dtype


def _check_out_dtype(out: torch.Tensor, out_dtype, epilogue: str) -> None:
    """``out``'s dtype is ``out_dtype`` and one the epilogue writes (errors name ``out``)."""
    key = (epilogue, out.dtype, out_dtype)
    if key in _OUT_DTYPES_OK:
        return
    import epilogues

    written = [epilogues.OUTPUT_DTYPES[name] for name in epilogues.get(epilogue).output_dtypes]
    if out.dtype not in written or out.dtype != out_dtype:
        raise ValueError(f"out must have dtype {' or '.join(str(d) for d in written)} (what epilogue "
                         f"{epilogue!r} writes)" + (f" and equal to out_dtype={out_dtype}" if out.dtype != out_dtype
                                                    else "") + f", got {out.dtype}")
    _OUT_DTYPES_OK.add(key)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors intersect (contiguous spans: what the kernels touch)."""
    a_bytes, b_bytes = a.nbytes, b.nbytes
    if not (a_bytes and b_bytes):
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b_bytes and b0 < a0 + a_bytes


def int8_gemm(A: torch.Tensor, B: torch.Tensor, epilogue: str = "none", *, arch=None, out_dtype=None,
              out: torch.Tensor | None = None, **epilogue_args) -> torch.Tensor:
    """D[M, N] = epilogue(A[M, K] @ B[N, K]^T) with int8 A, B and an int32 accumulator (CUTLASS).

    ``out``: a contiguous [M, N] tensor of the output type to write D into (saves the allocation);
    its dtype stands for ``out_dtype`` when that is None."""
    # Inline checks first (host time per call matters here); the helpers give the precise errors.
    if not (A.__class__ is torch.Tensor and B.__class__ is torch.Tensor and A.dtype is torch.int8
            and B.dtype is torch.int8 and A.dim() == 2 and B.dim() == 2 and A.shape[1] == B.shape[1]):
        check_int8_operands(A, B, "A", "B")
    if epilogue.__class__ is not str or not epilogue:
        raise TypeError(f"epilogue must be a non-empty str naming a registered epilogue, got {epilogue!r}")
    if arch is not None:
        arch = _check_arch(arch)
    if out_dtype is not None and out_dtype.__class__ is not torch.dtype:
        raise TypeError(f"out_dtype must be None or a torch.dtype, got {type(out_dtype).__name__}")
    if out is not None:
        if out.__class__ is not torch.Tensor:
            raise TypeError(f"out must be None or a torch.Tensor, got {type(out).__name__}")
        if out_dtype is None:
            out_dtype = out.dtype
    device = A.get_device()  # -1 on the CPU
    if device < 0 or B.get_device() != device:
        _check_devices("int8_gemm", "A", A, {"B": B, **{n: v for n, v in epilogue_args.items()
                                                         if isinstance(v, torch.Tensor)}})
    A, B = A.contiguous(), B.contiguous()
    plan = None
    if not _is_compiling():
        try:
            plan = (_gemm_plan_for or _gemm_impl())(A.shape[0], device, epilogue, arch, out_dtype)
        except (KeyError, ValueError):
            pass  # an unknown epilogue or output type: the checks below raise the precise error
        else:
            # The plain case in C++, which itself hands back (None) an `out` overlapping A or B, an input
            # asking for a gradient and a per-column input not yet checked for NaN / Inf.
            D = plan.run_fast(A, B, out, epilogue_args, device)
            if D is not None:
                return D
    # Everything else: the full checks, then the plan's Python path (or the op while torch.compile traces).
    if out is not None:
        _check_out_dtype(out, out_dtype, epilogue)
        for name, t in (("A", A), ("B", B)):
            if _overlap(out, t):
                raise ValueError(f"out overlaps {name} in memory: the kernel would read what it writes")
    # The per-output-channel inputs (weight-side constants) for NaN / Inf once per tensor version; the
    # epilogue's tensors (type, size, contiguity, device) are checked per input by the plan.
    finite = check_per_col_inputs(epilogue, epilogue_args) if epilogue_args else ()
    if epilogue_args and torch.is_grad_enabled():
        for value in epilogue_args.values():
            if value.__class__ is torch.Tensor and value.requires_grad:
                _no_grad_inputs("int8_gemm", epilogue_args)  # raises, naming the input
    if _is_compiling():
        return _int8_gemm_op(A, B, epilogue, arch, out_dtype, out, epilogue_args)
    if plan is None:
        plan = (_gemm_plan_for or _gemm_impl())(A.shape[0], device, epilogue, arch, out_dtype)
    if finite:
        plan.mark_finite(finite)
    return plan.run(A, B, out, epilogue_args, device)


def int8_gemm_requant(A_q: torch.Tensor, W_q: torch.Tensor, M_scale: torch.Tensor, fused_bias: torch.Tensor,
                      *, clamp: tuple[int, int] = (-128, 127), arch=None) -> torch.Tensor:
    """O_q[M, N] = clamp(round(M_scale * (A_q @ W_q^T + fused_bias))) as int8 (ConvInt8 requant).

    M_scale and fused_bias: float32 [N] (see ``formats.requant_params``).
    """
    check_int8_operands(A_q, W_q, "A_q", "W_q")
    N = W_q.shape[0]
    for name, t in (("M_scale", M_scale), ("fused_bias", fused_bias)):
        check_dtype(t, name, (torch.float32,))
        check_shape(t, name, (N,), "[N]")
    if not isinstance(clamp, (tuple, list)) or len(clamp) != 2:
        raise TypeError(f"clamp must be a pair (min, max), got {clamp!r}")
    lo, hi = (check_int(v, "clamp") for v in clamp)
    if not -128 <= lo <= hi <= 127:
        raise ValueError(f"clamp must satisfy -128 <= min <= max <= 127, got {tuple(clamp)}")
    arch = _check_arch(arch)
    _check_devices("int8_gemm_requant", "A_q", A_q,
                   {"W_q": W_q, "M_scale": M_scale, "fused_bias": fused_bias})
    _no_grad_inputs("int8_gemm_requant", {"M_scale": M_scale, "fused_bias": fused_bias})
    check_finite_once(M_scale, "M_scale")
    check_finite_once(fused_bias, "fused_bias")
    if _is_compiling():
        return torch.ops.cutlass_ops.int8_gemm_requant(A_q, W_q, M_scale, fused_bias, lo, hi,
                                                       None if arch is None else str(arch))
    from cutlass_ops.cutlass import int8_gemm_requant as _impl
    return _impl(A_q.contiguous(), W_q.contiguous(), M_scale.contiguous(), fused_bias.contiguous(),
                 clamp=(lo, hi), arch=arch)


def _int8_gemm_op(A, B, epilogue: str, arch, out_dtype, out, inputs: dict) -> torch.Tensor:
    """``int8_gemm`` through the op of its epilogue family (while torch.compile traces)."""
    import epilogues
    spec = epilogues.get(epilogue)  # ValueError naming the registered epilogues
    if out_dtype is None:
        out_dtype = epilogues.OUTPUT_DTYPES[spec.default_output]
    arch = None if arch is None else str(arch)
    ops = torch.ops.cutlass_ops
    if epilogue == "none":
        D = ops.int8_gemm(A, B, arch)
    elif epilogue in torch_ops.DEQUANT_EPILOGUES:
        D = ops.int8_gemm_dequant(A, B, inputs["scale_row"], inputs["scale_col"], inputs.get("bias"),
                                  torch_ops.DEQUANT_EPILOGUES.index(epilogue), out_dtype, arch)
    elif epilogue in ("requant", "requant_clamp"):
        lo, hi = (int(inputs["lo"]), int(inputs["hi"])) if epilogue == "requant_clamp" else (-128, 127)
        D = ops.int8_gemm_requant(A, B, inputs["multiplier"], inputs.get("fused_bias"), lo, hi, arch)
    elif epilogue == "kblock_accumulate":
        D = ops.int8_gemm_kblock_accumulate(A, B, *(inputs[n] for n in spec.input_names), arch)
    else:
        raise ValueError(f"epilogue {epilogue!r} has no torch.ops.cutlass_ops op, so it cannot be compiled; "
                         f"call int8_gemm outside torch.compile (torch.compiler.disable)")
    return D if out is None else out.copy_(D)
