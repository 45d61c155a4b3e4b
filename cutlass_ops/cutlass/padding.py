"""Any K (and, on Sm75, any N) for the int8 GEMM plans: the same kernel on zero-padded operands.

Every kernel reads int8 rows of A and B 16 elements at a time (K % 16 == 0, :data:`.tuning.ALIGNMENT_K`),
and the tuned kernels store D 16 bytes at a time (N % alignment_D == 0, in elements of D). An N that
misses its alignment runs on the plan's any-N kernel (:func:`.tuning.any_n_spec`: D stored one element
at a time, so nothing is padded along N) on every GPU with Sm80 kernels; what is left to this module:

- K % 16 != 0, any N: A copied per call (one kernel), B padded along K (kept, see below), D written in place;
- on Sm75 plans (no any-N kernels: Turing, or ``arch=75``) an unaligned N as well.

The padded problem is

    A_pad [M, K_pad] = [A | 0]        K_pad: K rounded up to 16, or to 128   per call (when K_pad != K)
    B_pad [N_pad, K_pad] = [[B | 0]; 0] N_pad = round_up(N, alignment_D)    memoized per B tensor
    per_col inputs -> [N_pad] (zeros after N)                               memoized per tensor
    matrix inputs [M, N] -> [M, N_pad] (zero columns)                       per call
    per_row inputs and scalars                                              as they are

and D = D_pad[:, :N] (N_pad = N on the any-N kernels: D_pad is D; else one ``unpad_rows`` launch,
custom_kernels/kernels/unpad_rows.cu, the GEMM's programmatic dependent on sm_90). K_pad is a multiple of 128
where that adds at most K / 32 columns (:func:`padded_K`): the Sm90 kernels' TMA boxes are 128 bytes of a row,
and rows that start off a 128-byte boundary ran slower (H200, M = 64, N = 1024: K = 4112 13.0 us, 4224 8.5, 4096
8.3). A_pad is made by one ``pad_rows_i8`` launch on CUDA tensors (custom_kernels/kernels/pad_rows.cu; on sm_90
a programmatic dependent of the kernel before it, releasing the GEMM after it), F.pad elsewhere. Zero columns
along K add 0 to each int32 accumulator, so D is exactly the unpadded D; the N_pad - N extra columns of D_pad are computed and
dropped. B and the per-column inputs are weight-side constants, so their padded copies are kept
(:class:`~cutlass_ops.plan_cache.TensorMemo`: by tensor identity and in-place version, dropped with the
tensor): a repeated call with the same weight copies only A. While a CUDA graph is captured nothing is
memoized: the copies become part of the graph, so a replay reads B's current values as the unpadded
path does.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

from custom_kernels.device import capability, sm_count
from custom_kernels.launch import I32, I64, KernelArgs, Launch, LaunchConfig, Ptr, load_kernel, pdl_enabled

from cutlass_ops.graph_pool import outside_graph_pool
from cutlass_ops.plan_cache import TensorMemo

from .tuning import ALIGNMENT_K

__all__ = ["KEPT", "PAD_ROWS_KERNEL", "UNPAD_ROWS_KERNEL", "round_up", "padded_K", "padded_sizes", "needs_padding",
           "pad_columns", "pad_rows", "unpad_rows", "unpad_load_bytes", "unpad_registration", "pad_weight",
           "pad_per_col", "pad_operands"]

ROW_BYTES_TMA = 128  # bytes of a row in one TMA box of the Sm90 kernels

KEPT = 4096  # weight-side tensors whose padded copies are kept (B matrices and per-column vectors)
_padded = TensorMemo(KEPT)  # tensor -> {(rows, cols): its zero-padded copy}


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def padded_K(K: int) -> int:
    """K itself when it is a multiple of 16 (int8 elements per 16-byte load of A and B); else K rounded up to
    128 (one TMA box row) where that adds at most K / 32 zero columns, else to 16."""
    if not K % ALIGNMENT_K:
        return K
    K_box = round_up(K, ROW_BYTES_TMA)
    return K_box if K_box - K <= K // 32 else round_up(K, ALIGNMENT_K)


def padded_sizes(N: int, K: int, align_D: int) -> tuple[int, int]:
    """(N_pad, K_pad): the sizes the kernels take, N_pad a multiple of ``align_D`` (elements of D per 16-byte
    store), K_pad = :func:`padded_K`."""
    return round_up(N, align_D), padded_K(K)


def needs_padding(N: int, K: int, align_D: int) -> bool:
    return bool(K % ALIGNMENT_K or N % align_D)


def pad_columns(t: torch.Tensor, cols: int) -> torch.Tensor:
    """``t`` [rows, c] with zero columns up to ``cols``, a fresh contiguous tensor (``t`` itself when
    c == cols). Per call: A and matrix-kind epilogue inputs change every call."""
    extra = cols - t.shape[1]
    return F.pad(t, (0, extra)) if extra else t


PAD_ROWS_KERNEL = ("pad_rows.cu", "pad_rows_i8", {})  # (source, kernel, defines) of A's zero-padding


class PadRowsArgs(KernelArgs):
    _fields_ = [("X", Ptr), ("Y", Ptr), ("M", I32), ("K", I32), ("K_pad", I32)]


_launches: dict[tuple, Launch] = {}  # (kernel, device, blocks, defines) -> its launch


def _launch(source: str, name: str, defines: dict, args: type[KernelArgs], device: int, blocks: int) -> Launch:
    """The launch of one of this module's copy kernels: ``blocks`` x 256 threads, as a programmatic dependent
    on sm_90+ (they wait for the grid before them, then release the next: ``pdl.cuh``)."""
    key = (name, device, blocks, tuple(sorted(defines.items())))
    launch = _launches.get(key)
    if launch is None:
        kernel = load_kernel(source, name, defines, device=device)
        pdl = capability(device) >= 90 and pdl_enabled()
        launch = _launches[key] = Launch(kernel, LaunchConfig.of(blocks, 256, pdl=pdl), args(), device)
    return launch


def _blocks(vectors: int, device: int) -> int:
    """Blocks of 256 threads for one 16-byte vector per thread and trip, at most 4 per SM."""
    return max(1, min(-(-vectors // 256), 4 * sm_count(device)))


def pad_rows(A: torch.Tensor, K_pad: int) -> torch.Tensor:
    """int8 ``A`` [M, K] with zero columns up to K_pad (a multiple of 16), a fresh contiguous
    tensor (``A`` itself when K == K_pad): one ``pad_rows_i8`` launch on the current stream for a CUDA tensor."""
    M, K = A.shape
    if K == K_pad:
        return A
    if not A.is_cuda or not M:
        return F.pad(A, (0, K_pad - K))
    if A.dtype != torch.int8:
        raise TypeError(f"pad_rows takes int8 rows, got {A.dtype}")
    A = A.contiguous()  # the kernel reads rows of K bytes back to back
    device = A.get_device()
    launch = _launch(*PAD_ROWS_KERNEL, PadRowsArgs, device, _blocks(M * K_pad // 16, device))
    Y = torch.empty(M, K_pad, dtype=torch.int8, device=A.device)
    launch(X=A.data_ptr(), Y=Y.data_ptr(), M=M, K=K, K_pad=K_pad)
    return Y


UNPAD_ROWS_KERNEL = ("unpad_rows.cu", "unpad_rows")  # (source, kernel) of D = D_pad[:, :N]; defines: LOAD_BYTES


class UnpadRowsArgs(KernelArgs):
    _fields_ = [("X", Ptr), ("Y", Ptr), ("total_bytes", I64), ("row_bytes", I32), ("src_pitch", I32)]


def _unpad_launch(device: int, load_bytes: int, blocks: int) -> Launch:
    return _launch(*UNPAD_ROWS_KERNEL, {"LOAD_BYTES": load_bytes}, UnpadRowsArgs, device, blocks)


def unpad_load_bytes(N: int, element_size: int) -> int:
    """unpad_rows' load width for rows of N elements: gcd(row bytes, 16)."""
    return math.gcd(N * element_size, 16)


