"""Save a quantized model to safetensors and load it into a freshly built float model.

The file holds the model's whole state dict (quantized buffers and the float parameters left as they
were) and, in its metadata, which layers are quantized and how:

    metadata["cutlass_ops.format"] = "1"
    metadata["cutlass_ops.layers"] = JSON {layer name: module spec (QuantLinear.spec()) + its config}

``load_quantized_state(model, path)`` replaces each layer named there by a quantized module with empty
buffers (on the float layer's device), then loads every tensor: the outputs match the saved model's
bit for bit.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from cutlass_ops.nn import QuantConv2d, QuantLinear, from_spec

__all__ = ["save_quantized", "load_quantized_state", "read_quantized_layers", "FORMAT_VERSION"]

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"
_FORMAT_KEY, _LAYERS_KEY = "cutlass_ops.format", "cutlass_ops.layers"


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ImportError("cutlass_ops.save_quantized / load_quantized_state need the safetensors package "
                          "(pip install safetensors)") from e
    return st


def save_quantized(model: nn.Module, path, metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s state dict and its quantized layers' specs to the safetensors file ``path``.

    ``metadata``: extra str -> str entries to record (keys starting with "cutlass_ops." are reserved).
    Tied (shared) tensors are stored once (``safetensors.torch.save_model``)."""
    layers = {}
    for name, m in model.named_modules():
        if isinstance(m, (QuantLinear, QuantConv2d)):
            spec = m.spec()
            spec["bias_dtype"] = None if m.bias is None else str(m.bias.dtype).removeprefix("torch.")
            config = getattr(m, "quant_config", None)
            spec["config"] = None if config is None else config.to_dict()
            layers[name] = spec
    if not layers:
        raise ValueError("model has no QuantLinear / QuantConv2d layers (quantize it first: cutlass_ops.quantize_)")
    meta = dict(metadata or {})
    bad = [k for k in meta if k.startswith("cutlass_ops.") or not isinstance(meta[k], str)]
    if bad:
        raise ValueError(f"metadata: keys {bad} are reserved (cutlass_ops.*) or have non-str values")
    meta.update({_FORMAT_KEY: FORMAT_VERSION, _LAYERS_KEY: json.dumps(layers, sort_keys=True)})
    _safetensors().save_model(model, str(Path(path)), metadata=meta)
    log.info("saved %d quantized layers of %s to %s", len(layers), type(model).__name__, path)


def read_quantized_layers(path) -> dict[str, dict]:
    """{layer name: spec} recorded in the safetensors file ``path`` by ``save_quantized``."""
    from safetensors import safe_open
    _safetensors()
    with safe_open(str(Path(path)), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get(_FORMAT_KEY) != FORMAT_VERSION:
        raise ValueError(f"{path} is not a cutlass_ops quantized checkpoint (metadata {_FORMAT_KEY}="
                         f"{meta.get(_FORMAT_KEY)!r}, expected {FORMAT_VERSION!r})")
    return json.loads(meta[_LAYERS_KEY])


def load_quantized_state(model: nn.Module, path, strict: bool = True) -> nn.Module:
    """Swap the layers named in ``path`` for quantized modules, then load every tensor of the file.

    ``model``: the float model, freshly built (its nn.Linear / nn.Conv2d where the file has quantized
    layers; their weights are dropped). Returns ``model`` (changed in place). ``strict``: every key of
    the model must be in the file and vice versa."""
    layers = read_quantized_layers(path)
    for name, spec in layers.items():
        try:
            old = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{path} quantizes layer {name!r}, which the model does not have") from None
        spec = dict(spec)
        bias_dtype, config = spec.pop("bias_dtype"), spec.pop("config")
        expected = nn.Linear if spec["kind"] == "QuantLinear" else nn.Conv2d
        if not isinstance(old, (expected, QuantLinear, QuantConv2d)):
            raise ValueError(f"layer {name!r} is a {type(old).__name__}, the file has a {spec['kind']} for it")
        device = next(iter(old.parameters()), next(iter(old.buffers()), None))
        device = None if device is None else device.device
        new = from_spec(spec, device=device, dtype=None if bias_dtype is None else getattr(torch, bias_dtype))
        if config is not None:
            from cutlass_ops.quantize_model import config_from_dict
            new.quant_config = config_from_dict(config)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    missing, unexpected = _safetensors().load_model(model, str(Path(path)), strict=strict)
    if missing or unexpected:
        log.warning("load_quantized_state: missing keys %s, unexpected keys %s", missing, unexpected)
    return model
