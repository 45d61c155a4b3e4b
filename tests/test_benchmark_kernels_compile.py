"""The benchmark-only kernels in scripts/kernels build on a machine without a GPU (NVRTC)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from custom_kernels.nvrtc import compile_source

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = _load("probe_wgmma_overlap")


def _is_cubin(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("variant", sorted(probe.VARIANTS))
def test_wgmma_overlap_probe_compiles_for_hopper(variant):
    assert _is_cubin(probe.build(variant).data)


def test_wgmma_overlap_probe_rejects_an_unknown_promotion():
    with pytest.raises(Exception, match="PROMO must be"):
        compile_source(probe.SOURCE.read_text(), "90a", name="wgmma_overlap_bad.cu", defines={"MODE": 0, "PROMO": 4},
                       use_cache=False)


@pytest.mark.parametrize("unroll", (4, 8, 16))
def test_read_bandwidth_kernel_compiles(unroll):
    source = (SCRIPTS / "kernels" / "read_bandwidth.cu").read_text()
    assert _is_cubin(compile_source(source, "80", name="read_bandwidth.cu", defines={"UNROLL": unroll}).data)


mma_probe = _load("probe_mma_sync")


@pytest.mark.parametrize("arch", ("80", "90a"))
@pytest.mark.parametrize("chains", mma_probe.CHAINS)
def test_mma_sync_probe_compiles(arch, chains):
    assert _is_cubin(mma_probe.build(chains, arch).data)


l2_probe = _load("probe_l2_prefetch")


def test_l2_prefetch_probe_compiles_for_hopper():
    """Both prefetch kernels (the bulk one is sm_90+) are in the cubin."""
    data = l2_probe.build("90a").data
    assert _is_cubin(data) and b"prefetch_bulk" in data and b"prefetch_lines" in data
