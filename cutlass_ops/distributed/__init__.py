"""Tensor parallelism for quantized layers: exact shards (:mod:`.sharding`), column / row parallel
``QuantLinear`` over ``torch.distributed`` (:mod:`.modules`), a Llama-style split (:mod:`.llama`)."""
from cutlass_ops.distributed.llama import LLAMA_TP_PLAN, tensor_parallel_llama_
from cutlass_ops.distributed.modules import (
    ColumnParallelQuantLinear, RowParallelQuantLinear, all_gather_last_dim, all_reduce_sum,
)
from cutlass_ops.distributed.sharding import shard_bias, shard_column, shard_perm, shard_row

__all__ = ["shard_column", "shard_row", "shard_perm", "shard_bias", "ColumnParallelQuantLinear",
           "RowParallelQuantLinear", "all_reduce_sum", "all_gather_last_dim", "LLAMA_TP_PLAN",
           "tensor_parallel_llama_"]
