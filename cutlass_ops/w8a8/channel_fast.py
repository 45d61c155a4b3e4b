"""The C++ per-call path of ``QuantLinear(mode="w8a8_channel")``: per-token quantization and the dequant
GEMM in one extension call (``run_channel`` in ``custom_kernels/host/int8_gemm_launch.cpp``).

The Python path (``torch_ops.linear_w8a8_channel_impl``) stays the reference: it quantizes x
(:mod:`.quant_token`: two allocations, one launch), takes the bias's float32 copy and runs the CUTLASS
GEMM plan of its M bucket (whose own C++ path registers the shape). After it ran, :func:`register` hands
the extension the quant_token launch of (device, x dtype, K) and that GEMM plan; from then on
:func:`run` does the same work in one C++ call: check, allocate A_q, s and D, launch quant_token, launch
the GEMM (and, for an N the bucket's kernel cannot store where Python ran it on padded copies, unpad_rows).
Whatever is not the plain case (a CPU or non-contiguous x, an input that wants a gradient, a wrong dtype,
size or device, K that needs the padded GEMM, a shape, padded copy or Sm90 pointer set Python has not
prepared) comes back as None before any launch, and the caller takes the Python path, which raises
the precise error or prepares what was missing. ``CUTLASS_OPS_HOST_EXT=0`` keeps the Python path.

Importing this module loads no GPU runtime: the extension is bound by the first :func:`register`.
"""
from __future__ import annotations

import torch

from cutlass_ops.plan_cache import float32_copy

__all__ = ["run", "register", "enabled"]

_path: "_ChannelPath | None" = None  # set by the first register()


class _ChannelPath:
    """The extension and the keys registered with it (so that :func:`register` costs a set lookup when
    nothing is new)."""

    def __init__(self, ext):
        from custom_kernels.device import current_device, raw_stream

        self.ext = ext
        self.current_device, self.raw_stream = current_device, raw_stream
        self.quant: set[tuple] = set()  # (device, dtype, K)
        self.gemm: set[tuple] = set()  # (device, dtype, act, plan id)

    def __call__(self, x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 act: int) -> torch.Tensor | None:
        device = x.get_device()
        if device != self.current_device():  # the launches run in the current context: Python switches it
            return None
        if bias is not None:
            bias = float32_copy(bias)  # kept per bias version; made inside a CUDA graph capture
        # an N the kernels' 16-byte stores miss (8 half / 4 float elements) may take Python's kept padded copies,
        # never into a captured graph (cutlass/plan.py any_n_for)
        padded = bool(qweight.shape[0] % 8) and not torch.cuda.is_current_stream_capturing()
        out = self.ext.run_channel(x, qweight, scale, bias, act, self.raw_stream(device), padded)
        if out.__class__ is tuple:
            out = self._failed(out, x, qweight, scale, bias, act, device, padded)
        return out

    def _failed(self, failure: tuple, x, qweight, scale, bias, act: int, device: int, padded: bool):
        """A launch failed: retried once after binding the device's context where none was current,
        otherwise CudaDriverError naming the kernel (nothing ran after a failed launch)."""
        from custom_kernels.device import check, retry_in_context

        which, err = failure
        out = retry_in_context(err, device, lambda: self.ext.run_channel(x, qweight, scale, bias, act,
                                                                         self.raw_stream(device), padded))
        if out.__class__ is tuple:
            which, err = out
        elif out.__class__ is not int:
            return out
        kernel = ("quant_token", "the dequant GEMM", "unpad_rows")[which]
        check((err,), f"cuLaunchKernelEx({kernel}) in QuantLinear w8a8_channel's C++ path")
        return None  # unreachable: check raised

    def register(self, device: int, dtype: torch.dtype, K: int, act: int, plan) -> None:
        if (device, dtype, K) not in self.quant:
            from .quant_token import launch_parameters

            self.ext.register_quant_token(device, torch.empty(0, dtype=dtype), K, *launch_parameters(device, dtype, K))
            self.quant.add((device, dtype, K))
        # the plan of M's bucket and, where the family has them, its plans for N it cannot store (any_n, the
        # narrow-tile any_n_narrow, the large bucket's wide-tile any_n_wide): the extension takes the one that
        # registered this shape
        for gemm in (plan, *(getattr(plan, name, None) for name in ("any_n", "any_n_narrow", "any_n_wide"))):
            fast = getattr(gemm, "_fast", None)  # the GEMM plan's own C++ path (False / None: none yet)
            if not fast:
                continue
            key = (device, dtype, act, fast.plan_id)
            if key not in self.gemm:
                if not self.ext.register_channel(device, torch.empty(0, dtype=dtype), act, fast.plan_id):
                    raise RuntimeError(f"GEMM plan {gemm.spec.name} does not take (scale_row, scale_col, bias): "
                                       f"it cannot be the per-channel linear's")
                self.gemm.add(key)


def enabled() -> bool:
    """Whether :func:`run` may take calls (something was registered and the extension is on)."""
    return _path is not None


def run(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
        act: int) -> torch.Tensor | None:
    """act((quantize_per_token(x) @ qweight^T) * s * scale + bias) as [..., N] in x's dtype, in one C++
    call, or None: the caller then runs ``torch_ops.linear_w8a8_channel_impl``. The operands as the
    module holds them: x [..., K] CUDA float16 / bfloat16 / float32, qweight int8 [N, K], scale float32
    [N, 1], bias None or [N] (any float dtype: its float32 copy is kept per version)."""
    path = _path
    return None if path is None else path(x, qweight, scale, bias, act)


def register(device: int, dtype: torch.dtype, K: int, act: int, plan) -> None:
    """After the Python path ran x of ``dtype`` with K columns on ``device`` through GEMM ``plan`` (an
    ``Int8Gemm`` with a dequant epilogue writing ``dtype``): let :func:`run` take such calls."""
    global _path
    path = _path
    if path is None:
        from custom_kernels import host_ext

        ext = host_ext.load()
        if ext is None:
            return
        path = _path = _ChannelPath(ext)
    path.register(device, dtype, K, act, plan)
