"""``load_quantized(model, path)``: a GPTQ / AWQ / compressed-tensors / GGUF checkpoint into a float model.

    model = build_float_model()                               # nn.Linear layers named as in the checkpoint
    summary = cutlass_ops.load_quantized(model, "path/to/gptq-checkpoint")   # directory or .safetensors
    summary = cutlass_ops.load_quantized(model, "model-q4_0.gguf", name_map=llama_gguf_names)

Each nn.Linear whose name has quantized tensors in the checkpoint is replaced, in place, by a
``QuantLinear`` over the exactly imported weight (act-order GPTQ layers get their ``perm``); the bias
comes from the checkpoint when it has one, else from the float module. Every other tensor (norms,
embeddings, unquantized heads) is loaded with ``load_state_dict(strict=False)`` semantics; the summary
lists what was replaced, loaded, left unused and left missing. A checkpoint layer whose shape differs
from the model's nn.Linear, or that names a module which is not an nn.Linear, is refused (ValueError
naming the layer) before anything in the model is changed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from cutlass_ops.importers._common import Imported
from cutlass_ops.importers.checkpoint import (
    QuantizationConfig, import_layer, load_safetensors, quantization_config,
)

__all__ = ["load_quantized", "LoadSummary"]

log = logging.getLogger(__name__)

# Per method: the tensor suffix that marks a quantized layer, and every suffix its reader consumes.
_MARKERS = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_scale"}
_CONSUMED = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales"),
             "compressed-tensors": ("weight_packed", "weight_shape", "weight", "weight_zero_point",
                                    "weight_g_idx", "weight_scale")}


@dataclass
class LoadSummary:
    """What ``load_quantized`` did. ``bits_per_weight``: storage bits of the replaced layers' weights
    (qweight + float32 scale / offset) per weight element, over all of them."""

    source: str
    replaced: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    dequantized: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    bits_per_weight: float = 0.0

    def __str__(self) -> str:
        lines = [f"load_quantized ({self.source}): {len(self.replaced)} linears replaced "
                 f"({self.bits_per_weight:.3f} bits per weight), {len(self.loaded)} float tensors loaded, "
                 f"{len(self.unused)} checkpoint tensors unused, {len(self.missing)} model tensors missing"]
        for what in ("dequantized", "unused", "missing"):
            names = getattr(self, what)
            if names:
                lines.append(f"  {what}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
        return "\n".join(lines)


def _linear(model: nn.Module, name: str, where: str, others_ok: bool = False) -> nn.Linear | None:
    """The float nn.Linear ``name`` of model; None when there is none (or, ``others_ok``, when the module
    is of another kind, e.g. an nn.Embedding the caller then loads dequantized); else ValueError."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        return None
    if others_ok and not isinstance(module, nn.Linear) and not hasattr(module, "qweight"):
        return None
    if type(module) is not nn.Linear:
        raise ValueError(f"checkpoint layer {name!r} ({where}) is quantized, but the model's {name} is a "
                         f"{type(module).__name__}, not a float nn.Linear (load into the freshly built float model)")
    return module


def _check_shape(name: str, imp: Imported, module: nn.Linear, where: str) -> None:
    N, K = imp.weight.N, imp.weight.K
    if (N, K) != (module.out_features, module.in_features):
        raise ValueError(f"checkpoint layer {name!r} ({where}) is {N} x {K} (out_features x in_features) but the "
                         f"model's nn.Linear {name} is {module.out_features} x {module.in_features}")


def _replace(model, plans, summary: LoadSummary, mode: str) -> None:
    """Swap in the QuantLinears (all shapes already checked)."""
    from cutlass_ops.nn import QuantLinear

    bits = elems = 0
    for name, (module, imp, bias) in plans.items():
        w = module.weight
        if bias is None and module.bias is not None:
            bias = module.bias.detach()
        bias = None if bias is None else bias.to(device=w.device, dtype=w.dtype)
        qw = imp.weight.to(w.device) if imp.weight.qweight.device != w.device else imp.weight
        perm = None if imp.perm is None else imp.perm.to(w.device)
        new = QuantLinear.from_imported(Imported(qw, perm), bias, mode=mode)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        summary.replaced.append(name)
        bits += qw.nbytes * 8
        elems += qw.N * qw.K
    summary.bits_per_weight = bits / elems if elems else 0.0


def _load_floats(model: nn.Module, floats: dict[str, torch.Tensor], summary: LoadSummary, strict: bool) -> None:
    missing, unexpected = model.load_state_dict(floats, strict=False)
    replaced = tuple(f"{n}." for n in summary.replaced)
    summary.missing = [k for k in missing if not k.startswith(replaced)]
    summary.unused += sorted(unexpected)
    summary.loaded = sorted(set(floats) - set(unexpected))


