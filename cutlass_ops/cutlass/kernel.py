"""A built CUTLASS GEMM loaded and launched: no ``plan.run``, no interface import, no synchronisation.

Per problem shape, once: fill the kernel's ``Arguments`` struct from the layout recorded at build
time and call the host library's ``<kernel>_cutlass_ops_params`` for the ``Params`` bytes, grid
and block. Per call: put the tensor pointers into ``Params`` and launch it through a
:class:`custom_kernels.launch.LaunchShape` (``params_address`` gives its kernelParams) on torch's
current stream (CUDA-graph capturable:
no synchronisation, no device allocation; the first call of a shape may allocate a workspace, so
warm up before capture).

CUTLASS 2.x kernels (Sm75, Sm80) keep raw pointers in ``Params``: their byte offsets are found by
building ``Params`` with three sets of sentinel pointers (differing in low and high bits), trusted
only if patching one build with another's sentinels reproduces it byte for byte, and again on the
first real call (patched == freshly built); later calls just overwrite those 8-byte words.
Sm90 kernels hold A, B and D inside TMA descriptors, which CUDA documents as opaque and which on
an H200 changed beyond the verbatim address when the address changed: their ``Params`` are rebuilt
by the host library for each new set of pointers (a few microseconds), and the last few pointer
sets of each shape are kept (``_REBUILT_KEPT``), so calls that reuse buffers skip the rebuild.
"""
from __future__ import annotations

import ctypes
import logging
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from custom_kernels.cuda_paths import cuda_home
from custom_kernels.device import current_device, raw_stream, sm_count
from custom_kernels.launch import LaunchConfig, LaunchShape, Module, params_address, pdl_enabled

from cutlass_ops.graph_pool import outside_graph_pool

from .arguments import ArgumentLayout
from .build import GemmArtifact

log = logging.getLogger(__name__)

__all__ = ["GemmKernel"]

# Sentinel pointer sets: 16-byte aligned like real buffers, 1 MiB apart per slot, and differing
# from each other in low bits as well as high bits (a field derived from the address's alignment
# or its high bits would show up as a mismatch).
_SENTINEL_BASES = (0x5A5A_0000_0000, 0x6B6B_0123_4560, 0x3C3C_0FED_CBA0)
_SENTINEL_STEP = 0x10_0000
# Params kept per shape for kernels that rebuild them (keyed by pointers): the static buffers of a
# CUDA graph or a serving loop reuse a few pointer sets; fresh activations miss anyway.
# A model's layers of one shape each bring their own weight pointer, so 64 per shape; 2048 per kernel
# over all its shapes bounds the memory (the C++ side, host/int8_gemm_launch.cpp, keeps the same bounds).
_REBUILT_KEPT = 64
_REBUILT_TOTAL = 2048
# Problem shapes (M, N, K, pointer pattern, scalars, device) kept per kernel, oldest out first: a
# server that sees every M keeps a bounded table (a dropped shape is prepared again on its next call).
# The soak (scripts/soak.py, H100) saw host memory still rising with 4096 shapes x 512 Params per shape,
# and 256 shapes thrashing (re-preparing) on its M in 1..2000.
_SHAPES_KEPT = 1024


def _load_host_library(path: Path) -> ctypes.CDLL:
    """dlopen a host library; its libcudart.so.13 is normally the one torch already loaded
    (a loaded library satisfies a dependency with the same soname)."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as first:
        if "libcudart" not in str(first):
            raise
    # Not resolved through torch (imported above) or the loader path: try the toolkit and wheels.
    candidates: list[Path] = []
    home = cuda_home()
    if home is not None:
        candidates += [home / "lib64", home / "lib"]
    try:
        import nvidia  # the CUDA runtime wheel torch depends on

        for root in nvidia.__path__:
            candidates += [Path(root) / "cu13" / "lib", Path(root) / "cuda_runtime" / "lib"]
    except ImportError:
        pass
    for directory in candidates:
        for lib in sorted(directory.glob("libcudart.so.13*")):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(str(path))
    return ctypes.CDLL(str(path))  # raises the loader's error


@dataclass
class _ShapeState:
    """Launch state of one (problem, pointer pattern, scalars, device)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: Any  # ctypes char array: the Params last launched (patched in place)
    words: list[tuple[int, int]] | None  # (8-byte word index in Params, pointer slot); None: rebuild
    args: bytearray  # Arguments of this shape (pointer fields rewritten before a rebuild)
    arg_pointers: list[tuple[int, int]]  # (byte offset in Arguments, pointer slot)
    workspace: int  # device workspace baked into Params (0: none)
    verified: bool = False  # patched == fresh for real pointers (checked on the first call)
    rebuilt: dict = field(default_factory=dict)  # pointers tuple -> Params, for rebuilding kernels
    shape: Any = None  # LaunchShape (grid, block, smem, cluster) for this state, built on first launch
    view: Any = None  # params as 8-byte words (a memoryview), made on the first patch
    params_address: int = 0  # kernelParams for ``params``; set once the state is patched and verified
    params_keep: Any = None  # the void*[1] behind params_address (kept alive with the state)