def unpad_registration(device: int, N: int, element_size: int) -> tuple[int, int, int, int, bool]:
    """(device, load width, CUfunction, most blocks, PDL) of unpad_rows for rows of N elements: what the C++
    per-call path needs to launch it (it sizes the grid as :func:`unpad_rows` does)."""
    width = unpad_load_bytes(N, element_size)
    most = 4 * sm_count(device)
    shape = _unpad_launch(device, width, most).shape
    return device, width, int(shape.function), most, bool(shape.pdl)


def unpad_rows(D_pad: torch.Tensor, N: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``D_pad[:, :N]`` as a contiguous [M, N] (written into ``out`` when given, a contiguous tensor of D_pad's
    type): one ``unpad_rows`` launch for a CUDA D_pad of 16-byte aligned rows into a 16-byte aligned D, torch's
    strided copy otherwise. On sm_90+ the launch is the GEMM's programmatic dependent (the Sm90 GEMMs release
    theirs after their last mainloop), so it does not wait for the GEMM's end to be scheduled."""
    M, N_pad = D_pad.shape
    if N == N_pad:
        return D_pad if out is None else out.copy_(D_pad)
    if out is None and M == 1:
        return D_pad[:, :N]  # one row: contiguous as it is
    if out is None:
        out = torch.empty(M, N, dtype=D_pad.dtype, device=D_pad.device)
    size = D_pad.element_size()
    pitch = D_pad.stride(0) * size
    if not (D_pad.is_cuda and M and D_pad.stride(1) == 1 and not pitch % 16 and not D_pad.data_ptr() % 16
            and not out.data_ptr() % 16 and out.is_contiguous()):
        return out.copy_(D_pad[:, :N])
    row_bytes = N * size
    device = D_pad.get_device()
    total = M * row_bytes
    launch = _unpad_launch(device, unpad_load_bytes(N, size), _blocks(-(-total // 16), device))
    launch(X=D_pad.data_ptr(), Y=out.data_ptr(), total_bytes=total, row_bytes=row_bytes, src_pitch=pitch)
    return out


def _memoized(t: torch.Tensor, key: tuple[int, int], make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``make()``, kept for ``t`` at its current version under ``key`` (not during graph capture: a
    copy made there is filled only by the graph's replays)."""
    if t.is_cuda and torch.cuda.is_current_stream_capturing():
        return make()
    copies = _padded.get(t)
    if copies is None:
        copies = {}
        _padded.put(t, copies)
    found = copies.get(key)
    if found is None:
        found = copies[key] = outside_graph_pool(make, t.device)
    return found


def pad_weight(B: torch.Tensor, N_pad: int, K_pad: int) -> torch.Tensor:
    """B [N, K] with zero rows up to N_pad and zero columns up to K_pad (memoized per B and version)."""
    N, K = B.shape
    if (N, K) == (N_pad, K_pad):
        return B
    return _memoized(B, (N_pad, K_pad), lambda: F.pad(B, (0, K_pad - K, 0, N_pad - N)))


def pad_per_col(v: torch.Tensor, N_pad: int) -> torch.Tensor:
    """A per-column input ([N], [1, N] or [N, 1]) as a 1-D [N_pad] with zeros after N (memoized)."""
    N = v.numel()
    if N == N_pad:
        return v
    return _memoized(v, (1, N_pad), lambda: F.pad(v.reshape(-1), (0, N_pad - N)))


def pad_operands(A: torch.Tensor, B: torch.Tensor, inputs: dict[str, Any], kinds: tuple[tuple[str, str], ...],
                 N_pad: int, K_pad: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(A_pad, B_pad, inputs_pad) of the padded problem; ``kinds``: the epilogue's (name, kind) tensor
    inputs. Inputs that are absent, None or not the epilogue's pass through (the plan names them)."""
    padded = dict(inputs)
    if N_pad != B.shape[0]:
        for name, kind in kinds:
            value = inputs.get(name)
            if value is None or kind == "per_row":
                continue
            padded[name] = pad_per_col(value, N_pad) if kind == "per_col" else pad_columns(value, N_pad)
    return pad_rows(A, K_pad), pad_weight(B, N_pad, K_pad), padded
