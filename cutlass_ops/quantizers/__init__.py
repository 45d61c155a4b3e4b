"""Weight quantization methods: a registry from name to algorithm, all producing the same format.

Every method maps a float weight W [N, K] to (q int32 [N, K], scale float32 [N, G], offset
float32 [N, G]) with w ~= q * scale + offset per block of ``block_size`` along K (G = K //
block_size), q on the signed grid ([-8, 7] for int4, [-128, 127] for int8), scale > 0 and
offset = 0 when symmetric: ``formats.quantize_weight(w, method=...)`` packs it into a
``QuantizedWeight``. Pure torch; runs where W is (CPU or GPU).

  minmax   round to nearest over each block's min/max (the default; bit-for-bit as before)
  mse      per-block clipping search + least-squares refit, least squared weight error
  mse_balanced
           "mse" weighting each input channel's error by a data-free estimate of its activation
           power, 1 / (mean square of W's column), but never worse than minmax in plain MSE
  hqq      half-quadratic (robust l_p) optimization of scale and offset, after HQQ
  imatrix  "mse" with each input channel's error weighted by its mean square activation
           on the calibration inputs (activation-aware, like llama.cpp's imatrix)
  gptq     GPTQ: Hessian error feedback along K on the calibration inputs (act_order option)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from cutlass_ops.quantizers.gptq import quantize_gptq
from cutlass_ops.quantizers.hqq import quantize_hqq
from cutlass_ops.quantizers.minmax import quantize_minmax
from cutlass_ops.quantizers.mse import quantize_imatrix, quantize_mse, quantize_mse_balanced


@dataclass(frozen=True)
class Method:
    """One quantization method: its function, whether it needs calibration, its options' types."""

    name: str
    fn: Callable
    needs_calibration: bool
    options: Mapping[str, type]


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("minmax", quantize_minmax, False, {}),
    Method("mse", quantize_mse, False, {"steps": int, "min_ratio": float, "refits": int}),
    Method("mse_balanced", quantize_mse_balanced, False,
           {"steps": int, "min_ratio": float, "refits": int, "floor": float}),
    Method("hqq", quantize_hqq, False,
           {"iters": int, "lp_norm": float, "beta": float, "kappa": float}),
    Method("imatrix", quantize_imatrix, True,
           {"steps": int, "min_ratio": float, "refits": int, "floor": float}),
    Method("gptq", quantize_gptq, True, {"act_order": bool, "damp": float, "params": str}),
)}


def get_method(method) -> Method:
    """The registered ``Method`` named ``method`` (ValueError naming ``method`` otherwise)."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, one of {list(METHODS)}, got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    return METHODS[method]


def _check_options(m: Method, options) -> dict:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    checked = {}
    for key, value in options.items():
        if key not in m.options:
            raise ValueError(f"options: method={m.name!r} takes {sorted(m.options) or 'no options'}, "
                             f"got {key!r}")
        kind = m.options[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise TypeError(f"options[{key!r}] must be a {kind.__name__}, got {type(value).__name__}")
        checked[key] = value
    return checked


def check_calibration(m: Method, calibration, K: int, device: torch.device):
    """The calibration inputs X [*, K] for method ``m`` (None for methods that take none)."""
    if not m.needs_calibration:
        if calibration is not None:
            raise ValueError(f"calibration is only used by methods "
                             f"{[n for n, x in METHODS.items() if x.needs_calibration]}; "
                             f"method={m.name!r} ignores it, so pass calibration=None")
        return None
    if calibration is None:
        raise ValueError(f"method={m.name!r} needs calibration inputs: pass calibration=X [*, K={K}]")
    if not isinstance(calibration, torch.Tensor):
        raise TypeError(f"calibration must be a torch.Tensor, got {type(calibration).__name__}")
    if not calibration.dtype.is_floating_point:
        raise TypeError(f"calibration must have a floating dtype, got {calibration.dtype}")
    if calibration.dim() < 1 or calibration.shape[-1] != K or calibration.numel() == 0:
        raise ValueError(f"calibration must have shape [*, K={K}] with at least one row, "
                         f"got {tuple(calibration.shape)}")
    if calibration.device != device:
        raise ValueError(f"calibration is on {calibration.device} but w is on {device}")
    if not bool(torch.isfinite(calibration).all()):
        raise ValueError("calibration contains NaN or Inf")
    return calibration


def quantize(W: torch.Tensor, *, bits: int, block_size: int, symmetric: bool, method: str = "minmax",
             calibration: torch.Tensor | None = None, options=None):
    """W [N, K] (checked by the caller) -> (q int32 [N, K], scale f32 [N, G], offset f32 [N, G])."""
    m = get_method(method)
    opts = _check_options(m, options)
    X = check_calibration(m, calibration, W.shape[1], W.device)
    if m.needs_calibration:
        return m.fn(W, bits, block_size, symmetric, X, **opts)
    return m.fn(W, bits, block_size, symmetric, **opts)


__all__ = ["METHODS", "Method", "check_calibration", "get_method", "quantize"]
