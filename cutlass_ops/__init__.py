"""cutlass_ops: quantized and mixed-precision matmul / conv for NVIDIA GPUs.

Weights are INT8/INT4 quantized per block along K (``QuantizedWeight``); activations are
FP16/BF16/FP32. ``import cutlass_ops`` needs no GPU: the GPU modules load on first use, and
``cutlass_ops.reference`` holds float64 CPU references for every op.
"""
from cutlass_ops import formats, reference
from cutlass_ops.api import (
    W8A8_PATHS, conv2d, int8_gemm, int8_gemm_requant, linear, linear_w8a8, quantize_activation,
)
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight

__all__ = [
    "QuantizedWeight", "quantize_weight", "quantize_conv_weight", "quantize_activation", "linear",
    "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant", "W8A8_PATHS", "formats", "reference",
]
