"""cutlass_ops: quantized and mixed-precision matmul / conv for NVIDIA GPUs.

Weights are INT8/INT4 quantized per block along K (``QuantizedWeight``); activations are
FP16/BF16/FP32. ``import cutlass_ops`` needs no GPU: the GPU modules load on first use, and
``cutlass_ops.reference`` holds float64 CPU references for every op.

Model level: ``quantize_(model, config)`` swaps nn.Linear / nn.Conv2d for ``cutlass_ops.nn``
modules; ``save_quantized`` / ``load_quantized_state`` round-trip them through safetensors;
``load_quantized(model, path)`` loads a GPTQ / AWQ / compressed-tensors / GGUF checkpoint. Every
public GPU op is also a custom op ``torch.ops.cutlass_ops.*`` (``cutlass_ops.torch_ops``).
"""
from cutlass_ops import formats, reference
from cutlass_ops.api import (
    W8A8_PATHS, conv2d, int8_gemm, int8_gemm_requant, linear, linear_w8a8, quantize_activation,
)
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight
from cutlass_ops import nn
from cutlass_ops.quantize_model import (
    QuantizeSummary, W8A8BlockConfig, W8A8ChannelConfig, WeightOnlyConfig, quantize_,
)
from cutlass_ops.serialization import load_quantized_state, save_quantized
from cutlass_ops.importers.load import LoadSummary, load_quantized
from cutlass_ops.warmup import warmup

__all__ = [
    "QuantizedWeight", "quantize_weight", "quantize_conv_weight", "quantize_activation", "linear",
    "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant", "W8A8_PATHS", "formats", "reference",
    "nn", "quantize_", "WeightOnlyConfig", "W8A8BlockConfig", "W8A8ChannelConfig", "QuantizeSummary",
    "save_quantized", "load_quantized_state", "load_quantized", "LoadSummary", "warmup",
]
