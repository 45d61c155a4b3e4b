"""Per-token symmetric int8 quantization on the GPU in one launch (``custom_kernels/kernels/quant_token.cu``).

The CUDA body of :func:`cutlass_ops.torch_ops.quantize_per_token` (QuantLinear mode "w8a8_channel"):
s = amax |x| / 127 per row (1 for a zero row), A_q = clamp(round(x / s), -127, 127), bit for bit what
``quantize_per_token_reference``'s torch ops give on the CPU (the .cu header says why, and where torch's
own CUDA run of them differs). It replaces those ~10 torch ops: ~50 us of host time per eager call and
~10 small kernels per linear in a CUDA graph. Per call this module only allocates the two outputs and
writes the argument block of a launch kept per (device, dtype, K) and grid; the C++ per-call path of
QuantLinear "w8a8_channel" (:mod:`.channel_fast`) makes the same launch (:func:`launch_parameters`).
"""
from __future__ import annotations

import torch

from custom_kernels.device import on_device, sm_count
from custom_kernels.launch import I32, I64, KernelArgs, Ptr

from .launches import TAGS, GridLaunches, device_index, grid_launches

__all__ = ["SOURCE", "THREADS", "QuantTokenArgs", "quant_token_kernel", "quant_token_kernels", "warps_per_row",
           "quantize_per_token_gpu", "launch_parameters"]

SOURCE = "quant_token.cu"
THREADS = 256          # the kernel's kThreads: 8 warps per block
WARPS = THREADS // 32
LOADS_PER_THREAD = 4   # 16-byte loads per thread of a row, past which more warps (up to 8) share the row
BLOCKS_PER_SM = 8      # grid cap: 2048 resident threads per SM; larger M strides over row groups
MAX_PLANS = 256        # (device, dtype, K) entries kept
MAX_DIM = 2 ** 31 - 1  # M and K are int32 kernel arguments


class QuantTokenArgs(KernelArgs):
    _fields_ = [("x", Ptr), ("lda", I64), ("A_q", Ptr), ("s", Ptr), ("M", I32), ("K", I32),
                ("warps_per_row", I32)]


def quant_token_kernel(dtype: torch.dtype) -> tuple[str, str, dict[str, int]]:
    """(source, kernel, defines) quantizing ``dtype`` activations (float32, float16, bfloat16)."""
    return SOURCE, f"quant_token_{TAGS[dtype]}", {}


def quant_token_kernels(dtype: torch.dtype) -> tuple[tuple[str, str, dict[str, int]], ...]:
    """(source, kernel, defines) of every kernel :func:`quantize_per_token_gpu` loads for ``dtype``
    activations: one, the same for every M and K (K only sets its ``warps_per_row`` argument)."""
    return (quant_token_kernel(dtype),)


def warps_per_row(K: int, itemsize: int) -> int:
    """Warps sharing one row of K elements of ``itemsize`` bytes: the fewest of 1, 2, 4, 8 that give each
    thread at most LOADS_PER_THREAD 16-byte loads (8 for longer rows)."""
    loads = -(-K * itemsize // 16)
    w = 1
    while w < WARPS and 32 * w * LOADS_PER_THREAD < loads:
        w *= 2
    return w


# (device, dtype, K) -> (launches, rows per block, warps per row, grid cap)
_plans: dict[tuple[int, torch.dtype, int], tuple[GridLaunches, int, int, int]] = {}


def _plan(device: int, dtype: torch.dtype, K: int) -> tuple[GridLaunches, int, int, int]:
    source, name, defines = quant_token_kernel(dtype)
    launches = grid_launches(source, name, QuantTokenArgs, THREADS, device, tuple(sorted(defines.items())))
    w = warps_per_row(K, dtype.itemsize)
    plan = (launches, WARPS // w, w, BLOCKS_PER_SM * sm_count(device))
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[(device, dtype, K)] = plan
    return plan


def launch_parameters(device: int, dtype: torch.dtype, K: int) -> tuple[int, int, int, int, int]:
    """(CUfunction address, threads, rows per block, warps per row, grid cap) of the launch that
    :func:`quantize_per_token_gpu` makes for rows of K ``dtype`` elements on ``device`` (loaded first if
    needed): what the C++ per-call path of the per-channel linear (:mod:`.channel_fast`) launches with."""
    launches, rows_per_block, w, cap = _plans.get((device, dtype, K)) or _plan(device, dtype, K)
    return int(launches.kernel.function(device)), THREADS, rows_per_block, w, cap


def _refuse(x2d) -> None:
    if not isinstance(x2d, torch.Tensor) or x2d.dtype not in TAGS:
        raise TypeError(f"x2d must be a float32, float16 or bfloat16 tensor, got "
                        f"{getattr(x2d, 'dtype', type(x2d).__name__)}")
    if not x2d.is_cuda:
        raise ValueError(f"x2d must be a CUDA tensor, got device {x2d.device}")
    raise ValueError(f"x2d must be 2-D [M, K] with 1 <= K and M, K <= {MAX_DIM}, got shape {tuple(x2d.shape)}")


def quantize_per_token_gpu(x2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_q int8 [M, K], s float32 [M, 1]) of the CUDA activations x2d [M, K] (float32 / float16 / bfloat16,
    K >= 1; rows may be strided, a strided last dimension is copied first): one launch on torch's current
    stream, no synchronisation. Bit-exact with ``torch_ops.quantize_per_token_reference`` run on the CPU."""
    if not isinstance(x2d, torch.Tensor) or not x2d.is_cuda or x2d.dtype not in TAGS or x2d.dim() != 2 \
            or not 1 <= x2d.shape[1] <= MAX_DIM or x2d.shape[0] > MAX_DIM:
        _refuse(x2d)
    M, K = x2d.shape
    if K > 1 and x2d.stride(1) != 1:
        x2d = x2d.contiguous()
    dev = x2d.device
    A_q = torch.empty((M, K), dtype=torch.int8, device=dev)
    s = torch.empty((M, 1), dtype=torch.float32, device=dev)
    if M:
        device = device_index(x2d)
        launches, rows_per_block, w, cap = _plans.get((device, x2d.dtype, K)) or _plan(device, x2d.dtype, K)
        with on_device(device):
            launches(min(-(-M // rows_per_block), cap), x=x2d.data_ptr(), lda=x2d.stride(0), A_q=A_q.data_ptr(),
                     s=s.data_ptr(), M=M, K=K, warps_per_row=w)
    return A_q, s
