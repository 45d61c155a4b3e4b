"""``QuantLinear`` and ``QuantConv2d``: drop-in modules holding a ``QuantizedWeight`` as buffers.

The weight lives in three buffers - ``qweight`` (int8 [N, K] or packed int4 uint8 [N, K // 2]),
``scale`` and ``offset`` (float32 [N, K // block_size]) - and the bias in a fourth, so ``.to()``,
``.cuda()``, ``state_dict()``, ``load_state_dict()``, ``copy.deepcopy`` and pickling work as for any
module. ``.half()`` / ``.to(dtype)`` converts the bias only: scale and offset stay float32 (the
format). The ``QuantizedWeight`` view over the buffers is built once and again only when a buffer is
replaced (after ``.to()``, ``.cuda()``); an in-place change (``load_state_dict``) keeps the view and
the per-weight plan cache notices it.

A block-scaled ``QuantLinear`` (mode "w8a8_block_scaled") holds a ``BlockScaledWeight`` instead:
``qweight`` int8 [N, K] and ``scale`` float32 [ceil(N / block_size), K / block_size] (one per
block_size x block_size tile); the format is symmetric, so ``offset`` is a buffer slot holding None
(absent from the state dict, skipped by ``.to()``, kept by deepcopy and pickling).

Act-order (GPTQ desc_act): ``QuantLinear`` may hold a fifth buffer ``perm`` (int64 [K], None when absent):
the weight is then stored as W[:, perm] so that each quantization group is a contiguous K block. In
eager inference the small-M kernel reads x through perm (``cutlass_ops.linear(..., perm=)``: no gather
kernel); otherwise (autograd, torch.compile, large M) ``x.index_select(-1, perm)`` runs before the kernel.
``QuantLinear.from_imported`` builds such a layer from a ``cutlass_ops.importers`` result.

Modes of QuantLinear (``mode=``):
  "weight_only"        W4A16 / W8A16 (scheme 1): ``cutlass_ops.linear``
  "w8a8_block"         W8A8 per K block (scheme 2): ``cutlass_ops.linear_w8a8(path=...)``
  "w8a8_channel"       per-token symmetric int8 activations x per-channel symmetric int8 weight, one CUTLASS
                       int8 GEMM with the fused "dequant" epilogue (any N and K: zero-padded where K % 16 or N % 8)
  "w8a8_block_scaled"  block-scaled symmetric W8A8 (activations per row and K block, weights per square tile;
                       Hopper only): ``cutlass_ops.linear_w8a8_block_scaled``

Forward on CUDA tensors in eager mode calls the public functions (checks, then the kernels); while
``torch.compile`` traces, and on CPU tensors, it calls ``torch.ops.cutlass_ops.*`` directly: on the
CPU those run the float64 references rounded to the input dtype (slow, for tests and debugging).
Gradients flow to the input and the bias (see ``cutlass_ops.torch_ops``), never to the weight.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from cutlass_ops import api
from cutlass_ops._validate import ACTIVATIONS, FLOAT_DTYPES, check_dtype, check_int, parse_activation, parse_pair
from cutlass_ops.formats import QuantizedWeight, packed_K
from cutlass_ops.torch_ops import linear_w8a8_channel_impl

if TYPE_CHECKING:
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight

__all__ = ["QuantLinear", "QuantConv2d", "LINEAR_MODES"]

LINEAR_MODES = ("weight_only", "w8a8_block", "w8a8_channel", "w8a8_block_scaled")
_ACT_NAMES = {v: k for k, v in ACTIVATIONS.items()}
_is_compiling = torch.compiler.is_compiling  # the function itself: Dynamo knows it; no attribute lookups per call
_channel_run = None  # cutlass_ops.w8a8.channel_fast.run, bound on the first CUDA forward (import stays light)


def _bind_channel_run():
    global _channel_run
    from cutlass_ops.w8a8.channel_fast import run
    _channel_run = run
    return run


def _weight_buffers(N: int, K: int, bits: int, block_size: int, device,
                    block_scaled: bool = False) -> dict[str, torch.Tensor | None]:
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    if K % block_size:
        raise ValueError(f"block_size={block_size} does not divide K={K}")
    cols, dtype = (K, torch.int8) if bits == 8 else (K // 2, torch.uint8)
    G = K // block_size
    if block_scaled:  # one scale per block_size x block_size tile (the last N block may be short), no offset
        return {"qweight": torch.zeros(N, K, dtype=torch.int8, device=device),
                "scale": torch.ones(-(-N // block_size), G, dtype=torch.float32, device=device),
                "offset": None}
    return {"qweight": torch.zeros(N, cols, dtype=dtype, device=device),
            "scale": torch.ones(N, G, dtype=torch.float32, device=device),
            "offset": torch.zeros(N, G, dtype=torch.float32, device=device)}


class _QuantModule(nn.Module):
    """Shared: buffers, the cached QuantizedWeight (or BlockScaledWeight) view, float32 scale/offset under
    dtype casts."""

    _conv_shape = None
    block_scaled = False  # a BlockScaledWeight in the buffers (QuantLinear mode "w8a8_block_scaled")

    def _init_buffers(self, N: int, K: int, bits: int, block_size: int, bias: bool, device, dtype) -> None:
        for name, t in _weight_buffers(N, K, bits, block_size, device, self.block_scaled).items():
            self.register_buffer(name, t)
        dtype = dtype or torch.get_default_dtype()
        self.register_buffer("bias", torch.zeros(N, dtype=dtype, device=device) if bias else None)
        self.N, self.K, self.bits, self.block_size = N, K, bits, block_size
        self._qw: QuantizedWeight | None = None

    def set_weight(self, qw: QuantizedWeight | BlockScaledWeight) -> None:
        """Take ``qw``'s tensors as the buffers (its shapes and format must match this module's)."""
        if self.block_scaled:
            self._set_block_scaled(qw)
            return
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"qw must be a QuantizedWeight for this module (mode={self.mode!r}), "
                            f"got {type(qw).__name__}")
        if (qw.N, qw.K, qw.bits, qw.block_size, qw.conv_shape) != (self.N, self.K, self.bits, self.block_size,
                                                                   self._conv_shape):
            raise ValueError(f"qw (N={qw.N}, K={qw.K}, bits={qw.bits}, block_size={qw.block_size}, "
                             f"conv_shape={qw.conv_shape}) does not match the module (N={self.N}, K={self.K}, "
                             f"bits={self.bits}, block_size={self.block_size}, conv_shape={self._conv_shape})")
        for name in ("qweight", "scale", "offset"):
            self._buffers[name] = getattr(qw, name)
        self.symmetric = qw.symmetric
        self._qw = None

    def _set_block_scaled(self, qw) -> None:
        from cutlass_ops.w8a8.block_scaled import BlockScaledWeight  # pure torch, loaded on first use
        if not isinstance(qw, BlockScaledWeight):
            raise TypeError(f"qw must be a BlockScaledWeight for this module (mode={self.mode!r}), "
                            f"got {type(qw).__name__}")
        if (qw.N, qw.K, qw.block_size) != (self.N, self.K, self.block_size):
            raise ValueError(f"qw (N={qw.N}, K={qw.K}, block_size={qw.block_size}) does not match the module "
                             f"(N={self.N}, K={self.K}, block_size={self.block_size})")
        self._buffers["qweight"], self._buffers["scale"] = qw.qweight, qw.scale
        self._qw = None

    def weight(self) -> QuantizedWeight | BlockScaledWeight:
        """The QuantizedWeight (BlockScaledWeight for a block-scaled module) over the current buffers
        (rebuilt only when one was replaced)."""
        b, qw = self._buffers, self._qw
        if qw is not None and qw.qweight is b["qweight"] and qw.scale is b["scale"] and (
                self.block_scaled or qw.offset is b["offset"]):
            return qw
        if self.block_scaled:
            from cutlass_ops.w8a8.block_scaled import BlockScaledWeight  # pure torch, loaded on first use
            qw = BlockScaledWeight(b["qweight"], b["scale"], self.block_size)
        else:
            qw = QuantizedWeight(b["qweight"], b["scale"], b["offset"], self.bits, self.block_size, self.N, self.K,
                                 self._conv_shape, self.symmetric)
        self._qw = qw
        return qw

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized float weight (nn.Linear / nn.Conv2d layout), in ``dtype`` (default: the bias's)."""
        dtype = dtype or (self.bias.dtype if self.bias is not None else torch.float32)
        return self.weight().dequantize(dtype)

    def _apply(self, fn, recurse=True):
        kept = {name: self._buffers[name] for name in ("scale", "offset") if self._buffers[name] is not None}
        super()._apply(fn, recurse)
        for name, old in kept.items():  # dtype casts must not touch the format's float32 scale / offset
            if self._buffers[name].dtype != torch.float32:
                self._buffers[name] = old.to(device=self._buffers[name].device)
        self._qw = None
        return self

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_qw"] = None  # a view: rebuilt from the buffers on the next forward
        return state

    def _check_input(self, x: torch.Tensor) -> None:
        """What the custom-op path needs checked (the eager path's public functions check it too)."""
        check_dtype(x, "x", FLOAT_DTYPES)
        if x.device != self.qweight.device:
            raise ValueError(f"x is on {x.device} but the module's weight is on {self.qweight.device}; "
                             f"move the module with .to({x.device.type!r})")
        if self.bias is not None and self.bias.device != x.device:
            raise ValueError(f"bias is on {self.bias.device} but x is on {x.device}")

    def _act_repr(self) -> str:
        return f", activation={_ACT_NAMES[self.act]}" if self.act else ""


