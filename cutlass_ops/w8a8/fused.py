"""Scheme 2 (W8A8 per K block) as ONE fused NVRTC kernel (variants: :mod:`.tiles`).

    D[m, n] = act( sum_i [ sA*sB*Cq_i + sA*oB*sumA_i + oA*sB*sumB_i + bs*oA*oB ] + bias[n] )

A = QuantA(x) per row and K block (asymmetric, offset form), B = the int8 weight per column and
K block (offset form), Cq_i = int32 dot product of block i. The kernel runs int8 tensor-core tiles
and promotes each block's int32 sum into fp32 accumulators; nothing but D is written.

Per weight (through ``cutlass_ops.plan_cache``): :func:`prepare_weight_w8a8` builds the GPU copy of
B_q and bvec[g, n] = (sB, oB, q = sB*sumB + bs*oB, 0) as float32 [G, N, 4]; a :class:`FusedPlan`
per (tile variant, device) holds them, the compiled kernel and one launch per grid.
"""
from __future__ import annotations

import torch

from cutlass_ops import plan_cache
from cutlass_ops._validate import check_dtype, check_ndim, check_shape, parse_activation
from cutlass_ops.formats import quant_a_blocks
from custom_kernels.device import capability, on_device, target_arch
from custom_kernels.launch import I32, KernelArgs, Ptr, TensorMap, load_kernel
from custom_kernels.recipe import BIAS, OUT, WORKSPACE, X, MapOf, Recipe, step_of

from .launches import GridLaunches, device_index, grid_launches
from .quant_a import (BVEC_KERNEL, SOURCE as QUANT_A_SOURCE, plane_addresses, precompute_bvec_gpu, quantize_rows_into,
                      quantize_rows_launch)
from .tiles import BLOCK_SIZES, ROW_PLANES_KERNEL, TILE_CONFIGS, TileConfig, choose_config
from .tma import encode_maps, tensor_map_2d

__all__ = [
    "FusedArgs", "FusedTmaArgs", "RowPlanesArgs", "FusedPlan", "prepare_weight_w8a8", "quantize_activation_torch",
    "linear_w8a8_fused", "fused_linear", "OUT_KIND", "config_problem", "recipe",
]

OUT_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_DEFAULT_SMEM = 48 * 1024  # dynamic shared memory a launch gets without opting in
_MAX_SMEM = 227 * 1024  # the most one block may opt in to (sm_80 163 KiB: a launch there fails loudly)


class FusedArgs(KernelArgs):
    _fields_ = [("A", Ptr), ("sA", Ptr), ("oA", Ptr), ("sumA", Ptr), ("B", Ptr), ("bvec", Ptr), ("bias", Ptr),
                ("D", Ptr), ("M", I32), ("N", I32), ("K", I32), ("G", I32), ("act", I32), ("out_kind", I32)]


class FusedTmaArgs(KernelArgs):
    """The TMA variants (``W8A8W_TMA``): the tensor maps of A and B appended."""

    _fields_ = FusedArgs._fields_ + [("map_a", TensorMap), ("map_b", TensorMap)]


class RowPlanesArgs(KernelArgs):
    _fields_ = [("sA", Ptr), ("oA", Ptr), ("sumA", Ptr), ("planes", Ptr), ("M", I32), ("G", I32), ("Mp", I32)]


def quantize_activation_torch(x2d: torch.Tensor, block_size: int):
    """QuantA with torch ops on x's device: (A_q int8 [M,K], scale f32 [M,G], offset f32 [M,G], sum_q int32 [M,G]).

    The same IEEE-rounded float32 operations, in the same order, as
    ``formats.quantize_activation_reference`` (its arithmetic, ``formats.quant_a_blocks``):
    scale = (max - min) / 255, offset = max - scale * 127, zero-range blocks get scale 1 and
    offset max, q = clamp(round_half_even((x - offset) / scale), -128, 127).
    """
    return quant_a_blocks(x2d, block_size)


def _check_block_size(block_size: int, K: int) -> None:
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"the fused W8A8 kernel needs block_size in {BLOCK_SIZES}, got block_size={block_size}")
    if K % block_size != 0 or K % 16 != 0:
        raise ValueError(f"K={K} must be a multiple of block_size={block_size} and of 16")


