"""Launch attributes (no GPU needed): what a LaunchShape hands cuLaunchKernelEx, and which CUTLASS
kernels are built for programmatic dependent launch."""
from __future__ import annotations

from pathlib import Path

import pytest
from cuda.bindings import driver

from custom_kernels.launch import LaunchConfig, LaunchShape, pdl_enabled
from cutlass_ops.cutlass import build as gemm_build
from cutlass_ops.cutlass.spec import GemmKernelSpec

CLUSTER = int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
PDL = int(driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)


@pytest.mark.parametrize("cluster,pdl,expected", [
    ((1, 1, 1), False, []),
    ((1, 2, 1), False, [(CLUSTER, (1, 2, 1))]),
    ((1, 1, 1), True, [(PDL, (1, 0, 0))]),
    ((2, 1, 1), True, [(CLUSTER, (2, 1, 1)), (PDL, (1, 0, 0))]),
])
def test_launch_attributes_match_the_driver_ids(monkeypatch, cluster, pdl, expected):
    from custom_kernels import launch

    monkeypatch.setattr(launch, "cu_launch_kernel_ex", lambda: None)  # no libcuda here: nothing is launched

    class _Kernel:  # a stand-in CUfunction: building a LaunchShape loads nothing else
        name = "k"

        def function(self, device):
            return 0x1234

    config = LaunchConfig.of(8, 384, 1 << 16, cluster, pdl)
    shape = LaunchShape(_Kernel(), config, device=0)
    assert shape.attributes == expected
    assert (shape.grid, shape.block, shape.smem, shape.cluster, shape.pdl) == ((8, 1, 1), (384, 1, 1), 1 << 16,
                                                                               cluster, pdl)


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
    assert bool(spec.device_flags) is gdc
