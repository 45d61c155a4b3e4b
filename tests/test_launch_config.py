"""Launch attributes (no GPU needed): what ExLaunch hands cuLaunchKernelEx, and which CUTLASS
kernels are built for programmatic dependent launch."""
from __future__ import annotations

from pathlib import Path

import pytest
from cuda.bindings import driver

from custom_kernels.launch_config import ExLaunch, pdl_enabled
from cutlass_ops import gemm_build
from cutlass_ops.gemm_build import GemmKernelSpec

CLUSTER = int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
PDL = int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)


@pytest.mark.parametrize("cluster,pdl,expected", [
    ((1, 1, 1), False, []),
    ((1, 2, 1), False, [(CLUSTER, (1, 2, 1))]),
    ((1, 1, 1), True, [(PDL, (1, 0, 0))]),
    ((2, 1, 1), True, [(CLUSTER, (2, 1, 1)), (PDL, (1, 0, 0))]),
])
def test_launch_attributes_match_the_driver_ids(cluster, pdl, expected):
    launch = ExLaunch(0x1234, (8, 1, 1), (384, 1, 1), 1 << 16, cluster, pdl)
    assert launch.attributes == expected


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_pdl_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("CUTLASS_OPS_PDL", raising=False)
    else:
        monkeypatch.setenv("CUTLASS_OPS_PDL", value)
    assert pdl_enabled() is enabled


@pytest.mark.parametrize("kernel_cc,target,gdc", [(90, "90a", True), (80, "90", False), (75, "75", False)])
def test_only_sm90_kernels_are_built_with_grid_dependency_control(kernel_cc, target, gdc):
    spec = GemmKernelSpec(kernel_cc, target, "dequant", "f16", (64, 64, 128) if kernel_cc == 90 else (64, 128, 64),
                          kernel_schedule="TmaWarpSpecializedPingpong" if kernel_cc == 90 else None,
                          epilogue_schedule="TmaWarpSpecialized" if kernel_cc == 90 else None)
    device_cmd, host_cmd = gemm_build._commands(spec, Path("/nonexistent"))
    assert ("-DCUTLASS_ENABLE_GDC_FOR_SM90" in device_cmd) is gdc
    assert "-DCUTLASS_ENABLE_GDC_FOR_SM90" not in host_cmd
    assert ("-DCUTLASS_ENABLE_GDC_FOR_SM90" in gemm_build._flags_text(spec)) is gdc
