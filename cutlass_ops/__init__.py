"""cutlass_ops: quantized and mixed-precision matmul / conv for NVIDIA GPUs.

Weights are INT8/INT4 quantized per block along K (``QuantizedWeight``), or INT8 per square tile
for the block-scaled symmetric W8A8 scheme on Hopper (``BlockScaledWeight``); activations are
FP16/BF16/FP32. ``import cutlass_ops`` needs no GPU: the GPU modules load on first use, and
``cutlass_ops.reference`` holds float64 CPU references for every op.

Model level: ``quantize_(model, config)`` swaps nn.Linear / nn.Conv2d for ``cutlass_ops.nn``
modules; ``save_quantized`` / ``load_quantized_state`` round-trip them through safetensors;
``load_quantized(model, path)`` loads a GPTQ / AWQ / compressed-tensors / GGUF checkpoint. Every
public GPU op is also a custom op ``torch.ops.cutlass_ops.*`` (``cutlass_ops.torch_ops``).
"""
from cutlass_ops import formats, reference
from cutlass_ops.api import (
    W8A8_PATHS, conv2d, int8_gemm, int8_gemm_requant, linear, linear_w8a8, linear_w8a8_block_scaled,
    quantize_activation,
)
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight
from cutlass_ops import nn
from cutlass_ops.quantize_model import (
    QuantizeSummary, W8A8BlockConfig, W8A8BlockScaledConfig, W8A8ChannelConfig, WeightOnlyConfig, quantize_,
)

__all__ = [
    "QuantizedWeight", "quantize_weight", "quantize_conv_weight", "quantize_activation", "linear",
    "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant", "W8A8_PATHS", "formats", "reference",
    "BlockScaledWeight", "quantize_weight_block_scaled", "linear_w8a8_block_scaled",
    "nn", "quantize_", "WeightOnlyConfig", "W8A8BlockConfig", "W8A8ChannelConfig", "W8A8BlockScaledConfig",
    "QuantizeSummary", "save_quantized", "load_quantized_state", "load_quantized", "LoadSummary", "warmup",
]

# Loaded on first access (``import cutlass_ops`` is part of a fresh process's first call): the block-scaled
# format (cutlass_ops.w8a8.block_scaled, pure torch, like every cutlass_ops.w8a8 module), the checkpoint importers
# and safetensors round trip (8-9 ms of import on the CPU machine) and warmup.
_LAZY = {"BlockScaledWeight": "cutlass_ops.w8a8.block_scaled",
         "quantize_weight_block_scaled": "cutlass_ops.w8a8.block_scaled",
         "save_quantized": "cutlass_ops.serialization", "load_quantized_state": "cutlass_ops.serialization",
         "load_quantized": "cutlass_ops.importers.load", "LoadSummary": "cutlass_ops.importers.load",
         "warmup": "cutlass_ops.warmup"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'cutlass_ops' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
