"""Megatron-style tensor-parallel ``QuantLinear``s over ``torch.distributed``.

``ColumnParallelQuantLinear``: rank r holds the N shard r of the weight and bias (``shard_column``) and
computes y[..., N_r]; ``gather_output=True`` all-gathers the full y (``all_gather_into_tensor`` on NCCL,
``all_gather`` elsewhere, e.g. gloo). ``RowParallelQuantLinear``: rank r holds the K shard r
(``shard_row``), multiplies its K slice of x, all-reduces (sum) the partial outputs, then adds the bias
once and applies the activation. A column layer followed by a row layer (an MLP, attention's
projections) needs one all-reduce and no gather.

Every ``QuantLinear`` mode works (weight_only, w8a8_block, w8a8_channel, w8a8_block_scaled): forward calls the shard's own
``QuantLinear`` (the kernels on CUDA tensors, the float references on CPU tensors). Built from a
QuantLinear, the shards hold exactly its integers, scales and offsets. Numerics against the unsharded
layer: a column shard's outputs are the same; a row-parallel output is a sum of ``world`` partial
products, each rounded to the output dtype, with the bias added after the sum (not in the kernel's
float32 epilogue): equal within the output dtype's rounding. W8A8 modes quantize the activation per
token (w8a8_channel) or per K block (w8a8_block) of the shard's own K slice; per K block that is the
same blocks as unsharded, per token it is a finer scale (equal within int8 activation tolerance).

Gradients follow Megatron: the all-reduce's backward is the identity and the gather's backward takes the
local slice (the loss is the same on every rank); they flow to the input and the bias, never the weight.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cutlass_ops import reference
from cutlass_ops.distributed.sharding import check_rank, shard_bias, shard_column, shard_perm, shard_row
from cutlass_ops.formats import QuantizedWeight
from cutlass_ops.nn import QuantLinear

__all__ = ["ColumnParallelQuantLinear", "RowParallelQuantLinear", "all_reduce_sum", "all_gather_last_dim"]


# --------------------------------------------------------------------------------------------
# Collectives with Megatron's gradients (the loss is identical on every rank)
# --------------------------------------------------------------------------------------------

class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        y = y.contiguous().clone()  # all_reduce is in place: never overwrite a tensor autograd saved
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):  # d(sum of partials) / d(partial) = 1: each rank keeps grad as it is
        return grad, None


def _gather(y: torch.Tensor, world: int, group) -> torch.Tensor:
    y = y.contiguous()
    out = y.new_empty((world, *y.shape))
    if dist.get_backend(group) == "nccl":  # one fused collective into one buffer
        dist.all_gather_into_tensor(out, y, group=group)
    else:  # gloo has no all_gather_into_tensor: gather into views of the same buffer
        dist.all_gather(list(out.unbind(0)), y, group=group)
    return out.movedim(0, -2).reshape(*y.shape[:-1], world * y.shape[-1])  # [..., world, N_r] -> [..., N]


class _AllGatherLastDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, world, rank, group):
        ctx.rank, ctx.Nr = rank, y.shape[-1]
        return _gather(y, world, group)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.Nr:(ctx.rank + 1) * ctx.Nr].contiguous(), None, None, None


def all_reduce_sum(y: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of ``y`` over the ranks of ``group`` (a new tensor; backward: identity)."""
    return _AllReduceSum.apply(y, group)


def all_gather_last_dim(y: torch.Tensor, rank: int, world: int, group=None) -> torch.Tensor:
    """The ranks' y [..., N_r] concatenated in rank order along the last dim: [..., world * N_r]."""
    return _AllGatherLastDim.apply(y, world, rank, group)


def _shard_linear(q: QuantLinear, qw: QuantizedWeight, bias, activation, perm=None) -> QuantLinear:
    """A QuantLinear over the shard ``qw`` with ``q``'s mode, path and bias dtype."""
    dtype = q.bias.dtype if q.bias is not None else None
    bits, symmetric = (8, True) if q.block_scaled else (qw.bits, qw.symmetric)  # block-scaled: int8, symmetric
    s = QuantLinear(qw.K, qw.N, bias is not None, mode=q.mode, bits=bits, block_size=qw.block_size, path=q.path,
                    symmetric=symmetric, activation=activation, act_order=perm is not None,
                    device=qw.qweight.device, dtype=dtype)
    s.set_weight(qw)
    s.set_perm(perm)
    if bias is not None:
        s.bias.copy_(bias)
    return s


def _check_linear(linear) -> QuantLinear:
    if not isinstance(linear, QuantLinear):
        raise TypeError(f"linear must be a cutlass_ops.nn.QuantLinear, got {type(linear).__name__}")
    return linear


