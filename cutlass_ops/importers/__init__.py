"""Import quantized checkpoints (GPTQ, AWQ, compressed-tensors, GGUF) into ``QuantizedWeight``.

Each ``from_*`` maps a source layer onto the offset form w = q * scale + offset exactly and
returns ``Imported(weight, perm)``: ``perm`` is the act-order K permutation (GPTQ desc_act),
applied to the activations with ``apply_perm`` so that apply_perm(x, perm) @ W_perm^T == x @ W^T.
Pure torch/numpy; ``safetensors`` (``load_safetensors``) and ``gguf`` (reading .gguf files) are
optional and only needed by their callers.

Model level: ``load_quantized(model, path)`` (``load.py``) swaps a float model's nn.Linear layers for
``QuantLinear``s over a whole checkpoint (safetensors directory / file, or .gguf with a ``name_map``
such as ``llama_gguf_names``); ``read_gguf(path)`` imports every Q8_0 / Q4_0 / Q4_1 tensor of a file.
"""
from cutlass_ops.importers._common import (
    Imported, UnsupportedFormatError, act_order_perm, apply_perm, bits_per_weight,
)
from cutlass_ops.importers.awq import from_awq
from cutlass_ops.importers.checkpoint import (
    QuantizationConfig, import_layer, load_safetensors, quantization_config, read_awq_layer,
    read_compressed_tensors_layer, read_gptq_layer,
)
from cutlass_ops.importers.compressed import from_compressed_tensors
from cutlass_ops.importers.ggml import from_gguf
from cutlass_ops.importers.gguf_file import LlamaGGUFNames, llama_gguf_names, read_gguf, read_gguf_file
from cutlass_ops.importers.gptq import from_gptq
from cutlass_ops.importers.load import LoadSummary, load_quantized

__all__ = [
    "Imported", "UnsupportedFormatError", "apply_perm", "act_order_perm", "bits_per_weight",
    "from_gptq", "from_awq", "from_compressed_tensors", "from_gguf", "QuantizationConfig",
    "quantization_config", "load_safetensors", "read_gptq_layer", "read_awq_layer",
    "read_compressed_tensors_layer", "import_layer", "read_gguf", "read_gguf_file", "llama_gguf_names",
    "LlamaGGUFNames", "load_quantized", "LoadSummary",
]
