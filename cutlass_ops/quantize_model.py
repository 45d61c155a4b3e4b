"""``quantize_(model, config)``: swap a model's nn.Linear / nn.Conv2d for quantized modules, in place.

One config dataclass per scheme:

    WeightOnlyConfig(bits=4, block_size=128, symmetric=True, method="minmax")   linears and convs
    W8A8BlockConfig(block_size=128, path="fused")                               linears (scheme 2)
    W8A8ChannelConfig()                                                         linears (int8 x int8)
    W8A8BlockScaledConfig(block_size=128)                                       linears (Hopper only)

A layer whose shape a scheme cannot take is skipped with the reason (``QuantizeSummary.skipped``).
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

import torch
from torch import nn

from cutlass_ops._validate import check_int
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight
from cutlass_ops.nn import QuantConv2d, QuantLinear

if TYPE_CHECKING:
    from cutlass_ops.w8a8.block_scaled import BlockScaledWeight

__all__ = ["WeightOnlyConfig", "W8A8BlockConfig", "W8A8ChannelConfig", "W8A8BlockScaledConfig", "QuantizeSummary",
           "quantize_", "config_from_dict"]

log = logging.getLogger(__name__)

W8A8_BLOCK_SIZES = (32, 64, 128, 256)  # the fused scheme-2 kernel's (cutlass_ops.w8a8.tiles.BLOCK_SIZES)
BLOCK_SCALED_SIZES = (64, 128, 256)  # the block-scaled kernel's (cutlass_ops.w8a8.tiles.BLOCK_SCALED_SIZES)
PROGRESS_MIN_LAYERS = 32  # a progress bar from this many candidate layers on (and only on a terminal)


def _method_kwargs(method: str) -> dict:
    """``method=`` for quantize_weight when it takes one (the default "minmax" is always fine)."""
    if "method" in inspect.signature(quantize_weight).parameters:
        return {"method": method}
    if method != "minmax":
        raise ValueError(f"method={method!r}: this cutlass_ops.formats.quantize_weight has no method argument")
    return {}


def _conv_padding(module: nn.Conv2d):
    """(ph, pw) of ``module`` or None when it has none we can run ("same" with an even dilated kernel)."""
    if not isinstance(module.padding, str):
        return tuple(module.padding)
    if module.padding == "valid":
        return (0, 0)
    total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
    return None if any(t % 2 for t in total) else tuple(t // 2 for t in total)


class _Config:
    mode: ClassVar[str]

    def to_dict(self) -> dict:
        return {"type": type(self).__name__, **dataclasses.asdict(self)}

    def conv_problem(self, module: nn.Conv2d) -> str | None:
        return f"{type(self).__name__} has no conv2d kernel (convs are quantized weight-only)"


@dataclass(frozen=True)
class WeightOnlyConfig(_Config):
    """Scheme 1: int4 / int8 weights per block of ``block_size`` along K (None: per output channel),
    float activations. Convs (grouped and depthwise included): blocks along K = Kh*Kw*Ci/groups;
    ``block_size`` must divide K, except that a conv whose K is at most ``block_size`` (a depthwise
    3x3: K = 9) takes one block per output channel; None: one block per (co, kh, kw) over Ci/groups."""

    bits: int = 4
    block_size: int | None = 128
    symmetric: bool = True
    method: str = "minmax"
    mode: ClassVar[str] = "weight_only"

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ValueError(f"bits must be 4 or 8, got {self.bits!r}")

    def _block(self, K: int) -> str | None:
        if self.block_size is not None and K % self.block_size:
            return f"block_size={self.block_size} does not divide {K}"
        return None

    def linear_problem(self, N: int, K: int) -> str | None:
        if self.bits == 4 and K % 8:
            return f"int4 needs in_features % 8 == 0, got {K}"
        return self._block(K)

    def _conv_block(self, K: int) -> int | None:
        """The block of a conv weight with K = Kh*Kw*Ci/groups: ``block_size``, or the whole row when K
        is not longer than one block (None: per (co, kh, kw), resolved by quantize_conv_weight)."""
        return K if self.block_size is not None and K <= self.block_size else self.block_size

    def conv_problem(self, module: nn.Conv2d) -> str | None:
        if module.padding_mode != "zeros":
            return f"padding_mode={module.padding_mode!r} (only zero padding)"
        if _conv_padding(module) is None:
            return f"padding={module.padding!r} is not symmetric"
        Kh, Kw = module.kernel_size
        K = Kh * Kw * (module.in_channels // module.groups)
        block = self._conv_block(K)
        if block is not None and K % block:
            return f"block_size={block} does not divide Kh*Kw*in_channels/groups={K} (blocks run along K)"
        return None

    conv_padding = staticmethod(_conv_padding)

    def quantize_linear(self, w: torch.Tensor) -> QuantizedWeight:
        return quantize_weight(w, bits=self.bits, block_size=self.block_size, symmetric=self.symmetric,
                               **_method_kwargs(self.method))

    def quantize_conv(self, w: torch.Tensor) -> QuantizedWeight:
        kwargs = _method_kwargs(self.method)
        if "method" in kwargs and "method" not in inspect.signature(quantize_conv_weight).parameters:
            kwargs = {}
        _, Ci, Kh, Kw = w.shape  # Ci: per group
        return quantize_conv_weight(w, bits=self.bits, block_size=self._conv_block(Kh * Kw * Ci),
                                    symmetric=self.symmetric, **kwargs)

    def module_kwargs(self, qw: QuantizedWeight) -> dict:
        return {"bits": qw.bits, "block_size": qw.block_size, "symmetric": qw.symmetric}


@dataclass(frozen=True)
class W8A8BlockConfig(_Config):
    """Scheme 2: int8 activations (QuantA per row and K block) x int8 weights per K block (offset form)."""

    block_size: int = 128
    path: str = "fused"
    mode: ClassVar[str] = "w8a8_block"

    def linear_problem(self, N: int, K: int) -> str | None:
        if K % self.block_size:
            return f"block_size={self.block_size} does not divide in_features={K}"
        if self.path == "fused" and (self.block_size not in W8A8_BLOCK_SIZES or K % 16):
            return f"path='fused' needs block_size in {W8A8_BLOCK_SIZES} and in_features % 16 == 0"
        if self.path == "orchestrator" and (self.block_size % 16 or N % 4):
            return "path='orchestrator' needs block_size % 16 == 0 and out_features % 4 == 0 (CUTLASS alignment)"
        return None

    def quantize_linear(self, w: torch.Tensor) -> QuantizedWeight:
        return quantize_weight(w, bits=8, block_size=self.block_size, symmetric=False)

    def module_kwargs(self, qw: QuantizedWeight) -> dict:
        return {"mode": self.mode, "bits": 8, "block_size": qw.block_size, "path": self.path,
                "symmetric": qw.symmetric}


@dataclass(frozen=True)
class W8A8ChannelConfig(_Config):
    """Per-token dynamic symmetric int8 activations x per-channel symmetric int8 weights, one CUTLASS
    int8 GEMM with the fused dequant epilogue (Sm90 / Sm80 / Sm75 kernels)."""

    mode: ClassVar[str] = "w8a8_channel"

    def linear_problem(self, N: int, K: int) -> str | None:
        return None  # any N and K: the int8 GEMM pads what its 16-byte loads and stores need

    def quantize_linear(self, w: torch.Tensor) -> QuantizedWeight:
        return quantize_weight(w, bits=8, block_size=None, symmetric=True)

    def module_kwargs(self, qw: QuantizedWeight) -> dict:
        return {"mode": self.mode, "bits": 8, "block_size": None}


@dataclass(frozen=True)
class W8A8BlockScaledConfig(_Config):
    """Block-scaled symmetric W8A8 (``cutlass_ops.w8a8.block_scaled``; Hopper sm_90a only, other GPUs
    raise at the first forward): int8 activations symmetric per row and K block of ``block_size`` x int8
    weights symmetric per ``block_size`` x ``block_size`` tile, no offsets. ``block_size``: one the
    kernel takes (``tiles.BLOCK_SCALED_SIZES``)."""

    block_size: int = 128
    mode: ClassVar[str] = "w8a8_block_scaled"

    def __post_init__(self):
        check_int(self.block_size, "block_size")
        if self.block_size not in BLOCK_SCALED_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SCALED_SIZES} (the block-scaled kernel's), "
                             f"got {self.block_size}")

    def linear_problem(self, N: int, K: int) -> str | None:
        # K % block_size is the only need: it makes K a multiple of 64, so the int8 rows are the 16-byte
        # multiples TMA reads; any N (the last weight block may be short, TMA zero-fills the last tile and
        # the stores go one element at a time where N is odd).
        if K % self.block_size:
            return f"block_size={self.block_size} does not divide in_features={K}"
        return None

    def quantize_linear(self, w: torch.Tensor) -> BlockScaledWeight:
        from cutlass_ops.w8a8.block_scaled import quantize_weight_block_scaled  # pure torch, loaded on first use
        return quantize_weight_block_scaled(w, self.block_size)

    def module_kwargs(self, qw: BlockScaledWeight) -> dict:
        return {"mode": self.mode, "bits": 8, "block_size": qw.block_size}


CONFIGS = {c.__name__: c for c in (WeightOnlyConfig, W8A8BlockConfig, W8A8ChannelConfig, W8A8BlockScaledConfig)}


def config_from_dict(d: dict) -> _Config:
    """Inverse of ``config.to_dict()``."""
    d = dict(d)
    kind = d.pop("type", None)
    if kind not in CONFIGS:
        raise ValueError(f"config type must be one of {sorted(CONFIGS)}, got {kind!r}")
    return CONFIGS[kind](**d)


@dataclass
class QuantizeSummary:
    """What ``quantize_`` did: converted layer names, skipped ones with the reason, model bytes."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0

    def __str__(self) -> str:
        lines = [f"quantize_: {len(self.converted)} layers converted, {len(self.skipped)} skipped; "
                 f"{self.bytes_before / 2**20:.1f} MiB -> {self.bytes_after / 2**20:.1f} MiB"]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _model_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def quantize_(model: nn.Module, config, filter_fn: Callable[[nn.Module, str], bool] | None = None
              ) -> QuantizeSummary:
    """Replace, in place, each nn.Linear (and nn.Conv2d, for a weight-only config) of ``model`` that
    ``filter_fn(module, name)`` accepts (default: all) by its quantized module; return the summary
    (also logged at INFO). Layers the scheme cannot take are left as they are, with the reason."""
    if not isinstance(config, _Config):
        raise TypeError(f"config must be one of {sorted(CONFIGS)}, got {type(config).__name__}")
    if type(model) in (nn.Linear, nn.Conv2d):
        raise ValueError("model is itself a Linear/Conv2d: quantize_ swaps submodules; use "
                         "QuantLinear.from_float / QuantConv2d.from_float, or wrap it in an nn.Sequential")
    summary = QuantizeSummary(bytes_before=_model_bytes(model))
    candidates = [(name, m) for name, m in model.named_modules() if type(m) in (nn.Linear, nn.Conv2d)
                  and (filter_fn is None or filter_fn(m, name))]
    from tqdm.auto import tqdm
    show = len(candidates) >= PROGRESS_MIN_LAYERS and sys.stderr.isatty()
    for name, module in tqdm(candidates, desc="quantize_", disable=not show, leave=False):
        if isinstance(module, nn.Linear):
            problem = config.linear_problem(module.out_features, module.in_features)
            build = QuantLinear.from_float
        else:
            problem = config.conv_problem(module)
            build = QuantConv2d.from_float
        if problem is not None:
            summary.skipped[name] = problem
            continue
        quantized = build(module, config)
        quantized.quant_config = config
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, quantized)
        summary.converted.append(name)
    summary.bytes_after = _model_bytes(model)
    log.info("%s", summary)
    return summary
