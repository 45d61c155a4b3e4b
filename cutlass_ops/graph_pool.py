"""Data meant to outlive a call, built outside a CUDA-graph warm-up's memory pool.

``torch.compile(mode="reduce-overhead")`` runs each compiled graph's first call as a warm-up: cudagraph trees route
every allocation of the calling thread into the graph's private pool (``_use_cuda_memory_pool_manager``:
``_cuda_beginAllocateCurrentThreadToPool``) and, when the warm-up ends, refuse live tensors of that pool that are
not the graph's outputs ("tensors in the cudagraph pool not tracked as outputs"). The runtime builds its per-weight
data on a layer's first call (packed scale/offset words, plans, padded copies, float32 bias copies, a CUTLASS
kernel's workspace), and keeps it: built there, it would fail that check, which is why a model needed one eager call
(or :func:`cutlass_ops.warmup`) before such a compile.

:func:`outside_graph_pool` runs the build on a helper thread instead, whose allocations go to the ordinary pool:
on a side stream that first waits for the caller's stream (an event), and the caller's stream then waits for the
side stream (another event), so the data is ordered exactly as if built in place and the caller never blocks on
the GPU. Only during a warm-up of cudagraph trees; everywhere else (eager calls, CUDA-graph capture, no compile)
the build runs in place, as before.
"""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

__all__ = ["in_graph_warmup", "outside_graph_pool"]

T = TypeVar("T")

_local = threading.local()  # .helper: this thread is the helper (nested builds run in place)
_executor: ThreadPoolExecutor | None = None
_side_streams: dict[int, torch.cuda.Stream] = {}
_lock = threading.Lock()


def in_graph_warmup(device: int) -> bool:
    """Whether this thread runs a cudagraph-trees warm-up on CUDA ``device`` now (its allocations routed into a
    graph pool). False on the helper thread and wherever torch._inductor's cudagraph trees were never imported."""
    if getattr(_local, "helper", False):
        return False
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:
        return False
    try:  # this thread's tree managers, read without creating any (get_manager would add a container)
        if not (hasattr(trees.local, "tree_manager_containers")
                or torch._C._is_key_in_tls("tree_manager_containers")):
            return False
        container = trees.get_obj(trees.local, "tree_manager_containers").get(device)
        manager = None if container is None else container.tree_manager
        return manager is not None and bool(manager.in_warmup)
    except Exception:  # noqa: BLE001 - a torch whose private cudagraph-trees API differs: behave as before
        return False


def _helper() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cutlass_ops-build")
        return _executor


def _side_stream(device: int) -> torch.cuda.Stream:
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream(device)
    return stream


def outside_graph_pool(build: Callable[[], T], device: int | torch.device | None) -> T:
    """``build()``, run on the helper thread when the caller is in a cudagraph-trees warm-up on CUDA ``device``
    (None or a CPU device: in place). Exceptions propagate to the caller."""
    if device is None:
        return build()
    if isinstance(device, torch.device):
        if device.type != "cuda":
            return build()
        device = torch.cuda.current_device() if device.index is None else device.index
    if not in_graph_warmup(device):
        return build()
    caller = torch.cuda.current_stream(device)
    ready = torch.cuda.Event()
    ready.record(caller)

    def work():
        _local.helper = True
        with torch.cuda.device(device):
            side = _side_stream(device)
            side.wait_event(ready)  # everything the caller queued (the weight's tensors) comes first
            with torch.cuda.stream(side):
                built = build()
            done = torch.cuda.Event()
            done.record(side)
        return built, done

    built, done = _helper().submit(work).result()
    caller.wait_event(done)
    return built