def _prepare(qw, device: torch.device) -> dict:
    N, K, bs = qw.N, qw.K, qw.block_size
    B_q = qw.qweight.to(device).contiguous()
    sB, oB = qw.scale.to(device, torch.float32), qw.offset.to(device, torch.float32)
    # on the GPU one NVRTC launch (quant_a.cu precompute_bvec), bit for bit the torch reference
    sumB, bvec = (precompute_bvec_gpu if device.type == "cuda" else prepare_bvec_reference)(B_q, sB, oB, bs)
    return {"B_q": B_q, "bvec": bvec, "sumB": sumB, "N": N, "K": K, "G": K // bs, "block_size": bs, "device": device}


def prepare_bvec_reference(B_q: torch.Tensor, sB: torch.Tensor, oB: torch.Tensor, block_size: int):
    """(sumB int32 [N, G], bvec float32 [G, N, 4]) of :func:`_prepare` in torch ops (the kernel's reference):
    q = sB * sumB + block_size * oB in float64, rounded once to float32 (the kernel multiplies it by oA)."""
    N, K = B_q.shape
    G = K // block_size
    sumB = B_q.reshape(N, G, block_size).sum(dim=-1, dtype=torch.int32)
    q = (sB.double() * sumB.double() + block_size * oB.double()).float()
    return sumB, torch.stack((sB, oB, q, torch.zeros_like(q)), dim=-1).transpose(0, 1).contiguous()


def prepare_weight_w8a8(qw, device=None) -> dict:
    """Per-weight data of the fused kernel, built once per (weight, device) and kept in
    ``cutlass_ops.plan_cache`` (rebuilt when the weight's tensors are replaced or modified in place).

    qw: a bits=8 ``QuantizedWeight`` (qweight int8 [N, K], scale/offset float32 [N, G]).
    Returns {"B_q": int8 [N, K], "bvec": float32 [G, N, 4] = (sB, oB, sB*sumB + bs*oB, 0),
    "sumB": int32 [N, G], "N", "K", "G", "block_size", "device"} with tensors on ``device``
    (default: the weight's CUDA device, else the current CUDA device).
    """
    if getattr(qw, "bits", None) != 8:
        raise ValueError(f"qw must be an int8 weight (bits=8), got bits={getattr(qw, 'bits', None)!r}")
    N, K, bs = qw.N, qw.K, qw.block_size
    _check_block_size(bs, K)
    check_dtype(qw.qweight, "qw.qweight", (torch.int8,))
    check_shape(qw.qweight, "qw.qweight", (N, K), "[N, K]")
    if device is None:
        device = qw.qweight.device if qw.qweight.is_cuda else torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    return plan_cache.plan(qw, ("w8a8.fused.weight", str(device)), lambda: _prepare(qw, device))


def _column_planes(prep: dict) -> torch.Tensor:
    """bvec's (sB, oB, q) as planes [G, 3, N rounded up to 4] (zero padding: 16-byte copies of each
    plane) for the planar variants; made on their first use and kept in the prepared weight."""
    planes = prep.get("bplanes")
    if planes is None:
        G, N, bvec = prep["G"], prep["N"], prep["bvec"]
        planes = torch.zeros(G, 3, -(-N // 4) * 4, dtype=torch.float32, device=bvec.device)
        planes[:, :, :N] = bvec[..., :3].permute(0, 2, 1)
        prep["bplanes"] = planes
    return planes


def config_problem(cfg: TileConfig, block_size: int, arch: str, device: str = "the device") -> str | None:
    """Why :class:`FusedPlan` refuses variant ``cfg`` at ``block_size`` on NVRTC target ``arch`` (None: it
    builds). Pure: no GPU."""
    if cfg.wgmma and arch != "90a":
        return f"config {cfg.name!r} is the wgmma kernel, which needs compute capability 9.0; {device} is sm_{arch}"
    smem = cfg.smem_bytes(block_size)
    if smem > _MAX_SMEM:
        return (f"config {cfg.name!r} needs {smem} bytes of shared memory at block_size={block_size}; "
                f"the limit is {_MAX_SMEM}: use a variant with fewer stages")
    return None


class FusedPlan:
    """The fused kernel of one tile variant for one weight on one device: the prepared weight, the
    compiled kernel with its weight fields (B, bvec, N, K, G, B's tensor map) written once, and a
    launch per grid. ``plan(A_q, sA, oA, sumA, bias, D, act)``; the planar variants take the row
    planes [G, 3, Mp] as sA = oA = sumA."""

    @staticmethod
    def kernels(cfg: TileConfig, block_size: int) -> tuple:
        """(source, kernel, defines) of every kernel the plan may load: the GEMM, the weight preparation and,
        planar variants, the row-parameter transpose (same module; used when the caller passes quantized_A)."""
        defines = cfg.defines(block_size)
        return ((cfg.kernel_file, cfg.kernel_name, defines), (QUANT_A_SOURCE, BVEC_KERNEL, {}),
                *(((cfg.kernel_file, ROW_PLANES_KERNEL, dict(defines)),) if cfg.planes else ()))

    def __init__(self, qw, cfg: TileConfig, device: int):
        arch = target_arch(device)
        bs = qw.block_size
        problem = config_problem(cfg, bs, arch, f"device {device}")
        if problem is not None:
            raise ValueError(problem)
        smem = cfg.smem_bytes(bs)
        self.cfg, self.device = cfg, device
        self.prep = prep = prepare_weight_w8a8(qw, torch.device("cuda", device))
        self.N, self.K, self.G = prep["N"], prep["K"], prep["G"]
        self.defines = tuple(sorted(cfg.defines(bs).items()))
        with on_device(device):
            kernel = load_kernel(cfg.kernel_file, cfg.kernel_name, cfg.defines(bs), arch=arch, device=device)
            if smem > _DEFAULT_SMEM:
                kernel.set_max_dynamic_smem(smem)
            bvec = _column_planes(prep) if cfg.planes else prep["bvec"]
            fixed = dict(B=prep["B_q"].data_ptr(), bvec=bvec.data_ptr(), N=self.N, K=self.K, G=self.G)
            if cfg.tma:
                fixed["map_b"] = tensor_map_2d(prep["B_q"].data_ptr(), self.N, self.K, cfg.BN, cfg.BK, device)
        self.bvec = bvec  # kept alive with the plan
        self.gemm = GridLaunches(kernel, FusedTmaArgs if cfg.tma else FusedArgs, cfg.threads, device, smem,
                                 fixed=fixed)

    def row_planes(self, sA: torch.Tensor, oA: torch.Tensor, sumA: torch.Tensor, M: int) -> torch.Tensor:
        """sA, oA, sumA [M, G] -> planes [G, 3, M rounded up to 4] (w8a8_row_planes, one launch)."""
        G, Mp = self.G, -(-M // 4) * 4
        planes = torch.empty(G, 3, Mp, dtype=torch.float32, device=sA.device)
        launches = grid_launches(self.cfg.kernel_file, ROW_PLANES_KERNEL, RowPlanesArgs, 256, self.device,
                                 self.defines, target_arch(self.device))
        launches(-(-G * M // 256), sA=sA.data_ptr(), oA=oA.data_ptr(), sumA=sumA.data_ptr(),
                 planes=planes.data_ptr(), M=M, G=G, Mp=Mp)
        return planes

    def __call__(self, A_q: torch.Tensor, sA: torch.Tensor, oA: torch.Tensor, sumA: torch.Tensor,
                 bias: torch.Tensor | None, D: torch.Tensor, act: int) -> None:
        self.launch(A_q.shape[0], A_q.data_ptr(), sA.data_ptr(), oA.data_ptr(), sumA.data_ptr(),
                    0 if bias is None else bias.data_ptr(), D, act)

    def launch(self, M: int, A: int, sA: int, oA: int, sumA: int, bias: int, D: torch.Tensor, act: int) -> None:
        """The fused launch on device addresses (A 16-byte aligned; bias 0 for none) into D [M, N]."""
        grid, fields = self.launch_fields(M, A, sA, oA, sumA, bias, D.data_ptr(), D.dtype, act)
        self.gemm(grid, **encode_maps(fields, self.device))

    def launch_fields(self, M: int, A, sA, oA, sumA, bias, D, out_dtype: torch.dtype, act: int) -> tuple:
        """(grid, fields) of the fused launch: addresses as ints or recipe ``At``s; TMA variants' A map as a
        ``recipe.MapOf`` (:meth:`launch` encodes it)."""
        cfg = self.cfg
        fields = dict(A=A, sA=sA, oA=oA, sumA=sumA, bias=bias, D=D, M=M, act=act, out_kind=OUT_KIND[out_dtype])
        if cfg.tma:
            fields["map_a"] = MapOf(A, M, self.K, cfg.BM, cfg.BK)
        return -(-M // cfg.BM) * -(-self.N // cfg.BN), fields


def _plan(qw, config: str, device: int) -> FusedPlan:
    return plan_cache.plan(qw, ("w8a8.fused", config, device), lambda: FusedPlan(qw, TILE_CONFIGS[config], device))


_ALIGN = 128  # workspace sections start 128 bytes apart: TMA and vector loads need 16, cache lines like 128


def _workspace_layout(M: int, K: int, block_size: int, planes: bool) -> tuple[int, tuple[int, int, int], int, int]:
    """(bytes, offsets of the row parameters, row stride, block stride) of QuantA's one workspace: A_q [M, K]
    at 0, then the row parameters: [G, 3, M rounded to 4] planes with ``planes``, else scale, offset, sum_q
    [M, G] one after the other, each section 128-byte aligned."""
    G = K // block_size
    a_bytes = -(-M * K // _ALIGN) * _ALIGN
    if planes:
        Mp = -(-M // 4) * 4
        params, ld_param, g_stride = plane_addresses(a_bytes, Mp)
        return a_bytes + 12 * G * Mp, params, ld_param, g_stride
    p_bytes = -(-4 * M * G // _ALIGN) * _ALIGN
    return a_bytes + 3 * p_bytes, (a_bytes, a_bytes + p_bytes, a_bytes + 2 * p_bytes), G, 1


def _quantize_into_workspace(x2d: torch.Tensor, block_size: int, planes: bool) -> tuple[torch.Tensor, int, int]:
    """QuantA of x2d into ONE fresh workspace (one allocation where quantize_activation_gpu makes four):
    (workspace, address of A_q [M, K], addresses of the row parameters: :func:`_workspace_layout`)."""
    M, K = x2d.shape
    nbytes, offsets, ld_param, g_stride = _workspace_layout(M, K, block_size, planes)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=x2d.device)
    A = workspace.data_ptr()
    params = tuple(A + o for o in offsets)
    quantize_rows_into(x2d, block_size, A, params, ld_param, g_stride)
    return workspace, A, params


def recipe(qw, dtype: torch.dtype, M: int, K: int, act: int, has_bias: bool, device: int) -> Recipe:
    """The launches of :func:`fused_linear` for x [M, K] of ``dtype`` on ``device`` as a recipe (QuantA into the
    call's workspace, the fused kernel into the output): what ``_run`` launches, with the per-call addresses
    left to the C++ replay (``custom_kernels.recipe``)."""
    plan = _plan(qw, choose_config(M, qw.N, capability(device)), device)
    bs, planes = qw.block_size, plan.cfg.planes
    nbytes, offsets, ld_param, g_stride = _workspace_layout(M, K, bs, planes)
    params = tuple(WORKSPACE + o for o in offsets)
    launches, grid, fields = quantize_rows_launch(dtype, M, K, K, bs, device, X, WORKSPACE, params, ld_param,
                                                  g_stride)
    steps = [step_of(launches.launch_for(grid), **fields)]
    if planes:
        params = (params[0],) * 3
    grid, fields = plan.launch_fields(M, WORKSPACE, *params, BIAS if has_bias else 0, OUT, dtype, act)
    steps.append(step_of(plan.gemm.launch_for(grid), **fields))
    # the weight's own tensors too: an in-place change of scale or offset must send calls back to Python,
    # whose plan cache then rebuilds bvec
    return Recipe(steps, plan.N, nbytes, keep=(qw.qweight, qw.scale, qw.offset, plan.prep["B_q"], plan.bvec),
                  bias_dtype=torch.float32)


def _run(x2d: torch.Tensor | None, quantized_A, qw, bias: torch.Tensor | None, act: int, out: torch.Tensor,
         config: str | None, M: int, device: int) -> None:
    """QuantA (unless given), the row planes (planar variants) and the fused launch."""
    config = config or choose_config(M, qw.N, capability(device))
    plan = _plan(qw, config, device)
    bs = qw.block_size
    if bias is not None:
        bias = plan_cache.float32_copy(bias)  # kept alive (here) until the launch is queued
    if quantized_A is None:  # the per-call path of linear_w8a8: one workspace, QuantA, the fused kernel
        # the workspace is freed once both launches are queued: the caching allocator reuses it in stream order
        workspace, A, params = _quantize_into_workspace(x2d, bs, plan.cfg.planes)
        if plan.cfg.planes:  # QuantA wrote the row parameters as planes: the kernel reads them as sA = oA = sumA
            params = (params[0],) * 3
        with on_device(device):
            plan.launch(M, A, *params, 0 if bias is None else bias.data_ptr(), out, act)
        return
    A_q, sA, oA, sumA = quantized_A
    with on_device(device):
        if plan.cfg.planes:
            # row parameters as planes [G, 3, M rounded up to 4], copied per K block into shared memory
            # next to the column planes; one small kernel (w8a8_row_planes) transposes them
            sA = oA = sumA = plan.row_planes(sA, oA, sumA, M)
        plan(A_q, sA, oA, sumA, bias, out, act)


def fused_linear(x2d: torch.Tensor, qw, bias: torch.Tensor | None, act: int) -> torch.Tensor:
    """The family's "fused" path behind ``cutlass_ops.linear_w8a8`` (which has checked the operands):
    x2d CUDA contiguous [M >= 1, K], qw an int8 weight on its device, bias None or [N], act a code."""
    M, K = x2d.shape
    if qw.block_size not in BLOCK_SIZES or K % 16:
        _check_block_size(qw.block_size, K)
    out = torch.empty(M, qw.N, dtype=x2d.dtype, device=x2d.device)
    _run(x2d, None, qw, bias, act, out, None, M, device_index(x2d))
    return out


def _check_quantized_A(quantized_A, M: int, K: int, G: int, device: torch.device):
    if not isinstance(quantized_A, (tuple, list)) or len(quantized_A) != 4:
        raise TypeError("quantized_A must be a tuple (A_q, scale, offset, sum_q) as quantize_activation returns")
    A_q, sA, oA, sumA = quantized_A
    for t, name, dtype, shape, layout in ((A_q, "A_q", torch.int8, (M, K), "[M, K]"),
                                          (sA, "scale", torch.float32, (M, G), "[M, G]"),
                                          (oA, "offset", torch.float32, (M, G), "[M, G]"),
                                          (sumA, "sum_q", torch.int32, (M, G), "[M, G]")):
        check_dtype(t, f"quantized_A {name}", (dtype,))
        check_shape(t, f"quantized_A {name}", shape, layout)
        if t.device != device:
            raise ValueError(f"quantized_A {name} is on {t.device}, expected {device}")
    A_q = A_q.contiguous()
    if A_q.data_ptr() % 16:  # 16-byte cp.async copies
        A_q = A_q.clone()
    return A_q, sA.contiguous(), oA.contiguous(), sumA.contiguous()


def linear_w8a8_fused(x2d: torch.Tensor | None, qw, bias: torch.Tensor | None = None, act=0, *,
                      quantized_A=None, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                      config: str | None = None) -> torch.Tensor:
    """D [M, N] = act(QuantA(x2d) (*) qw + bias), scheme 2, in one kernel launch; D in x2d.dtype.

    The fused kernel with its knobs, every argument checked (``cutlass_ops.linear_w8a8`` goes
    through :func:`fused_linear` instead). x2d: CUDA [M, K] float16/bfloat16/float32 (may be None
    when ``quantized_A`` and ``out_dtype`` are given). quantized_A: optional precomputed (A_q,
    scale, offset, sum_q) of x2d with block_size = qw.block_size. act: 0/1/2 or None/"relu"/"relu6".
    out: optional contiguous [M, N] output to write. config: force a tile variant (a key of
    TILE_CONFIGS).
    """
    if x2d is not None:
        check_dtype(x2d, "x2d", tuple(OUT_KIND))
        check_ndim(x2d, "x2d", 2, "[M, K]")
        M, K = x2d.shape
        device = x2d.device
        out_dtype = x2d.dtype if out_dtype is None else out_dtype
    elif quantized_A is None:
        raise TypeError("linear_w8a8_fused needs x2d or quantized_A")
    else:
        M, K = quantized_A[0].shape
        device = quantized_A[0].device
    if out_dtype not in OUT_KIND:
        raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    if K != qw.K:
        raise ValueError(f"x2d has K={K} columns but qw has K={qw.K}")
    bs = qw.block_size
    _check_block_size(bs, K)
    act = parse_activation(act, "act")
    N, G = qw.N, K // bs
    if bias is not None:
        check_dtype(bias, "bias", tuple(OUT_KIND))
        check_shape(bias, "bias", (N,), "[N]")
    if config is not None and config not in TILE_CONFIGS:
        raise ValueError(f"config must be one of {sorted(TILE_CONFIGS)}, got {config!r}")
    if device.type != "cuda":
        raise ValueError(f"x2d must be a CUDA tensor, got a tensor on {device}")

    index = device_index(quantized_A[0] if x2d is None else x2d)
    prepare_weight_w8a8(qw, device)  # its checks of the weight, before any allocation
    if out is None:
        out = torch.empty(M, N, dtype=out_dtype, device=device)
    else:
        check_dtype(out, "out", (out_dtype,))
        check_shape(out, "out", (M, N), "[M, N]")
        if out.device != device or not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out must be a contiguous, 16-byte aligned tensor on x2d's device")
    if M == 0:
        return out
    if bias is not None and bias.device != device:
        raise ValueError(f"bias is on {bias.device}, expected {device}")
    if quantized_A is not None:
        quantized_A = _check_quantized_A(quantized_A, M, K, G, device)
    else:
        x2d = x2d.contiguous()
    _run(x2d, quantized_A, qw, bias, act, out, config, M, index)
    return out
