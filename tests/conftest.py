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


STUB_SOURCE = os.path.join(os.path.dirname(__file__), "host_emu", "libcuda_stub.c")


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory):
    """tests/host_emu/libcuda_stub.c built against cuda.h: a stand-in for libcuda.so.1 in CPU tests (not a
    driver: it answers with values made from its arguments)."""
    import shutil
    import subprocess
    from pathlib import Path

    from custom_kernels.cuda_paths import cuda_include_dirs

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    headers = [d for d in cuda_include_dirs() if (Path(d) / "cuda.h").is_file()]
    if not headers:
        pytest.skip("needs the CUDA headers (cuda.h)")
    out = tmp_path_factory.mktemp("libcuda_stub") / "libcuda_stub.so"
    cmd = [cc, "-std=c11", "-shared", "-fPIC", "-O1", "-Wall", "-Werror", f"-I{headers[0]}", STUB_SOURCE, "-o",
           str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


@pytest.fixture
def stub(monkeypatch, stub_library):
    """custom_kernels.libcuda bound to the stub for one test; what the runtime caches per device is cleared
    before and after (a real GPU's answers must not mix with the stub's)."""
    from collections import OrderedDict

    from custom_kernels import device, libcuda
    from custom_kernels.device import check
    from cutlass_ops.w8a8 import tma

    monkeypatch.setattr(libcuda, "LIBRARY", str(stub_library))
    monkeypatch.setattr(libcuda, "_library", None)
    monkeypatch.setattr(libcuda, "_functions", {})
    monkeypatch.setattr(device, "_contexts", {})
    monkeypatch.setattr(tma, "_maps", OrderedDict())
    device.smem_limits.cache_clear()
    check(libcuda.cuCtxSetCurrent(0), "cuCtxSetCurrent")  # the stub's thread state: no context current
    yield
    device.smem_limits.cache_clear()
