"""Split-K for the weight-only GEMVs (gemv_mma, gemv_stream): with gridDim.y = splits > 1 a GEMV
writes an fp32 workspace [splits, M, N] that ``splitk_reduce`` (splitk_reduce.cu) sums in split
order (deterministic), adding the bias and applying the activation.

:class:`SplitKGemvPlan` is the call of both GEMV plans: one launch (splits == 1) or the GEMV into a
fresh workspace (torch's caching allocator recycles it) and the reduction.
"""
from __future__ import annotations

import torch

from custom_kernels.device import raw_stream, sm_count
from custom_kernels.launch import I32, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel

__all__ = ["SplitKReduceArgs", "reduce_kernel", "reduce_launch", "SplitKGemvPlan", "REDUCE_VECTOR"]

REDUCE_VECTOR = 4  # splitk_reduce.cu kVec: outputs per thread when N % 4 == 0 and D and the bias are aligned


class SplitKReduceArgs(KernelArgs):
    _fields_ = [("workspace", Ptr), ("bias", Ptr), ("D", Ptr), ("M", I32), ("N", I32), ("splits", I32),
                ("act", I32)]


def reduce_kernel(element: int) -> tuple[str, str, dict[str, int]]:
    """(source, kernel, defines) of the reduction for output type ``element`` (WO_ELEMENT)."""
    return "splitk_reduce.cu", "splitk_reduce", {"WO_ELEMENT": element}


def reduce_launch(M: int, N: int, splits: int, element: int, device: int) -> Launch:
    """The splitk_reduce launch of an [M, N] output over ``splits`` workspace slices."""
    kernel = load_kernel(*reduce_kernel(element), device=device)
    per_thread = REDUCE_VECTOR if N % REDUCE_VECTOR == 0 else 1  # the kernel's vector path: four outputs a thread
    grid = min(-(-(M * N) // (256 * per_thread)), 8 * sm_count(device))
    return Launch(kernel, LaunchConfig.of(grid, 256), SplitKReduceArgs(M=M, N=N, splits=splits), device)


class SplitKGemvPlan:
    """A GEMV launch taking (A, bias, D, workspace, act) per call, plus its reduction when split."""

    bias_tensor = False  # __call__ takes the bias address (0 for none)
    per_m = True         # the launch depends on M
    strategy = ""

    def __init__(self, gemv: Launch, splits: int, M: int, N: int, element: int, device: int, keep=(),
                 summed: bool = False):
        """``summed``: the launch sums its own K splits (a cluster's, gemm_wgmma's ``cluster``): one launch, no
        workspace."""
        self.gemv = gemv
        self.splits = splits
        self.workspace_shape = (splits, M, N)
        self.device = device
        self.reduce = reduce_launch(M, N, splits, element, device) if splits > 1 and not summed else None
        self._keep = keep  # tensors the launch points at that the plan derived (packed words, copies)

    def recipe_steps(self, has_bias: bool, act: int) -> tuple[list, int, tuple]:
        """(steps, workspace bytes, the tensors the plan derived that they point at) of :meth:`__call__` as a
        recipe (``custom_kernels.recipe``): x, the bias, the output and the fp32 workspace as per-call addresses."""
        from custom_kernels.recipe import BIAS, OUT, WORKSPACE, X, step_of

        bias = BIAS if has_bias else 0
        keep = tuple(t for t in self._keep if t is not None)
        if self.reduce is None:
            return [step_of(self.gemv, A=X, bias=bias, D=OUT, act=act)], 0, keep
        splits, M, N = self.workspace_shape
        return [step_of(self.gemv, A=X, bias=bias, D=OUT, workspace=WORKSPACE, act=act),
                step_of(self.reduce, workspace=WORKSPACE, bias=bias, D=OUT, act=act)], 4 * splits * M * N, keep

    def __call__(self, x: torch.Tensor, bias: int, act: int, out: torch.Tensor) -> None:
        if self.reduce is None:
            self.gemv(A=x.data_ptr(), bias=bias, D=out.data_ptr(), act=act)
            return
        workspace = torch.empty(self.workspace_shape, dtype=torch.float32, device=x.device)
        stream = raw_stream(self.device)
        self.gemv(stream, A=x.data_ptr(), bias=bias, D=out.data_ptr(), workspace=workspace.data_ptr(), act=act)
        self.reduce(stream, workspace=workspace.data_ptr(), bias=bias, D=out.data_ptr(), act=act)