class QuantLinear(_QuantModule):
    """y = act(x @ W^T + bias) with W quantized (see the module docstring for ``mode``)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, mode: str = "weight_only",
                 bits: int = 4, block_size: int | None = 128, path: str = "fused", symmetric: bool = True,
                 activation=None, act_order: bool = False, device=None, dtype=None):
        super().__init__()
        check_int(in_features, "in_features", minimum=1)
        check_int(out_features, "out_features", minimum=1)
        if mode not in LINEAR_MODES:
            raise ValueError(f"mode must be one of {list(LINEAR_MODES)}, got {mode!r}")
        if mode != "weight_only" and bits != 8:
            raise ValueError(f"mode={mode!r} needs bits=8, got bits={bits}")
        if mode == "w8a8_channel":
            if block_size not in (None, in_features) or not symmetric:
                raise ValueError("mode='w8a8_channel' takes a symmetric per-channel weight (block_size=None)")
        if mode == "w8a8_block_scaled":
            if block_size is None or not symmetric:
                raise ValueError("mode='w8a8_block_scaled' takes a symmetric weight per block_size x block_size "
                                 f"tile (block_size an int, symmetric=True), got block_size={block_size}, "
                                 f"symmetric={symmetric}")
            check_int(block_size, "block_size", minimum=1)
        if path not in api.W8A8_PATHS:
            raise ValueError(f"path must be one of {list(api.W8A8_PATHS)}, got {path!r}")
        self.in_features, self.out_features, self.mode, self.path = in_features, out_features, mode, path
        self.block_scaled = mode == "w8a8_block_scaled"
        self.symmetric = symmetric
        self.act = parse_activation(activation)
        self._init_buffers(out_features, in_features, bits, block_size or in_features, bias, device, dtype)
        # act_order: the identity until set_perm / load_state_dict fills it (its shape is fixed here)
        self.register_buffer("perm", torch.arange(in_features, device=device) if act_order else None)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._buffers.setdefault("perm", None)  # modules pickled before act-order support

    def set_perm(self, perm: torch.Tensor | None) -> None:
        """Take ``perm`` (a permutation of range(K), int64 [K]; None: no act-order) as the K gather of x."""
        if perm is not None:
            if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.numel() != self.K or (
                    perm.dtype.is_floating_point or perm.dtype == torch.bool):
                raise ValueError(f"perm must be an integer tensor [K={self.K}], got "
                                 f"{getattr(perm, 'dtype', type(perm).__name__)} {tuple(getattr(perm, 'shape', ()))}")
            perm = perm.to(device=self.qweight.device, dtype=torch.long).contiguous()
            if not torch.equal(torch.sort(perm).values, torch.arange(self.K, device=perm.device)):
                raise ValueError(f"perm must be a permutation of range(K={self.K})")
        self._buffers["perm"] = perm

    @classmethod
    def from_imported(cls, imported, bias: torch.Tensor | None = None, mode: str = "weight_only", *,
                      path: str = "fused", activation=None) -> "QuantLinear":
        """A QuantLinear over an importer's result (``cutlass_ops.importers.Imported(weight, perm)``).

        On the weight's device; ``bias`` (float [N], copied; its dtype becomes the layer's) or None.
        """
        qw, perm = imported.weight, imported.perm
        if qw.conv_shape is not None:
            raise ValueError(f"imported.weight is a conv weight (conv_shape={qw.conv_shape}); QuantLinear needs a "
                             "linear one")
        if bias is not None and tuple(bias.shape) != (qw.N,):
            raise ValueError(f"bias must have shape ({qw.N},) [N], got {tuple(bias.shape)}")
        q = cls(qw.K, qw.N, bias is not None, mode=mode, bits=qw.bits, block_size=qw.block_size, path=path,
                symmetric=qw.symmetric, activation=activation, act_order=perm is not None, device=qw.qweight.device,
                dtype=None if bias is None else bias.dtype)
        q.set_weight(qw)
        q.set_perm(perm)
        if bias is not None:
            q.bias.copy_(bias.detach())
        return q

    def _gather(self, x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """x[..., perm]: the activation side of act-order (W_perm's K order); dtypes are checked after."""
        if x.device != perm.device:
            raise ValueError(f"x is on {x.device} but the module's weight is on {perm.device}; "
                             f"move the module with .to({x.device.type!r})")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape [..., K] with K={self.in_features} (in_features), got "
                             f"{tuple(x.shape)}")
        return x.index_select(-1, perm)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized float weight in nn.Linear's K order (act-order undone), in ``dtype``."""
        w = super().dequantize(dtype)
        perm = self.perm
        return w if perm is None else w.index_select(1, torch.argsort(perm))

    @classmethod
    def from_float(cls, module: nn.Linear, config) -> "QuantLinear":
        """Quantize ``module``'s weight as ``config`` says (a config of ``cutlass_ops.quantize_model``)."""
        if not isinstance(module, nn.Linear):
            raise TypeError(f"module must be an nn.Linear, got {type(module).__name__}")
        problem = config.linear_problem(module.out_features, module.in_features)
        if problem is not None:
            raise ValueError(f"module ({module.out_features} x {module.in_features}) cannot take {config}: {problem}")
        w = module.weight.detach()
        qw = config.quantize_linear(w)
        q = cls(module.in_features, module.out_features, module.bias is not None, device=w.device, dtype=w.dtype,
                **config.module_kwargs(qw))
        q.set_weight(qw)
        if module.bias is not None:
            q.bias.copy_(module.bias.detach())
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.mode
        if mode == "w8a8_channel" and x.is_cuda and not _is_compiling():
            # eager: one C++ call (quantize per token + the dequant GEMM) once the Python path below has
            # run this layer's shape; None for anything else (then that path raises or registers)
            b = self._buffers
            if b["perm"] is None:
                out = (_channel_run or _bind_channel_run())(x, b["qweight"], b["scale"], b["bias"], self.act)
                if out is not None:
                    return out
        perm = self.perm
        if x.is_cuda and not torch.compiler.is_compiling() and mode == "weight_only":
            # act-order: the small-M kernel reads x through perm (no gather kernel)
            return api.linear(x, self.weight(), self.bias, self.act, perm=perm)
        if perm is not None:  # act-order: gather x's K columns into the weight's order
            x = self._gather(x, perm)
        # the API functions below replay an eager problem's recorded launches in C++ once it has run
        # (cutlass_ops.recipes)
        if x.is_cuda and not torch.compiler.is_compiling():
            if self.mode == "w8a8_block":
                return api.linear_w8a8(x, self.weight(), self.bias, self.act, path=self.path)
            if self.block_scaled:
                return api.linear_w8a8_block_scaled(x, self.weight(), self.bias, self.act)
        self._check_input(x)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape [..., K] with K={self.in_features} (in_features), got "
                             f"{tuple(x.shape)}")
        ops, bias = torch.ops.cutlass_ops, self.bias
        if self.mode == "w8a8_channel":
            if x.is_cuda and not torch.compiler.is_compiling() and not (
                    torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad))):
                return linear_w8a8_channel_impl(x, self.qweight, self.scale, bias, self.act)
            return ops.linear_w8a8_channel(x, self.qweight, self.scale, bias, self.act)
        if self.block_scaled:
            return ops.linear_w8a8_block_scaled(x, self.qweight, self.scale, bias, self.act, self.block_size)
        args = (x, self.qweight, self.scale, self.offset)
        if self.mode == "weight_only":
            return ops.linear(*args, self.bits, self.block_size, self.N, self.K, bias, self.act)
        return ops.linear_w8a8(*args, self.block_size, self.N, self.K, bias, self.act, self.path)

    def spec(self) -> dict:
        """The constructor arguments that rebuild this module (``from_spec``), as plain data."""
        return {"kind": "QuantLinear", "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, "mode": self.mode, "bits": self.bits, "block_size": self.block_size,
                "path": self.path, "symmetric": self.symmetric, "activation": _ACT_NAMES[self.act],
                **({"act_order": True} if self.perm is not None else {})}

    def extra_repr(self) -> str:
        what = {"weight_only": f"W{self.bits}A16", "w8a8_block": f"W8A8 per K block, path={self.path}",
                "w8a8_channel": "W8A8 per channel x per token",
                "w8a8_block_scaled": "W8A8 block-scaled symmetric (Hopper)"}[self.mode]
        block = ("per channel" if self.block_size == self.K and not self.block_scaled
                 else f"block_size={self.block_size}")
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{what}, {block}{'' if self.symmetric else ', asymmetric'}{self._act_repr()}"
                f"{', act_order' if self.perm is not None else ''}")


