"""Checkpoint side of the importers: the quantization config of a checkpoint directory, and the
per-layer readers that pick a layer's tensors out of a safetensors state dict.

    cfg = quantization_config("path/to/checkpoint")          # method, bits, group_size, ...
    tensors = load_safetensors("path/to/checkpoint")         # needs the `safetensors` package
    imp = import_layer(tensors, "model.layers.0.mlp.down_proj", cfg)   # -> Imported
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from cutlass_ops.importers._common import Imported, UnsupportedFormatError, check_bits
from cutlass_ops.importers.awq import from_awq
from cutlass_ops.importers.compressed import (
    INT8_FORMATS, PACKED_FORMATS, STRATEGIES, from_compressed_tensors,
)
from cutlass_ops.importers.gptq import CHECKPOINT_FORMATS, from_gptq

CONFIG_FILES = ("config.json", "quantize_config.json", "quant_config.json")


@dataclass(frozen=True)
class QuantizationConfig:
    """What a checkpoint says about its quantization, normalized across the three methods.

    method: "gptq" | "awq" | "compressed-tensors"; group_size -1 means one group per row.
    checkpoint_format: GPTQ only ("gptq" = v1, zeros stored minus one; "gptq_v2").
    format / strategy: compressed-tensors only ("pack-quantized", ...; "group", "channel", ...).
    """

    method: str
    bits: int
    group_size: int
    sym: bool = True
    desc_act: bool = False
    checkpoint_format: str | None = None
    format: str | None = None
    strategy: str | None = None
    source: str = ""


def _read_json(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _find_config(path: Path) -> tuple[dict, Path]:
    if path.is_file():
        cfg = _read_json(path)
        return cfg.get("quantization_config", cfg), path
    for name in CONFIG_FILES:
        p = path / name
        if not p.is_file():
            continue
        cfg = _read_json(p)
        if name == "config.json":
            if "quantization_config" in cfg:
                return cfg["quantization_config"], p
            continue
        return cfg, p
    raise FileNotFoundError(f"no quantization config in {path}: looked for config.json "
                            f"['quantization_config'], quantize_config.json, quant_config.json")


def _gptq(cfg: dict, src: str) -> QuantizationConfig:
    bits = check_bits(cfg.get("bits"), "bits", source="GPTQ")
    fmt = cfg.get("checkpoint_format", "gptq")
    if cfg.get("is_marlin_format"):
        fmt = "marlin"
    if fmt not in CHECKPOINT_FORMATS:
        raise UnsupportedFormatError(f"checkpoint_format={fmt!r} is not supported: use one of "
                                     f"{list(CHECKPOINT_FORMATS)}")
    return QuantizationConfig("gptq", bits, int(cfg.get("group_size", -1)), bool(cfg.get("sym", True)),
                              bool(cfg.get("desc_act", False)), fmt, source=src)


def _awq(cfg: dict, src: str) -> QuantizationConfig:
    bits = cfg.get("bits", cfg.get("w_bit"))
    if bits != 4:
        raise UnsupportedFormatError(f"bits={bits!r} is not supported: AWQ import handles 4-bit only")
    version = str(cfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise UnsupportedFormatError(f"version={version!r} is not supported: AWQ import handles the "
                                     "'gemm' layout only")
    group_size = int(cfg.get("group_size", cfg.get("q_group_size", -1)))
    return QuantizationConfig("awq", 4, group_size, not bool(cfg.get("zero_point", True)),
                              False, None, source=src)


def _compressed(cfg: dict, src: str) -> QuantizationConfig:
    groups = cfg.get("config_groups") or {}
    schemes = {json.dumps(g.get("weights"), sort_keys=True): g for g in groups.values()
               if g.get("weights")}
    if len(schemes) != 1:
        raise UnsupportedFormatError(f"config_groups hold {len(schemes)} distinct weight schemes; "
                                     "import needs exactly one (pass layer arguments explicitly)")
    group = next(iter(schemes.values()))
    w = group["weights"]
    fmt = group.get("format") or cfg.get("format")
    if w.get("type", "int") != "int":
        raise UnsupportedFormatError(f"weights.type={w.get('type')!r} is not supported: int only")
    bits = check_bits(w.get("num_bits"), "num_bits", source="compressed-tensors")
    if fmt not in PACKED_FORMATS + INT8_FORMATS:
        raise UnsupportedFormatError(f"format={fmt!r} is not supported: use one of "
                                     f"{list(PACKED_FORMATS + INT8_FORMATS)}")
    strategy = w.get("strategy", "tensor")
    if strategy not in STRATEGIES:
        raise UnsupportedFormatError(f"strategy={strategy!r} is not supported: use one of "
                                     f"{list(STRATEGIES)}")
    group_size = w.get("group_size") if strategy == "group" else -1
    if group_size is None:
        raise ValueError(f"weights.group_size is missing for strategy='group' in {src}")
    return QuantizationConfig("compressed-tensors", bits, int(group_size), bool(w.get("symmetric", True)),
                              w.get("actorder") not in (None, False), None, fmt, strategy, src)


def quantization_config(path) -> QuantizationConfig:
    """Read a checkpoint directory's (or a JSON file's) quantization config.

    Looks in config.json["quantization_config"], then quantize_config.json (AutoGPTQ), then
    quant_config.json (AutoAWQ). Raises UnsupportedFormatError naming the unsupported field.
    """
    cfg, p = _find_config(Path(path))
    method = str(cfg.get("quant_method", "")).lower()
    if not method:  # AutoGPTQ's quantize_config.json / AutoAWQ's quant_config.json
        method = "awq" if ("w_bit" in cfg or "q_group_size" in cfg) else "gptq"
    if method == "gptq":
        return _gptq(cfg, str(p))
    if method == "awq":
        return _awq(cfg, str(p))
    if method in ("compressed-tensors", "compressed_tensors"):
        return _compressed(cfg, str(p))
    raise UnsupportedFormatError(f"quant_method={method!r} is not supported: use gptq, awq or "
                                 "compressed-tensors")


def load_safetensors(path) -> dict[str, torch.Tensor]:
    """All tensors of a .safetensors file, or of every *.safetensors file in a directory."""
    from safetensors.torch import load_file  # optional dependency (the `import` extra)

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {p}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def _get(tensors: Mapping[str, torch.Tensor], prefix: str, name: str, what: str, required=True):
    key = f"{prefix.rstrip('.')}.{name}"
    if key in tensors:
        return tensors[key]
    if required:
        raise KeyError(f"tensors has no {key!r} ({what} layer)")
    return None


def read_gptq_layer(tensors: Mapping[str, torch.Tensor], prefix: str,
                    config: QuantizationConfig) -> Imported:
    """from_gptq on ``<prefix>.qweight``, ``.qzeros``, ``.scales`` and (if present) ``.g_idx``."""
    args = [_get(tensors, prefix, n, "GPTQ") for n in ("qweight", "qzeros", "scales")]
    g_idx = _get(tensors, prefix, "g_idx", "GPTQ", required=False)
    return from_gptq(*args, g_idx, bits=config.bits, group_size=config.group_size,
                     sym=config.sym, checkpoint_format=config.checkpoint_format or "gptq")


def read_awq_layer(tensors: Mapping[str, torch.Tensor], prefix: str,
                   config: QuantizationConfig) -> Imported:
    """from_awq on ``<prefix>.qweight``, ``.qzeros`` and ``.scales``."""
    args = [_get(tensors, prefix, n, "AWQ") for n in ("qweight", "qzeros", "scales")]
    return from_awq(*args, group_size=config.group_size, bits=config.bits)


def read_compressed_tensors_layer(tensors: Mapping[str, torch.Tensor], prefix: str,
                                  config: QuantizationConfig) -> Imported:
    """from_compressed_tensors on ``<prefix>.weight_packed`` / ``.weight`` and its companions."""
    opt = {n: _get(tensors, prefix, n, "compressed-tensors", required=False)
           for n in ("weight_packed", "weight_shape", "weight", "weight_zero_point", "weight_g_idx")}
    scale = _get(tensors, prefix, "weight_scale", "compressed-tensors")
    return from_compressed_tensors(scale, num_bits=config.bits, strategy=config.strategy or "group",
                                   group_size=config.group_size, format=config.format, **opt,
                                   symmetric=config.sym)


def import_layer(tensors: Mapping[str, torch.Tensor], prefix: str,
                 config: QuantizationConfig) -> Imported:
    """Dispatch on ``config.method`` to the matching ``read_*_layer``."""
    readers = {"gptq": read_gptq_layer, "awq": read_awq_layer,
               "compressed-tensors": read_compressed_tensors_layer}
    if config.method not in readers:
        raise UnsupportedFormatError(f"config.method={config.method!r} is not supported")
    return readers[config.method](tensors, prefix, config)
