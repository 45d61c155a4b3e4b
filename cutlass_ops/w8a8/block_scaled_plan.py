"""The block-scaled symmetric W8A8 scheme (:mod:`.block_scaled`) on Hopper: the symmetric QuantA launch
(``quant_a.cu`` built with ``QUANT_A_SYMMETRIC``), :class:`BlockScaledPlan` (``w8a8_kblock_wgmma.cu``
built with ``W8A8W_BLOCK_SCALED``, variants :data:`~.tiles.BLOCK_SCALED_CONFIGS`) and :func:`linear`,
the checked entry behind :func:`.block_scaled.linear_w8a8_block_scaled`.

What the kernel reads: A_q int8 [M, K] and B_q int8 [N, K] through TMA tensor maps; the row scales as one
plane [G, M rounded up to 4] (:func:`.block_scaled.row_scale_planes`, which QuantA writes directly);
the weight scales as float4 [G, ceil(N / BN)] of the 64-column slices of each CTA tile
(:func:`.block_scaled.slice_scales`, made once per weight and variant); bias float32 [N] or none.

Split-K (small M, where the output tiles leave SMs idle; :func:`.tiles.choose_splits`): the GEMM runs on a
grid (tiles, splits), each split on its own slice of whole K blocks, writing fp32 partial sums to a
workspace [splits, M, N]; ``w8a8_kblock_wgmma_splitk_reduce`` (same module) adds them in split order and
applies the bias, the activation and the cast. Deterministic: no atomics.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from cutlass_ops import plan_cache
from cutlass_ops._validate import (FLOAT_DTYPES, check_cuda, check_dtype, check_int, check_ndim, check_shape,
                                   parse_activation)
from custom_kernels.device import capability, on_device, sm_count, target_arch
from custom_kernels.launch import I32, KernelArgs, Ptr, load_kernel
from custom_kernels.recipe import BIAS, OUT, WORKSPACE, X, MapOf, Recipe, step_of

from .block_scaled import BlockScaledWeight, _check_block_size, row_scale_planes, slice_scales
from .fused import OUT_KIND, FusedTmaArgs, config_problem
from .launches import TAGS, GridLaunches, device_index, rows
from .quant_a import SOURCE as QUANT_A_SOURCE
from .quant_a import quantize_rows_into, quantize_rows_launch
from .tiles import (BLOCK_SCALED_CONFIGS, BLOCK_SCALED_SIZES, WGMMA_CC, TileConfig, choose_block_scaled_config,
                    choose_splits, k_units)
from .tma import encode_maps, tensor_map_2d

__all__ = ["SYMMETRIC", "REDUCE_KERNEL", "ReduceArgs", "BlockScaledPlan", "quantize_activation_block_scaled_gpu",
           "plan_for", "check_splits", "linear", "recipe"]

SYMMETRIC = (("QUANT_A_SYMMETRIC", 1),)  # quant_a.cu's symmetric build (same kernel names)
REDUCE_KERNEL = "w8a8_kblock_wgmma_splitk_reduce"  # split-K's second launch (the GEMM's module)
_DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a launch gets without opting in
_REDUCE_THREADS = 256
_REDUCE_BLOCKS_PER_SM = 8  # grid-stride beyond that


class ReduceArgs(KernelArgs):
    _fields_ = [("workspace", Ptr), ("bias", Ptr), ("D", Ptr), ("M", I32), ("N", I32), ("splits", I32),
                ("act", I32), ("out_kind", I32)]


def quantize_activation_block_scaled_gpu(x2d: torch.Tensor, block_size: int, *, planes: bool = True):
    """Symmetric QuantA of the CUDA activations x2d [M, K] (float16 / bfloat16 / float32; rows may be
    strided) in one launch: (A_q int8 [M, K], scales float32), the scales as the kernel's plane [G, Mp]
    (Mp = M rounded up to 4; columns M.. are not written) or, planes=False, [M, G]. Bit for bit
    ``quantize_activation_block_scaled_reference``."""
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_cuda(x2d, "x2d")
    rows(x2d, "x2d")
    M, K = x2d.shape
    bs = _check_block_size(block_size, K)
    G = K // bs
    dev = x2d.device
    A_q = torch.empty((M, K), dtype=torch.int8, device=dev)
    if planes:
        Mp = -(-M // 4) * 4
        scales = torch.empty((G, Mp), dtype=torch.float32, device=dev)
        ld_param, g_stride = 1, Mp  # (m, g) at g Mp + m
    else:
        scales = torch.empty((M, G), dtype=torch.float32, device=dev)
        ld_param, g_stride = G, 1
    quantize_rows_into(x2d, bs, A_q.data_ptr(), (scales.data_ptr(), 0, 0), ld_param, g_stride, SYMMETRIC)
    return A_q, scales


class BlockScaledPlan:
    """The block-scaled kernel of one tile variant for one weight on one device: the weight's GPU copy
    and slice scales, the compiled kernel with the weight's fields (B, slice scales, N, K, G, B's tensor
    map) written once, and a launch per grid; the split-K reduce of the same module.
    ``plan(A_q, row_planes, bias32, D, act, splits=None)`` (None: :meth:`splits_for` M)."""

    @staticmethod
    def kernels(cfg: TileConfig, block_size: int, dtype: torch.dtype) -> tuple:
        """(source, kernel, defines) of the kernels a call with ``dtype`` activations loads: the GEMM, its
        split-K reduce (whether a call splits depends on M, N, K and the GPU's SMs) and the symmetric QuantA."""
        defines = cfg.defines(block_size)
        return ((cfg.kernel_file, cfg.kernel_name, defines), (cfg.kernel_file, REDUCE_KERNEL, dict(defines)),
                (QUANT_A_SOURCE, f"quant_a_warp_{TAGS[dtype]}", dict(SYMMETRIC)))

    def __init__(self, weight: BlockScaledWeight, cfg: TileConfig, device: int):
        if not cfg.block_scaled:
            raise ValueError(f"config {cfg.name!r} is not a block-scaled variant (tiles.BLOCK_SCALED_CONFIGS)")
        bs = weight.block_size
        if bs not in BLOCK_SCALED_SIZES:
            raise ValueError(f"the block-scaled kernel needs block_size in {BLOCK_SCALED_SIZES}, got block_size={bs}")
        arch = target_arch(device)
        problem = config_problem(cfg, bs, arch, f"device {device}")
        if problem is not None:
            raise ValueError(problem)
        smem = cfg.smem_bytes(bs)
        dev = torch.device("cuda", device)
        self.cfg, self.device, self.block_size = cfg, device, bs
        self.N, self.K, self.G = weight.N, weight.K, weight.num_groups
        self.B_q = weight.qweight.to(dev).contiguous()
        self.slice_scales = slice_scales(weight.scale.to(dev), self.N, bs, cfg.BN)  # [G, tiles_n, 4]
        with on_device(device):
            kernel = load_kernel(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs), arch=arch, device=device)
            if smem > _DEFAULT_SMEM:
                kernel.set_max_dynamic_smem(smem)
            fixed = dict(B=self.B_q.data_ptr(), bvec=self.slice_scales.data_ptr(), oA=0, sumA=0, N=self.N, K=self.K,
                         G=self.G, map_b=tensor_map_2d(self.B_q.data_ptr(), self.N, self.K, cfg.BN, cfg.BK, device))
            reduce = load_kernel(cfg.kernel_file, REDUCE_KERNEL, cfg.defines(bs), arch=arch, device=device)
        self.gemm = GridLaunches(kernel, FusedTmaArgs, cfg.threads, device, smem, fixed=fixed)
        self.reduce = GridLaunches(reduce, ReduceArgs, _REDUCE_THREADS, device, fixed=dict(N=self.N))
        self.sm_count = sm_count(device)

    def splits_for(self, M: int) -> int:
        """The default K slices at M rows (:func:`.tiles.choose_splits` on this GPU)."""
        return choose_splits(self.cfg, M, self.N, self.K, self.block_size, self.sm_count)

    def __call__(self, A_q: torch.Tensor, row_planes: torch.Tensor, bias: torch.Tensor | None, D: torch.Tensor,
                 act: int, splits: int | None = None) -> None:
        """D = act(A_q (*) weight + bias) with the row scales as planes; ``splits`` K slices (checked by the
        caller: 1 <= splits <= ``tiles.k_units(K, block_size)``)."""
        M = A_q.shape[0]
        splits = self.splits_for(M) if splits is None else splits
        # the partial sums as they are (fp32, no bias, no activation); the reduce finishes D
        partials = torch.empty((splits, M, self.N), dtype=torch.float32, device=D.device) if splits > 1 else None
        for launches, grid, fields in self.launches(M, A_q.data_ptr(), row_planes.data_ptr(),
                                                    0 if bias is None else bias.data_ptr(), D.data_ptr(), D.dtype,
                                                    act, splits, 0 if partials is None else partials.data_ptr()):
            launches(grid, **encode_maps(fields, self.device))

    def launches(self, M: int, A, planes, bias, D, out_dtype: torch.dtype, act: int, splits: int, partials) -> list:
        """[(GridLaunches, grid, fields)] of one call: the GEMM (into D, or with ``splits`` > 1 into the fp32
        ``partials`` [splits, M, N]) and then the split-K reduce; addresses as ints or recipe ``At``s, A's map
        as a ``recipe.MapOf`` (:meth:`__call__` encodes it)."""
        cfg = self.cfg
        tiles = -(-M // cfg.BM) * -(-self.N // cfg.BN)
        gemm = dict(A=A, sA=planes, map_a=MapOf(A, M, self.K, cfg.BM, cfg.BK), M=M)
        if splits == 1:
            return [(self.gemm, tiles, dict(gemm, bias=bias, D=D, act=act, out_kind=OUT_KIND[out_dtype]))]
        blocks = min(-(-M * self.N // _REDUCE_THREADS), _REDUCE_BLOCKS_PER_SM * self.sm_count)
        return [(self.gemm, (tiles, splits), dict(gemm, bias=0, D=partials, act=0, out_kind=OUT_KIND[torch.float32])),
                (self.reduce, blocks, dict(workspace=partials, bias=bias, D=D, M=M, splits=splits, act=act,
                                           out_kind=OUT_KIND[out_dtype]))]


class _CacheKey(NamedTuple):
    """``plan_cache`` finds a weight by three tensors (qweight, scale, offset); a block-scaled weight has
    no offset, so its scale stands in twice (an in-place change of either still rebuilds the plans)."""

    qweight: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor


def plan_for(weight: BlockScaledWeight, config: str, device: int) -> BlockScaledPlan:
    """The :class:`BlockScaledPlan` of ``weight`` for variant ``config`` on CUDA ``device`` (kept per weight;
    the benchmark times it alone, with A quantized once)."""
    key = _CacheKey(weight.qweight, weight.scale, weight.scale)
    return plan_cache.plan(key, ("w8a8.block_scaled", config, device),
                           lambda: BlockScaledPlan(weight, BLOCK_SCALED_CONFIGS[config], device))


_ALIGN = 128  # sections of a recipe's workspace start 128 bytes apart (TMA needs 16)


def recipe(weight: BlockScaledWeight, dtype: torch.dtype, M: int, K: int, act: int, has_bias: bool,
           device: int) -> Recipe:
    """The launches of :func:`linear` (default config and splits) for x [M, K] of ``dtype`` on ``device`` as a
    recipe: the symmetric QuantA, the GEMM and (split-K) the reduce, with A_q, the row-scale plane and the
    partial sums in the call's one workspace (``custom_kernels.recipe``)."""
    plan = plan_for(weight, choose_block_scaled_config(M, weight.N), device)
    bs, G, N = weight.block_size, K // weight.block_size, weight.N
    Mp = -(-M // 4) * 4
    planes_at = -(-M * K // _ALIGN) * _ALIGN
    partials_at = planes_at + -(-4 * G * Mp // _ALIGN) * _ALIGN
    splits = plan.splits_for(M)
    nbytes = partials_at + (4 * splits * M * N if splits > 1 else 0)
    launches, grid, fields = quantize_rows_launch(dtype, M, K, K, bs, device, X, WORKSPACE,
                                                  (WORKSPACE + planes_at, 0, 0), 1, Mp, SYMMETRIC)
    steps = [step_of(launches.launch_for(grid), **fields)]
    for launches, grid, fields in plan.launches(M, WORKSPACE, WORKSPACE + planes_at, BIAS if has_bias else 0, OUT,
                                                dtype, act, splits, WORKSPACE + partials_at):
        steps.append(step_of(launches.launch_for(grid), **fields))
    # the weight's own tensors too: an in-place change of its scales must send calls back to Python
    return Recipe(steps, N, nbytes, keep=(weight.qweight, weight.scale, plan.B_q, plan.slice_scales),
                  bias_dtype=torch.float32)


def _check_quantized_A(quantized_A, M: int, K: int, G: int, device: torch.device) -> tuple:
    if not isinstance(quantized_A, (tuple, list)) or len(quantized_A) != 2:
        raise TypeError("quantized_A must be a pair (A_q int8 [M, K], scale float32 [M, G])")
    A_q, scale = quantized_A
    check_dtype(A_q, "quantized_A[0]", (torch.int8,))
    check_shape(A_q, "quantized_A[0]", (M, K), "[M, K]")
    check_dtype(scale, "quantized_A[1]", (torch.float32,))
    check_shape(scale, "quantized_A[1]", (M, G), "[M, G]")
    for name, t in (("quantized_A[0]", A_q), ("quantized_A[1]", scale)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device}")
    return A_q.contiguous(), scale


def check_splits(splits, K: int, block_size: int) -> int:
    """``splits`` (K slices of split-K) as an int in [1, tiles.k_units(K, block_size)], or a clear error."""
    check_int(splits, "splits", minimum=1)
    units = k_units(K, block_size)
    if splits > units:
        raise ValueError(f"splits={splits} is more than K={K} has slices of whole K blocks and K tiles "
                         f"({units} of max(block_size={block_size}, 128) columns)")
    return splits


def linear(x2d: torch.Tensor, weight: BlockScaledWeight, bias: torch.Tensor | None = None, act=0, *,
           quantized_A=None, out: torch.Tensor | None = None, config: str | None = None,
           splits: int | None = None) -> torch.Tensor:
    """:func:`.block_scaled.linear_w8a8_block_scaled` (its docstring): checks, then QuantA and the kernel."""
    if not isinstance(weight, BlockScaledWeight):
        raise TypeError(f"weight must be a BlockScaledWeight, got {type(weight).__name__}")
    check_dtype(x2d, "x2d", FLOAT_DTYPES)
    check_ndim(x2d, "x2d", 2, "[M, K]")
    M, K = x2d.shape
    if K != weight.K:
        raise ValueError(f"x2d has K={K} columns but weight has K={weight.K}")
    bs = weight.block_size
    if bs not in BLOCK_SCALED_SIZES:
        raise ValueError(f"the block-scaled kernel needs block_size in {BLOCK_SCALED_SIZES}, got block_size={bs}")
    act = parse_activation(act, "act")
    N, G = weight.N, K // bs
    if bias is not None:
        check_dtype(bias, "bias", FLOAT_DTYPES)
        check_shape(bias, "bias", (N,), "[N]")
    if config is not None and config not in BLOCK_SCALED_CONFIGS:
        raise ValueError(f"config must be one of {sorted(BLOCK_SCALED_CONFIGS)}, got {config!r}")
    if splits is not None:
        check_splits(splits, K, bs)
    check_cuda(x2d, "x2d")
    device = x2d.device
    index = device_index(x2d)
    cc = capability(index)
    if cc != WGMMA_CC:
        raise ValueError(f"the block-scaled W8A8 kernel needs a Hopper GPU (compute capability 9.0: wgmma, "
                         f"sm_90a); device {index} is sm_{cc}")
    if bias is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device}, expected {device}")
    if out is None:
        out = torch.empty(M, N, dtype=x2d.dtype, device=device)
    else:
        check_dtype(out, "out", (x2d.dtype,))
        check_shape(out, "out", (M, N), "[M, N]")
        if out.device != device or not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out must be a contiguous, 16-byte aligned tensor on x2d's device")
    if quantized_A is not None:
        quantized_A = _check_quantized_A(quantized_A, M, K, G, device)
    if M == 0:
        return out
    plan = plan_for(weight, config or choose_block_scaled_config(M, N), index)
    if quantized_A is None:  # fresh tensors in the kernel's layout: nothing to check again
        A_q, planes = quantize_activation_block_scaled_gpu(x2d, bs)
    else:
        A_q, planes = quantized_A[0], row_scale_planes(quantized_A[1])
    bias32 = None if bias is None else plan_cache.float32_copy(bias)
    with on_device(index):
        plan(A_q, planes, bias32, out, act, splits)
    return out