class QuantConv2d(_QuantModule):
    """y = act(conv2d(x, W, groups=groups) + bias) with W [out_channels, in_channels / groups, Kh, Kw]
    quantized weight-only (int4 / int8, blocks along K = Kh*Kw*in_channels/groups; None: one block
    per (co, kh, kw)). int4 rows are stored padded to a multiple of 8 (``formats.packed_K``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 bias: bool = True, *, bits: int = 4, block_size: int | None = None, symmetric: bool = True,
                 activation=None, groups: int = 1, device=None, dtype=None):
        super().__init__()
        check_int(in_channels, "in_channels", minimum=1)
        check_int(out_channels, "out_channels", minimum=1)
        check_int(groups, "groups", minimum=1)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        Kh, Kw = parse_pair(kernel_size, "kernel_size", 1)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, (Kh, Kw)
        self.groups = groups
        self.stride = parse_pair(stride, "stride", 1)
        self.padding = parse_pair(padding, "padding", 0)
        self.dilation = parse_pair(dilation, "dilation", 1)
        Ci = in_channels // groups  # the weight's input channels
        K = Kh * Kw * Ci
        block_size = block_size or Ci
        if K % block_size:
            raise ValueError(f"block_size={block_size} must divide Kh*Kw*in_channels/groups={K} (blocks run along K)")
        self._conv_shape = (out_channels, Kh, Kw, Ci)
        self.symmetric, self.mode = symmetric, "weight_only"
        self.act = parse_activation(activation)
        self._init_buffers(out_channels, K, bits, block_size, bias, device, dtype)
        if packed_K(K, bits, conv=True) != K:  # int4 rows padded to whole 32-bit words: the stored width
            self._buffers["qweight"] = torch.zeros(out_channels, packed_K(K, bits, conv=True) // 2, dtype=torch.uint8,
                                                   device=device)

    @classmethod
    def from_float(cls, module: nn.Conv2d, config) -> "QuantConv2d":
        """Quantize ``module``'s weight as ``config`` says (a weight-only config)."""
        if not isinstance(module, nn.Conv2d):
            raise TypeError(f"module must be an nn.Conv2d, got {type(module).__name__}")
        problem = config.conv_problem(module)
        if problem is not None:
            raise ValueError(f"module {module} cannot take {config}: {problem}")
        w = module.weight.detach()
        qw = config.quantize_conv(w)
        padding = config.conv_padding(module)
        q = cls(module.in_channels, module.out_channels, module.kernel_size, module.stride, padding, module.dilation,
                module.bias is not None, groups=module.groups, device=w.device, dtype=w.dtype,
                **config.module_kwargs(qw))
        q.set_weight(qw)
        if module.bias is not None:
            q.bias.copy_(module.bias.detach())
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and not torch.compiler.is_compiling():
            return api.conv2d(x, self.weight(), self.bias, self.stride, self.padding, self.dilation, self.act,
                              self.groups)
        self._check_input(x)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"x must be [B, Ci={self.in_channels}, H, W], got {tuple(x.shape)}")
        return torch.ops.cutlass_ops.conv2d(x, self.qweight, self.scale, self.offset, self.bits, self.block_size,
                                            list(self._conv_shape), self.bias, list(self.stride), list(self.padding),
                                            list(self.dilation), self.act, self.groups)

    def spec(self) -> dict:
        return {"kind": "QuantConv2d", "in_channels": self.in_channels, "out_channels": self.out_channels,
                "kernel_size": list(self.kernel_size), "stride": list(self.stride), "padding": list(self.padding),
                "dilation": list(self.dilation), "bias": self.bias is not None, "bits": self.bits,
                "block_size": self.block_size, "symmetric": self.symmetric, "activation": _ACT_NAMES[self.act],
                **({"groups": self.groups} if self.groups != 1 else {})}  # specs saved before groups stay valid

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("groups", 1)  # modules pickled before groups support

    def extra_repr(self) -> str:
        Ci = self.in_channels // self.groups
        block = "per (co, kh, kw)" if self.block_size == Ci else f"block_size={self.block_size}"
        groups = f", groups={self.groups}" if self.groups != 1 else ""
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}{groups}, bias={self.bias is not None}, "
                f"W{self.bits}A16, {block}{'' if self.symmetric else ', asymmetric'}{self._act_repr()}")


def from_spec(spec: dict, device=None, dtype=None) -> _QuantModule:
    """A module with empty buffers from ``spec()``'s dict (``cutlass_ops.serialization`` fills them)."""
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind == "QuantLinear":
        return QuantLinear(device=device, dtype=dtype, **spec)
    if kind == "QuantConv2d":
        return QuantConv2d(device=device, dtype=dtype, **spec)
    raise ValueError(f"spec['kind'] must be 'QuantLinear' or 'QuantConv2d', got {kind!r}")
