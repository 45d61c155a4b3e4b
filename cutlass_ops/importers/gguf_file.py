"""Whole GGUF files: ``read_gguf(path)`` imports every Q8_0 / Q4_0 / Q4_1 weight; ``llama_gguf_names``
maps llama.cpp's tensor names onto the module names of a Hugging Face Llama-style model.

llama.cpp names (``gguf.constants.TENSOR_NAMES``) -> HF Llama (``LlamaForCausalLM``):

    token_embd.weight            model.embed_tokens.weight
    output_norm.weight           model.norm.weight
    output.weight                lm_head.weight
    blk.N.attn_norm.weight       model.layers.N.input_layernorm.weight
    blk.N.attn_q / attn_k / attn_v / attn_output .weight|.bias
                                 model.layers.N.self_attn.q_proj / k_proj / v_proj / o_proj
    blk.N.ffn_norm.weight        model.layers.N.post_attention_layernorm.weight
    blk.N.ffn_gate / ffn_up / ffn_down .weight
                                 model.layers.N.mlp.gate_proj / up_proj / down_proj
    rope_freqs.weight            (not a model tensor: skipped)

llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders the rows of
attn_q and attn_k of architecture "llama" for its rotary layout: per head, the rows go from
[first half; second half] to interleaved pairs. ``llama_gguf_names.row_order`` gives the inverse
row order, which the loader applies (exactly: rows of qweight, scale and offset are independent).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch

from cutlass_ops.importers._common import Imported
from cutlass_ops.importers.ggml import GGML_TYPES, from_gguf

__all__ = ["read_gguf", "read_gguf_file", "GGUFContents", "LlamaGGUFNames", "llama_gguf_names",
           "permute_rows"]

log = logging.getLogger(__name__)

# ggml float type ids -> numpy dtype of their raw data (BF16 is read as uint16 and reinterpreted)
_FLOAT_TYPES = {0: np.float32, 1: np.float16, 30: np.uint16}


class GGUFContents:
    """What a GGUF file holds, by tensor name: ``imported`` (Q8_0 / Q4_0 / Q4_1 2-D weights),
    ``floats`` (F32 / F16 / BF16 tensors, torch, numpy dimension order), ``skipped`` (name -> reason),
    ``metadata`` (key -> value of the scalar and string fields)."""

    def __init__(self):
        self.imported: dict[str, Imported] = {}
        self.floats: dict[str, torch.Tensor] = {}
        self.skipped: dict[str, str] = {}
        self.metadata: dict[str, object] = {}


def _reader(path):
    try:
        import gguf
    except ImportError as e:
        raise ImportError("reading .gguf files needs the gguf package (pip install gguf)") from e
    return gguf.GGUFReader(str(Path(path)))


def read_gguf_file(path) -> GGUFContents:
    """Every tensor of the GGUF file ``path``: imported, float, or skipped with the reason (logged)."""
    reader = _reader(path)
    out = GGUFContents()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or "tokenizer" in key:
            continue
        try:
            value = field.contents()
        except Exception:  # noqa: BLE001 - an exotic field type: metadata is informative only
            continue
        if isinstance(value, (int, float, str, bool)):
            out.metadata[key] = value
    for t in reader.tensors:
        tid = int(t.tensor_type)
        type_name = getattr(t.tensor_type, "name", str(tid))
        if tid in _FLOAT_TYPES:
            a = np.ascontiguousarray(np.asarray(t.data)).view(_FLOAT_TYPES[tid])
            ft = torch.from_numpy(a.copy())
            out.floats[t.name] = ft.view(torch.bfloat16) if tid == 30 else ft
            continue
        if tid not in GGML_TYPES:
            reason = f"tensor type {type_name} is not imported (Q8_0, Q4_0, Q4_1 are)"
        elif len([d for d in t.shape if int(d) != 1]) > 2 or len(t.shape) < 2:
            reason = f"shape {tuple(int(d) for d in t.shape)} (ggml order) is not a 2-D weight"
        else:
            out.imported[t.name] = from_gguf(t)
            continue
        out.skipped[t.name] = reason
        log.info("read_gguf: skipped %s: %s", t.name, reason)
    return out


def read_gguf(path) -> dict[str, Imported]:
    """{tensor name: Imported} for the Q8_0 / Q4_0 / Q4_1 2-D tensors of the GGUF file ``path``.

    Other tensors are skipped, each with its reason logged at INFO (``read_gguf_file`` returns the
    float tensors, the skipped ones and the metadata too). Needs the ``gguf`` package.
    """
    return read_gguf_file(path).imported


def permute_rows(imp: Imported, rows: torch.Tensor) -> Imported:
    """The imported weight with its output rows taken in the order ``rows`` (W[rows, :]), exactly."""
    qw = imp.weight
    rows = rows.to(device=qw.qweight.device, dtype=torch.long)
    from cutlass_ops.formats import QuantizedWeight
    new = QuantizedWeight(qw.qweight.index_select(0, rows), qw.scale.index_select(0, rows),
                          qw.offset.index_select(0, rows), qw.bits, qw.block_size, qw.N, qw.K, None,
                          qw.symmetric)
    return Imported(new, imp.perm)


def _rope_unpermute(n_rows: int, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``LlamaModel.permute`` on rows: gguf_rows[order] = hf_rows."""
    if n_head < 1 or n_rows % (2 * n_head):
        raise ValueError(f"cannot undo llama.cpp's rotary row permutation: {n_rows} rows is not a multiple of "
                         f"2 * n_head = {2 * n_head}")
    src = torch.arange(n_rows).reshape(n_head, 2, n_rows // n_head // 2).transpose(1, 2).reshape(-1)
    return torch.argsort(src)  # gguf row r holds hf row src[r]


class LlamaGGUFNames:
    """The name map of llama.cpp GGUF files onto HF Llama-style module names (see the module docstring).

    ``self(name)`` -> the model's state-dict key, or None for tensors with no model counterpart.
    ``row_order(name, metadata)`` -> the row order undoing llama.cpp's Q/K rotary permutation, or None.
    """

    BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    _BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")

    def __call__(self, name: str) -> str | None:
        if name in self.TOP:
            return self.TOP[name]
        m = self._BLOCK_RE.fullmatch(name)
        if m is None or m.group(2) not in self.BLOCK:
            return None
        return f"model.layers.{m.group(1)}.{self.BLOCK[m.group(2)]}.{m.group(3)}"

    def row_order(self, name: str, metadata: dict, n_rows: int) -> torch.Tensor | None:
        arch = metadata.get("general.architecture")
        m = self._BLOCK_RE.fullmatch(name)
        if arch != "llama" or m is None or m.group(2) not in ("attn_q", "attn_k"):
            return None
        n_head = metadata.get("llama.attention.head_count")
        if n_head is None:
            raise ValueError(f"{name}: the GGUF metadata has no llama.attention.head_count, needed to undo "
                             "llama.cpp's rotary row permutation of attn_q / attn_k")
        if m.group(2) == "attn_k":
            n_head = metadata.get("llama.attention.head_count_kv", n_head)
        return _rope_unpermute(n_rows, int(n_head))

    def __repr__(self) -> str:
        return "llama_gguf_names"


llama_gguf_names = LlamaGGUFNames()