def _patch(state: _ShapeState, pointers: Sequence[int]) -> None:
    """Write this call's pointers into the pointer words of the state's Params."""
    words = state.view
    for word, slot in state.words:
        words[word] = pointers[slot]


class GemmKernel:
    """A built kernel loaded on the GPU, launched through cached ``Params``."""

    def __init__(self, artifact: GemmArtifact):
        meta = artifact.meta
        self.artifact = artifact
        self.name: str = meta["kernel_name"]
        self.api: str = meta["api"]
        self.smem = int(meta["smem_bytes"])
        self.param_size = int(meta["param_size"])
        self.cluster = tuple(meta["cluster"])
        # Built with griddepcontrol (Sm90): launched with programmatic dependent launch unless
        # CUTLASS_OPS_PDL=0. A kernel without it must never be: it would read before the previous grid ends.
        self.pdl = bool(meta.get("grid_dependency_control")) and pdl_enabled()
        self.pointer_names: tuple[str, ...] = tuple(meta["pointers"])
        self.scalar_names: tuple[str, ...] = tuple(meta["scalars"])
        self.layout = ArgumentLayout(meta["arguments"])
        self.module = Module(artifact.cubin_path.read_bytes(), name=self.name)
        self.kernel = self.module.kernel(self.name)  # a custom_kernels.launch.Kernel
        self.kernel.set_max_dynamic_smem(self.smem)
        lib = _load_host_library(artifact.host_path)
        self._make_params = getattr(lib, f"{self.name}_cutlass_ops_params")
        self._make_params.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._make_params.restype = ctypes.c_int
        self._workspace_size = getattr(lib, f"{self.name}_cutlass_ops_workspace_size")
        self._workspace_size.argtypes = [ctypes.c_void_p]
        self._workspace_size.restype = ctypes.c_ulonglong
        self._host_library = lib
        self._slot = {name: i for i, name in enumerate(self.pointer_names)}
        self._states: dict[tuple, _ShapeState] = {}
        self._rebuilt_total = 0  # Params in the shapes' ``rebuilt`` tables (bounded by _REBUILT_TOTAL)
        self._workspaces: dict[int, Any] = {}  # device -> torch uint8 tensor, allocated once, grown rarely
        self._lock = threading.Lock()
        self._sm_counts: dict[int, int] = {}  # device -> SM count (overridable without a GPU, for tests)

    # -- building Params ----------------------------------------------------------------------

    def fresh_params(self, M: int, N: int, K: int, pointers: Sequence[int], scalars: Sequence[float] = (),
                     device: int | None = None) -> tuple[bytes, tuple[int, int, int], tuple[int, int, int]]:
        """Params built from scratch for these pointers (what a patched Params must equal)."""
        device = current_device() if device is None else device
        args = self._arguments(M, N, K, pointers, scalars, device)
        params, grid, block = self._build(args, M, N, K, self._workspace_pointer(args, device))
        return bytes(params), grid, block

    def _arguments(self, M, N, K, pointers, scalars, device) -> bytearray:
        sms = self._sm_counts.get(device)
        if sms is None:
            sms = self._sm_counts[device] = sm_count(device)
        return self.layout.fill(M, N, K, dict(zip(self.pointer_names, pointers)),
                                dict(zip(self.scalar_names, scalars)), sm_count=sms, device_id=device)

    def _build(self, args: bytearray, M: int, N: int, K: int, workspace: int):
        """(Params as a ctypes array, grid, block) from Arguments bytes, by the host library."""
        args_view = (ctypes.c_char * len(args)).from_buffer(args)
        params = (ctypes.c_char * self.param_size)()
        launch = (ctypes.c_int * 6)()
        if self._make_params(ctypes.addressof(args_view), workspace or None, ctypes.addressof(params), launch):
            raise ValueError(f"CUTLASS kernel {self.name} cannot run M={M}, N={N}, K={K} "
                             f"(can_implement failed: check K and N against the kernel's alignment)")
        return params, (launch[0], launch[1], launch[2]), (launch[3], launch[4], launch[5])

    def _workspace_pointer(self, args: bytearray, device: int) -> int:
        args_view = (ctypes.c_char * len(args)).from_buffer(args)
        size = int(self._workspace_size(ctypes.addressof(args_view)))
        if size == 0:
            return 0
        ws = self._workspaces.get(device)
        if ws is None or ws.numel() < size:
            # Zeroed once like the interface's plan.run; a larger problem reallocates, and every
            # cached Params holding the old pointer is dropped.
            ws = outside_graph_pool(lambda: torch.zeros(size, dtype=torch.uint8, device=f"cuda:{device}"), device)
            self._workspaces[device] = ws
            self._states = {k: v for k, v in self._states.items() if k[-1] != device}
            self._rebuilt_total = sum(len(v.rebuilt) for v in self._states.values())
        return ws.data_ptr()

    @staticmethod
    def _patched(params, patch: list[tuple[int, int]], pointers: Sequence[int]) -> bytes:
        buf = bytearray(params)
        for offset, slot in patch:
            struct.pack_into("<Q", buf, offset, pointers[slot])
        return bytes(buf)

    def _pointer_offsets(self, M, N, K, nonnull, scalars, device, workspace) -> tuple[list | None, str]:
        """Byte offsets of each pointer in Params, if overwriting them reproduces fresh Params."""
        if self.api == "3x":
            return None, "Sm90 Params hold the pointers in TMA descriptors (opaque)"
        builds = []
        for base in _SENTINEL_BASES:
            sentinels = [base + (i + 1) * _SENTINEL_STEP if nonnull[i] else 0 for i in range(len(nonnull))]
            args = self._arguments(M, N, K, sentinels, scalars, device)
            builds.append((sentinels, bytes(self._build(args, M, N, K, workspace)[0])))
        (first, raw), others = builds[0], builds[1:]
        patch = []
        for slot, value in enumerate(first):
            if value:
                hits = [i for i in range(0, len(raw) - 7) if raw[i:i + 8] == struct.pack("<Q", value)]
                if not hits:
                    return None, f"pointer {self.pointer_names[slot]} is not stored verbatim in Params"
                patch += [(offset, slot) for offset in hits]
        if any(self._patched(raw, patch, sentinels) != expected for sentinels, expected in others):
            return None, "Params depend on pointer values beyond their verbatim copies"
        if any(offset % 8 for offset, _ in patch):
            return None, "a pointer copy in Params is not 8-byte aligned"
        return patch, ""

    def _prepare(self, M: int, N: int, K: int, nonnull: Sequence[bool], scalars: Sequence[float],
                 device: int) -> _ShapeState:
        placeholder = [1 << 20 if flag else 0 for flag in nonnull]  # any aligned non-null value
        args = self._arguments(M, N, K, placeholder, scalars, device)
        workspace = self._workspace_pointer(args, device)
        params, grid, block = self._build(args, M, N, K, workspace)
        patch, reason = self._pointer_offsets(M, N, K, nonnull, scalars, device, workspace)
        arg_pointers = [(offset, self._slot[name]) for offset, name in self.layout.pointers]
        words = None if patch is None else [(offset // 8, slot) for offset, slot in patch]
        if patch is None:
            log.info("%s (M=%d, N=%d, K=%d): %s; Params are rebuilt for each new set of pointers",
                     self.name, M, N, K, reason)
        return _ShapeState(grid, block, params, words, args, arg_pointers, workspace)

    # -- launch -------------------------------------------------------------------------------

    def launch(self, M: int, N: int, K: int, pointers: Sequence[int], scalars: Sequence[float] = (),
               stream: int | None = None, device: int | None = None, nonnull: int | None = None) -> None:
        """Run the GEMM on ``stream`` (default: torch's current stream on ``device``, default the
        current device). ``pointers`` follow ``self.pointer_names``; 0 stands for an absent input.
        ``nonnull``: bit i set iff pointers[i] != 0, when the caller already knows it."""
        if device is None:
            device = current_device()
        if stream is None:
            stream = raw_stream(device)
        if nonnull is not None and scalars.__class__ is tuple:
            # The per-call path once a shape is prepared and verified: patch the pointer words, launch.
            state = self._states.get((M, N, K, nonnull, scalars, device))
            if state is not None and state.params_address:
                with self._lock:
                    _patch(state, pointers)
                    state.shape.launch(stream, state.params_address)
                return
        with self._lock:
            state, params = self._params_for(M, N, K, pointers, scalars, device, nonnull)
            shape = state.shape
            if shape is None:
                shape = state.shape = self.launch_shape(state.grid, state.block, device)
            keep, address = params_address(params)
            if params is state.params and state.words is not None and state.verified:
                state.params_keep, state.params_address = keep, address
            shape.launch(stream, address)

    def launch_shape(self, grid, block, device: int) -> LaunchShape:
        """This kernel's LaunchShape for ``grid`` x ``block`` on ``device`` (its smem, cluster and PDL)."""
        config = LaunchConfig.of(grid, block, self.smem, self.cluster, self.pdl)
        return LaunchShape(self.kernel, config, device)

    def prepared_state(self, M: int, N: int, K: int, nonnull: int, scalars: tuple, device: int) -> _ShapeState | None:
        """The launch state a call of this shape and pointer pattern prepared, or None."""
        return self._states.get((M, N, K, nonnull, scalars, device))

    def launch_state(self, M: int, N: int, K: int, pointers: Sequence[int], scalars: Sequence[float] = (),
                     device: int | None = None) -> tuple[bytes, tuple[int, int, int], tuple[int, int, int], bool]:
        """(Params, grid, block, patched) that :meth:`launch` would use now, without launching.

        ``patched``: the Params came from overwriting pointer words of cached Params (False: built
        by the host library for these pointers)."""
        device = current_device() if device is None else device
        with self._lock:
            state, params = self._params_for(M, N, K, pointers, scalars, device)
            return bytes(params), state.grid, state.block, state.words is not None

    def _params_for(self, M: int, N: int, K: int, pointers: Sequence[int], scalars: Sequence[float],
                    device: int, nonnull: int | None = None) -> tuple[_ShapeState, Any]:
        if nonnull is None:
            nonnull = sum(1 << i for i, p in enumerate(pointers) if p)
        if scalars.__class__ is not tuple:
            scalars = tuple(scalars)
        key = (M, N, K, nonnull, scalars, device)
        state = self._states.get(key)
        if state is None:
            flags = tuple(bool(nonnull >> i & 1) for i in range(len(pointers)))
            state = self._states[key] = self._prepare(M, N, K, flags, scalars, device)
            if len(self._states) > _SHAPES_KEPT:
                self._rebuilt_total -= len(self._states.pop(next(iter(self._states))).rebuilt)  # the oldest
        if state.words is None:
            return state, self._rebuilt(state, M, N, K, pointers)
        if state.view is None:
            state.view = memoryview(state.params).cast("B").cast("Q")
        _patch(state, pointers)
        if not state.verified and not self._verify(state, M, N, K, pointers, scalars, device):
            return state, self._rebuilt(state, M, N, K, pointers)
        return state, state.params

    def _rebuilt(self, state: _ShapeState, M: int, N: int, K: int, pointers: Sequence[int]):
        key = tuple(pointers)
        params = state.rebuilt.get(key)
        if params is None:
            args = state.args
            for offset, slot in state.arg_pointers:
                struct.pack_into("<Q", args, offset, pointers[slot])
            params = self._build(args, M, N, K, state.workspace)[0]
            if self._rebuilt_total >= _REBUILT_TOTAL:  # the kernel's bound: start over for every shape
                for other in self._states.values():
                    other.rebuilt.clear()
                self._rebuilt_total = 0
            if len(state.rebuilt) >= _REBUILT_KEPT:
                del state.rebuilt[next(iter(state.rebuilt))]  # the oldest
                self._rebuilt_total -= 1
            state.rebuilt[key] = params
            self._rebuilt_total += 1
        return params

    def _verify(self, state: _ShapeState, M, N, K, pointers, scalars, device) -> bool:
        """Check patched == fresh for the first real pointers; on a mismatch switch to rebuilding."""
        fresh, grid, block = self.fresh_params(M, N, K, pointers, scalars, device)
        state.verified = True
        if fresh == bytes(state.params) and grid == state.grid and block == state.block:
            return True
        log.warning("%s (M=%d, N=%d, K=%d): patched Params differ from fresh ones; rebuilding instead",
                    self.name, M, N, K)
        state.words = None
        state.grid, state.block = grid, block
        state.shape = None
        return False
