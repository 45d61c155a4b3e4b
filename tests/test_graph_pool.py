"""CPU tests of cutlass_ops.graph_pool: outside a cudagraph-trees warm-up every build runs in place, on the caller's
thread (the GPU test of the warm-up itself: tests/gpu/test_torch_integration_gpu.py,
test_compile_reduce_overhead_without_an_eager_call)."""
from __future__ import annotations

import threading

import pytest
import torch

from cutlass_ops import graph_pool


def _where():
    return threading.get_ident()


@pytest.mark.parametrize("device", [None, torch.device("cpu"), "cpu-tensor"])
def test_builds_in_place_off_cuda(device):
    if device == "cpu-tensor":
        device = torch.zeros(1).device
    assert graph_pool.outside_graph_pool(_where, device) == threading.get_ident()


def test_no_warmup_without_cudagraph_trees_or_a_manager():
    """No compiled model ran: cudagraph trees have no manager on this thread, so CUDA builds also run in place."""
    assert graph_pool.in_graph_warmup(0) is False


def test_exceptions_propagate():
    def fail():
        raise ValueError("bad build")
    with pytest.raises(ValueError, match="bad build"):
        graph_pool.outside_graph_pool(fail, None)