class _ParallelLinear(nn.Module):
    def _init_parallel(self, linear: QuantLinear, rank: int, world: int, group) -> None:
        self.rank, self.world = check_rank(rank, world)
        self.group = group
        self.in_features, self.out_features, self.mode = linear.in_features, linear.out_features, linear.mode

    def _check_group(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError(f"{type(self).__name__} with world={self.world} needs torch.distributed initialized "
                               "(dist.init_process_group) before forward")
        got = (dist.get_rank(self.group), dist.get_world_size(self.group))
        if got != (self.rank, self.world):
            raise RuntimeError(f"{type(self).__name__} was built for rank={self.rank}, world={self.world} but its "
                               f"process group has rank={got[0]}, world={got[1]}")

    @classmethod
    def from_float(cls, module: nn.Linear, config, rank: int, world: int, group=None, **kwargs):
        """Quantize ``module`` as ``config`` says (the whole weight, so that every rank holds exactly the
        unsharded layer's integers), then keep rank ``rank``'s shard."""
        return cls(QuantLinear.from_float(module, config), rank, world, group, **kwargs)


class ColumnParallelQuantLinear(_ParallelLinear):
    """y[..., N_r] = act(x @ W[N_r, :]^T + bias[N_r]) on rank r (N_r: its N / world rows of W).

    gather_output=True returns the full y [..., N] (all-gather); otherwise the local shard, as the input of a
    following ``RowParallelQuantLinear(input_is_parallel=True)``. An act-order weight keeps its perm (a
    column shard has all of K).
    """

    def __init__(self, linear: QuantLinear, rank: int, world: int, group=None, *, gather_output: bool = False):
        super().__init__()
        _check_linear(linear)
        self._init_parallel(linear, rank, world, group)
        self.gather_output = bool(gather_output)
        qw = shard_column(linear.weight(), rank, world)
        self.linear = _shard_linear(linear, qw, shard_bias(linear.bias, rank, world), linear.act, linear.perm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.gather_output and self.world > 1:
            self._check_group()
            y = all_gather_last_dim(y, self.rank, self.world, self.group)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (shard {self.rank}/{self.world}: "
                f"{self.out_features // self.world}), gather_output={self.gather_output}")


class RowParallelQuantLinear(_ParallelLinear):
    """y = act(sum over ranks of x[..., K_r] @ W[:, K_r]^T + bias), the sum an all-reduce over ``group``.

    input_is_parallel=True (default): x is this rank's K slice [..., K / world] (a column-parallel layer's
    local output). input_is_parallel=False: x is the full [..., K] and the layer takes its own columns:
    the contiguous slice, or for an act-order weight the scattered global indices ``shard_perm(perm, ...)``
    (buffer ``input_index``), which is the only way an act-order weight can be row-parallel.
    """

    def __init__(self, linear: QuantLinear, rank: int, world: int, group=None, *, input_is_parallel: bool = True):
        super().__init__()
        _check_linear(linear)
        self._init_parallel(linear, rank, world, group)
        self.input_is_parallel = bool(input_is_parallel)
        qw = shard_row(linear.weight(), rank, world)
        index = shard_perm(linear.perm, rank, world)
        if index is not None and self.input_is_parallel:
            raise ValueError("linear has an act-order perm: its row shard consumes scattered input columns "
                             "(shard_perm), not the contiguous K slice; build it with input_is_parallel=False "
                             "and pass the full input")
        if index is None and not self.input_is_parallel:
            index = torch.arange(rank * qw.K, (rank + 1) * qw.K, device=qw.qweight.device)
        self.register_buffer("input_index", index)
        self.linear = _shard_linear(linear, qw, None, None)  # bias and activation come after the sum
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.act = linear.act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_index is not None:
            if x.shape[-1] != self.in_features:
                raise ValueError(f"x must have shape [..., K] with K={self.in_features} (in_features, "
                                 f"input_is_parallel=False), got {tuple(x.shape)}")
            x = x.index_select(-1, self.input_index)
        elif x.shape[-1] != self.linear.in_features:
            raise ValueError(f"x must have shape [..., K / world] with K / world={self.linear.in_features} "
                             f"(input_is_parallel=True: this rank's K slice), got {tuple(x.shape)}")
        y = self.linear(x)
        if self.world > 1:
            self._check_group()
            y = all_reduce_sum(y, self.group)
        if self.bias is not None:
            y = y + self.bias
        return reference.apply_activation(y, self.act)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (shard {self.rank}/{self.world}: {self.in_features // self.world}), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}")
