"""Quantized drop-in modules: ``QuantLinear`` and ``QuantConv2d`` (see :mod:`.modules`)."""
from cutlass_ops.nn.modules import LINEAR_MODES, QuantConv2d, QuantLinear, from_spec

__all__ = ["QuantLinear", "QuantConv2d", "LINEAR_MODES", "from_spec"]
