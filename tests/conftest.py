"""Shared pytest configuration: GPU tests skip cleanly on machines without a CUDA device."""
from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Keep test builds out of the user's cache unless CUTLASS_OPS_CACHE_DIR is set explicitly."""
    if "CUTLASS_OPS_CACHE_DIR" not in os.environ:
        os.environ["CUTLASS_OPS_CACHE_DIR"] = str(tmp_path_factory.mktemp("cutlass_ops_cache"))
    yield


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="session")
def conv_emulator(tmp_path_factory):
    """sanitizer -> tests/host_emu/run_conv.cpp built under it, once per session for every module that runs a
    conv kernel on the CPU (tests/_host_emu.py)."""
    from _host_emu import HarnessBuilds  # imported here: only the host-emulation tests need the conv modules

    return HarnessBuilds(tmp_path_factory)
