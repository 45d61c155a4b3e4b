"""Megatron-style tensor parallelism of a Llama-style decoder, quantized on the way.

Per decoder layer, with ``world`` ranks:
  attention: q_proj, k_proj, v_proj column parallel (each rank keeps heads/world query heads and
             kv_heads/world key/value heads: a head is head_dim contiguous rows of W), o_proj row
             parallel (input_is_parallel: the local heads' output) -> one all-reduce;
  MLP:       gate_proj, up_proj column parallel, down_proj row parallel -> one all-reduce.
The attention module must reshape with the local head count: this helper divides the attributes named in
``HEAD_ATTRS`` (``num_heads``, ``num_key_value_heads``, ``heads``, ``kv_heads``) of each module that owns a
q_proj, and refuses a world that does not divide them. A model written with ``view(B, T, -1, head_dim)``
(as Hugging Face's Llama) needs nothing else. Norms, embeddings and the LM head stay replicated.
"""
from __future__ import annotations

from torch import nn

from cutlass_ops.distributed.modules import ColumnParallelQuantLinear, RowParallelQuantLinear
from cutlass_ops.distributed.sharding import check_rank
from cutlass_ops.nn import QuantLinear

__all__ = ["LLAMA_TP_PLAN", "HEAD_ATTRS", "tensor_parallel_llama_"]

# Hugging Face Llama / Mistral / Qwen2 linear names -> how they split
LLAMA_TP_PLAN = {"q_proj": "column", "k_proj": "column", "v_proj": "column", "o_proj": "row",
                 "gate_proj": "column", "up_proj": "column", "down_proj": "row"}
HEAD_ATTRS = ("num_heads", "num_key_value_heads", "heads", "kv_heads")


def _split_heads(model: nn.Module, world: int) -> dict[str, int]:
    """Divide the head counts of every module owning a q_proj (checked for all before any change)."""
    changes = {}
    for name, module in model.named_modules():
        if not hasattr(module, "q_proj"):
            continue
        for attr in HEAD_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                if value % world:
                    raise ValueError(f"{name or 'model'}.{attr}={value} is not divisible by world={world}: "
                                     "tensor parallelism splits whole heads across ranks")
                changes[f"{name}.{attr}" if name else attr] = value // world
    return changes


def tensor_parallel_llama_(model: nn.Module, config, rank: int, world: int, group=None, *,
                           plan: dict[str, str] | None = None) -> list[str]:
    """Replace, in place, each linear of ``model`` whose last name is in ``plan`` (default
    ``LLAMA_TP_PLAN``) by its ``ColumnParallelQuantLinear`` / ``RowParallelQuantLinear`` shard for
    ``rank`` of ``world`` (``group``: the process group; None the default one).

    A float ``nn.Linear`` is quantized whole as ``config`` says (a ``cutlass_ops`` config) and then
    sharded; an existing ``QuantLinear`` is sharded as it is (config may then be None). Head counts are
    divided (see the module docstring). Returns the replaced layer names. Refused with a ValueError,
    before the model is changed, when a head count, an N or a K does not split into whole heads, rows or
    quantization blocks.
    """
    check_rank(rank, world)
    plan = LLAMA_TP_PLAN if plan is None else plan
    for kind in plan.values():
        if kind not in ("column", "row"):
            raise ValueError(f"plan values must be 'column' or 'row', got {kind!r}")
    head_changes = _split_heads(model, world)
    built = {}
    for name, module in model.named_modules():
        kind = plan.get(name.rpartition(".")[2])
        if kind is None:
            continue
        if type(module) is nn.Linear:
            if config is None:
                raise ValueError(f"{name} is a float nn.Linear: config must be a cutlass_ops config, got None")
            q = QuantLinear.from_float(module, config)
        elif isinstance(module, QuantLinear):
            q = module
        else:
            raise TypeError(f"{name} must be an nn.Linear or a QuantLinear, got {type(module).__name__}")
        try:
            built[name] = (ColumnParallelQuantLinear(q, rank, world, group) if kind == "column"
                           else RowParallelQuantLinear(q, rank, world, group))
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    for name, parallel in built.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, parallel)
    for path, value in head_changes.items():
        parent, _, attr = path.rpartition(".")
        setattr(model.get_submodule(parent), attr, value)
    return list(built)