def _safetensors_plans(model, path: Path, config: QuantizationConfig | None, name_map):
    config = config or quantization_config(path if path.is_dir() else path.parent)
    tensors, unused = load_safetensors(path), []
    if name_map is not None:
        renamed = {k: name_map(k) for k in tensors}
        unused = sorted(k for k, new in renamed.items() if new is None)
        tensors = {new: tensors[k] for k, new in renamed.items() if new is not None}
    marker, consumed = _MARKERS[config.method], _CONSUMED[config.method]
    prefixes = sorted(k[: -len(marker) - 1] for k in tensors if k.endswith("." + marker))
    plans, used = {}, set()
    for name in prefixes:
        module = _linear(model, name, config.method)
        keys = [f"{name}.{s}" for s in consumed if f"{name}.{s}" in tensors]
        if module is None:
            unused += keys
            used.update(keys)
            log.warning("load_quantized: checkpoint layer %r has no module in the model: skipped", name)
            continue
        try:
            imp = import_layer(tensors, name, config)
        except (ValueError, TypeError, KeyError) as e:
            raise type(e)(f"checkpoint layer {name!r}: {e}") from e
        _check_shape(name, imp, module, config.method)
        bias = tensors.get(f"{name}.bias")
        used.update(keys + ([f"{name}.bias"] if bias is not None else []))
        plans[name] = (module, imp, bias)
    floats = {k: v for k, v in tensors.items() if k not in used}
    return f"{config.method}, {path}", plans, floats, unused


def _gguf_plans(model, path: Path, name_map: Callable[[str], str | None]):
    from cutlass_ops.importers.gguf_file import read_gguf_file

    contents = read_gguf_file(path)
    row_order = getattr(name_map, "row_order", None)
    plans, floats, dequantized = {}, {}, []
    unused = [f"{n} ({why})" for n, why in contents.skipped.items()]
    for gname, t in list(contents.imported.items()) + list(contents.floats.items()):
        key = name_map(gname)
        if key is None:
            unused.append(gname)
            continue
        rows = None if row_order is None else row_order(gname, contents.metadata, t.weight.N
                                                        if isinstance(t, Imported) else t.shape[0])
        if isinstance(t, Imported):
            if rows is not None:
                from cutlass_ops.importers.gguf_file import permute_rows
                t = permute_rows(t, rows)
            name, _, leaf = key.rpartition(".")
            module = _linear(model, name, f"GGUF {gname}", others_ok=True) if leaf == "weight" else None
            if module is not None:
                _check_shape(name, t, module, f"GGUF {gname}")
                plans[name] = (module, t, None)
                continue
            t = t.weight.dequantize(torch.float32)  # e.g. a quantized token embedding: load it as floats
            dequantized.append(key)
        elif rows is not None:
            t = t.index_select(0, rows)
        floats[key] = t
    for name in plans:  # a bias of a replaced layer goes into the QuantLinear
        if f"{name}.bias" in floats:
            module, imp, _ = plans[name]
            plans[name] = (module, imp, floats.pop(f"{name}.bias"))
    return f"gguf, {path}", plans, floats, unused, dequantized


def load_quantized(model: nn.Module, path, *, name_map: Callable[[str], str | None] | None = None,
                   config: QuantizationConfig | None = None, mode: str = "weight_only",
                   strict: bool = False) -> LoadSummary:
    """Load the quantized checkpoint ``path`` into the float ``model`` in place (see the module docstring).

    path: a checkpoint directory (its ``*.safetensors`` files and config.json / quantize_config.json /
        quant_config.json), a ``.safetensors`` file (config read from its directory unless ``config``
        is given), or a ``.gguf`` file.
    name_map: checkpoint tensor name -> the model's state-dict key, or None to skip the tensor (for
        safetensors optional, e.g. to strip a prefix; for GGUF required, a quantized weight mapping to
        ``<linear>.weight``): ``cutlass_ops.importers.llama_gguf_names`` maps llama.cpp names onto HF
        Llama-style ones. A map with a ``row_order(name, metadata, n_rows)`` method may reorder a
        tensor's rows (llama_gguf_names undoes llama.cpp's Q/K rotary permutation that way).
    mode: the QuantLinear mode (``"weight_only"``; the W8A8 modes take 8-bit weights only).
    strict: raise when a model tensor is missing from the checkpoint or a checkpoint tensor is unused.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r} does not exist")
    if path.suffix == ".gguf":
        if name_map is None:
            raise ValueError("a .gguf checkpoint needs name_map= (GGUF tensor name -> model state-dict key), "
                             "e.g. cutlass_ops.importers.llama_gguf_names")
        source, plans, floats, unused, dequantized = _gguf_plans(model, path, name_map)
    else:
        source, plans, floats, unused = _safetensors_plans(model, path, config, name_map)
        dequantized = []
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key, t in floats.items():  # refused before the model changes (load_state_dict would raise midway)
        if key in shapes and shapes[key] != tuple(t.shape):
            raise ValueError(f"checkpoint tensor {key!r} has shape {tuple(t.shape)} but the model's {key} has "
                             f"shape {shapes[key]}")
    if strict:
        replaced = tuple(f"{n}." for n in plans)
        missing = [k for k in shapes if k not in floats and not k.startswith(replaced)]
        unused = unused + sorted(k for k in floats if k not in shapes)
        if missing or unused:
            raise ValueError(f"strict=True: model tensors missing from the checkpoint {missing}, checkpoint "
                             f"tensors the model has no place for {unused}")
    summary = LoadSummary(source, unused=unused, dequantized=dequantized)
    _replace(model, plans, summary, mode)
    _load_floats(model, floats, summary, strict)
    log.info("%s", summary)
    return summary
