"""CUTLASS side on a machine without a GPU: the bridge, emission, argument layouts, nvcc builds.

The nvcc tests (marked slow, still in the default run) compile the three smallest plain kernels,
one per kernel generation (Sm75, Sm80, Sm90), and one Sm75 kernel with a fused (EVT) epilogue, in
parallel processes: about two minutes on 2 cores.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

import epilogues
import cutlass_ops
from cutlass_ops import cutlass as gemm_api
from cutlass_ops.cutlass import build as gemm_build
from cutlass_ops.cutlass import emit as gemm_emit
from cutlass_ops.cutlass.arguments import ArgumentLayout, argument_layout, interface_arguments
from cutlass_ops.cutlass.emit import CutlassBuildError, emit
from cutlass_ops.cutlass.kernel import GemmKernel, _load_host_library
from cutlass_ops.cutlass.spec import GemmKernelSpec
from cutlass_ops.cutlass.tuning import any_n_spec

REPO = Path(__file__).resolve().parents[1]
EVT_EPILOGUES = [name for name in epilogues.names() if epilogues.get(name).evt]
EXAMPLE = (gemm_emit.EXAMPLE_M, gemm_emit.EXAMPLE_N, gemm_emit.EXAMPLE_K)


def _spec(kernel_cc: int, epilogue: str = "none", element_D: str | None = None, bucket: str = "small"):
    target = {90: "90a", 80: "90", 75: "90"}[kernel_cc]
    element_D = element_D or epilogues.get(epilogue).default_output
    return gemm_api.kernel_spec(kernel_cc, target, epilogue, element_D, bucket)


# -- the bridge -------------------------------------------------------------------------------


def test_bridge_import_writes_nothing_to_cwd_and_restores_tempdir(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cache = tmp_path / "cache"
    probe = (
        "import os, tempfile\n"
        "tempfile.tempdir = os.path.abspath('..')\n"
        "before = tempfile.tempdir\n"
        "import cutlass_ops.cutlass.bridge as bridge\n"
        "m = bridge.cutlass()\n"
        "assert tempfile.tempdir == before, tempfile.tempdir\n"
        "assert os.getcwd() == os.path.abspath('.')\n"
        "assert os.path.isabs(m.CACHE_FILE) and m.CACHE_FILE.startswith(os.environ['CUTLASS_OPS_CACHE_DIR'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUTLASS_OPS_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(cwd)) == []
    assert (cache / "cutlass" / "interface" / "compiled_cache.db").is_file()


def test_bridge_registry_is_explicit_and_restored():
    from cutlass_ops.cutlass import bridge

    before = bridge.cutlass()._option_registry
    with bridge.target_registry(90) as registry:
        assert bridge.cutlass()._option_registry is registry
        assert registry.target_cc == 90
    assert bridge.cutlass()._option_registry is before
    with pytest.raises(ValueError, match="target_cc"):
        with bridge.target_registry(70):
            pass


# -- emission ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel_cc", [75, 80, 90])
def test_plain_int8_gemm_emits(kernel_cc):
    emitted = emit(_spec(kernel_cc, bucket="large"))
    name = emitted.kernel_name
    assert 'extern "C"' in emitted.device_source and "__global__" in emitted.device_source
    assert f"{name}(" in emitted.device_source
    assert "int8_t, cutlass::layout::RowMajor" in emitted.device_source
    assert "int8_t, cutlass::layout::ColumnMajor" in emitted.device_source
    for function in ("_get_param_size", "_shared_memory_size", "_cutlass_ops_params", "_cutlass_ops_workspace_size"):
        assert f"{name}{function}(" in emitted.host_source
    arch_tag = {75: "cutlass::arch::Sm75", 80: "cutlass::arch::Sm80", 90: "cutlass::arch::Sm90"}[kernel_cc]
    assert arch_tag in emitted.device_source


@pytest.mark.parametrize("api", ["2x", "3x"])
def test_host_entry_points_come_from_the_template_files(api):
    """One copy of the extern "C" wrappers (templates/host_entry_points.cpp) for both APIs, with
    the API's Params builder and workspace size spliced in and the documenting header dropped."""
    text = gemm_emit.host_entry_points(api)
    assert text.count('extern "C" {') == 1 and "@template" not in text and "${build_params}" not in text
    assert gemm_emit.template(f"build_params_{api}.cpp") in text
    assert gemm_emit.template(f"workspace_size_{api}.cpp") in text
    assert text.startswith("\n#include <cstring>\n") and text.endswith("  }\n}\n")


@pytest.mark.parametrize("kernel_cc", [75, 80, 90])
@pytest.mark.parametrize("epilogue", EVT_EPILOGUES)
def test_each_epilogue_emits_an_evt(kernel_cc, epilogue):
    spec = _spec(kernel_cc, epilogue)
    emitted = emit(spec)
    assert f"Sm{max(kernel_cc, 80)}EVT" in emitted.device_source  # Sm75 uses the 2.x (Sm80) visitor
    layout = argument_layout(emitted, False, EXAMPLE)
    roles = {field[3] for field in layout["fields"]}
    epi = epilogues.get(epilogue)
    for name, kind in epi.inputs:
        assert (f"scalar:{name}" if kind == "scalar" else f"ptr:{name}") in roles, name
    assert {"ptr:A", "ptr:B", "ptr:D", "M", "N", "K"} <= roles


def test_sm75_evt_epilogue_keeps_the_sm75_mainloop():
    """The Sm80 (2.x) visitor on a Turing mainloop: Sm75 arch tag, m8n8k16 mma, 2 stages."""
    spec = _spec(75, "dequant", "f16")
    source = emit(spec).device_source
    kernel = source[source.index("DefaultGemmWithVisitor<"):]
    kernel = kernel[:kernel.index(">::GemmKernel;")]
    assert "cutlass::arch::Sm75," in kernel and "cutlass::arch::Sm80" not in kernel
    assert "cutlass::gemm::GemmShape<8, 8, 16>," in kernel
    assert re.search(r"ThreadblockSwizzle<\d+>,\s*2,\s*cutlass::arch::OpMultiplyAddSaturate", kernel)  # 2 stages
    assert "EVTD," in kernel and "Sm80EVT<" in source and "VisitorColBroadcast" in source
    assert "cp_async" not in source
    with pytest.raises(ValueError, match="90a"):
        GemmKernelSpec(kernel_cc=90, target_arch="90", epilogue="none", element_D="s32")


# -- the Arguments layout equals the interface's struct ----------------------------------------


def _pointers(spec: GemmKernelSpec, seed: int) -> dict[str, int]:
    names = ["A", "B", "C", "D", *epilogues.get(spec.epilogue).input_names]
    return {name: 0x7000_0000_0000 + seed * 0x1000_0000 + i * 0x10_0000 for i, name in enumerate(names)}


@pytest.mark.parametrize("kernel_cc,epilogue,element_D", [
    (75, "none", "s32"), (80, "none", "s32"), (90, "none", "s32"),
    (75, "kblock_accumulate", "f32"), (80, "kblock_accumulate", "f32"), (90, "kblock_accumulate", "f32"),
    (75, "requant_clamp", "s8"), (80, "requant_clamp", "s8"), (90, "dequant_relu6", "bf16"),
])
def test_argument_layout_matches_interface_struct(monkeypatch, kernel_cc, epilogue, element_D):
    spec = _spec(kernel_cc, epilogue, element_D)
    epi = epilogues.get(spec.epilogue)
    layouts = {flag: ArgumentLayout(argument_layout(emit(spec), flag, EXAMPLE)) for flag in (False, True)}
    for seed, (M, N, K) in enumerate([(1, 8, 16), (127, 264, 272), (4096, 1024, 8192)]):
        # The interface bakes EVT strides from its example tensors: re-trace at (M, N) to compare.
        monkeypatch.setattr(gemm_emit, "EXAMPLE_M", max(M, 2))
        monkeypatch.setattr(gemm_emit, "EXAMPLE_N", max(N, 2))
        emitted = emit(spec)
        pointers = _pointers(spec, seed)
        scalars = {n: 3.0 + i for i, (n, k) in enumerate(epi.inputs) if k == "scalar"}
        for flag in (False, True) if spec.api == "3x" else (False,):
            expected = bytes(interface_arguments(emitted, flag, M, N, K, pointers, scalars, sm_count=132))
            filled = layouts[flag].fill(M, N, K, pointers, scalars, sm_count=132)
            assert bytes(filled) == expected, (M, N, K, flag)


# -- tiles, validation, references (no GPU) -----------------------------------------------------


def test_configured_specs_cover_every_generation():
    names = [s.name for s in gemm_api.configured_specs(90)]
    assert len(names) == len(set(names))
    assert any(n.startswith("sm90_none") for n in names) and any(n.startswith("sm75_none") for n in names)
    assert any(n.startswith("sm75_dequant_f16") for n in names)
    sm75 = {s.epilogue for s in gemm_api.configured_specs(90) if s.kernel_cc == 75}
    assert sm75 == set(epilogues.names())
    assert {s.kernel_cc for s in gemm_api.configured_specs(80)} == {80, 75}
    assert all(s.target_arch == "80" for s in gemm_api.configured_specs(80))
    large = gemm_api.kernel_spec(90, "90a", "none", "s32", "large")
    assert large.threadblock_shape == (128, 256, 128) and large.cluster_shape == (1, 2, 1)
    assert large.alignment_A == large.alignment_B == 16 and large.alignment_D == 4


def test_arch_resolution_names_the_problem():
    assert gemm_api.resolve_arch(None, 90) == 90
    assert gemm_api.resolve_arch(None, 86) == 80
    assert gemm_api.target_arch_for(80, 90) == "90"
    with pytest.raises(ValueError, match="Hopper"):
        gemm_api.resolve_arch(90, 80)
    with pytest.raises(ValueError, match="arch"):
        gemm_api.resolve_arch(70, 90)


def test_operand_checks_name_M_N_K():
    # the kernels' own rules (checked by the plan)
    with pytest.raises(ValueError, match="K=40"):
        gemm_api.check_sizes(3, 64, 40, 8, "f16")
    with pytest.raises(ValueError, match="N=60"):
        gemm_api.check_sizes(3, 60, 32, 8, "f16")
    with pytest.raises(ValueError, match="empty GEMM: M=0"):
        gemm_api.check_sizes(0, 64, 32, 8, "f16")
    # the general rules (checked once by the public API, before any GPU is needed)
    with pytest.raises(ValueError, match=r"\(3, 32\) vs \(64, 48\)"):
        cutlass_ops.int8_gemm(torch.zeros(3, 32, dtype=torch.int8), torch.zeros(64, 48, dtype=torch.int8))
    with pytest.raises(TypeError, match="int8"):
        cutlass_ops.int8_gemm(torch.zeros(3, 40), torch.zeros(64, 40, dtype=torch.int8))


def test_epilogue_references():
    accum = torch.tensor([[10, -3], [7, 250]], dtype=torch.int32)
    s_row, s_col, bias = torch.tensor([0.5, 2.0]), torch.tensor([1.0, 3.0]), torch.tensor([-6.0, 1.0])
    expected = accum.double() * s_row.double()[:, None] * s_col.double() + bias.double()
    dq = epilogues.get("dequant")
    assert torch.equal(dq.reference(accum, scale_row=s_row, scale_col=s_col, bias=bias), expected)
    assert torch.equal(epilogues.get("dequant_relu6").reference(accum, scale_row=s_row, scale_col=s_col, bias=bias),
                       expected.clamp(0, 6))
    assert torch.equal(dq.reference(accum, scale_row=s_row, scale_col=s_col), expected - bias.double())
    # requant: round half to even, then saturate to int8
    rq = epilogues.get("requant")
    out = rq.reference(torch.tensor([[1, 3, 5, 400, -400]]), multiplier=torch.full((5,), 0.5),
                       fused_bias=torch.zeros(5))
    assert out.tolist() == [[0.0, 2.0, 2.0, 127.0, -128.0]]
    clamp = epilogues.get("requant_clamp").reference(torch.tensor([[7, -7]]), multiplier=torch.ones(2),
                                                     fused_bias=None, lo=-5.0, hi=5.0)
    assert clamp.tolist() == [[5.0, -5.0]]


# -- nvcc builds (slow) --------------------------------------------------------------------------


def _build_in_worker(spec_dict: dict) -> tuple[str, bool]:
    artifact, hit = gemm_build.build(GemmKernelSpec.from_dict(spec_dict))
    return str(artifact.directory), hit


# The kernels the slow tests compile: the smallest plain kernel of each generation (keyed by its
# kernel cc), the smallest Sm75 kernel with a fused (EVT) epilogue and the plain any-N kernel (Sm80,
# D stored one element at a time) with its narrow tile.
SM75_EVT = "sm75_dequant"
ANY_N = "sm80_any_n"
ANY_N_NARROW = "sm80_any_n_narrow"
BUILT = [75, 80, 90, SM75_EVT, ANY_N, ANY_N_NARROW]


@pytest.fixture(scope="module")
def built_kernels():
    """The kernels of BUILT, compiled in one process each, all at once."""
    special = {SM75_EVT: _spec(75, "dequant", "f16"), ANY_N: any_n_spec(80, 90, "none", "s32"),
               ANY_N_NARROW: any_n_spec(80, 90, "none", "s32", None, "any_n_narrow")}
    specs = {key: special[key] if key in special else _spec(key) for key in BUILT}
    with ProcessPoolExecutor(len(specs)) as pool:
        results = list(pool.map(_build_in_worker, [s.to_dict() for s in specs.values()]))
    return {key: (spec, gemm_build.GemmArtifact.load(Path(directory)))
            for (key, spec), (directory, _) in zip(specs.items(), results)}


@pytest.fixture(scope="module")
def built_plain_kernels(built_kernels):
    return {cc: built_kernels[cc] for cc in (75, 80, 90)}  # with the any-N kernels built beside them


def _pointer_sentinels(artifact, base: int) -> dict[str, int]:
    """A distinct sentinel for each pointer the Arguments carry (C shares D's where both appear)."""
    names = [name for _, name in ArgumentLayout(artifact.meta["arguments"]).pointers]
    pointers = {name: base + (i + 1) * 0x10_0000 for i, name in enumerate(dict.fromkeys(names)) if name != "C"}
    if "C" in names:
        pointers["C"] = pointers["D"]  # 2.x LinearCombination: the launcher points C at D
    return pointers


@pytest.mark.slow
@pytest.mark.parametrize("key", BUILT)
def test_kernel_compiles_to_cubin_and_host_library(built_kernels, key):
    spec, artifact = built_kernels[key]
    assert artifact is not None
    assert artifact.cubin_path.read_bytes()[:4] == b"\x7fELF"
    meta = artifact.meta
    assert meta["kernel_name"] in artifact.cubin_path.read_bytes().decode("latin-1")
    assert meta["param_size"] > 0 and meta["smem_bytes"] > 0
    assert (artifact.directory / "build.log").read_text().count("[exit 0") == 2
    assert gemm_build.lookup(spec).directory == artifact.directory
    again, hit = gemm_build.build(spec)
    assert hit and again.directory == artifact.directory


@pytest.mark.slow
@pytest.mark.parametrize("key", [75, 80, SM75_EVT])
def test_host_library_builds_params_with_verbatim_pointers(built_kernels, key):
    """CUTLASS 2.x Params need no driver: build them on the CPU and find the sentinel pointers."""
    spec, artifact = built_kernels[key]
    lib = _load_host_library(artifact.host_path)
    make = getattr(lib, f"{artifact.meta['kernel_name']}_cutlass_ops_params")
    make.argtypes, make.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    layout = ArgumentLayout(artifact.meta["arguments"])
    pointers = _pointer_sentinels(artifact, 0x5A5A_0000_0000)
    if spec.epilogue != "none":  # the EVT inputs and D travel in the visitor's arguments
        assert set(pointers) == {"A", "B", "D", *epilogues.get(spec.epilogue).input_names}

    def params(M, N, K):
        args = layout.fill(M, N, K, pointers)
        buf = (ctypes.c_char * len(args)).from_buffer(args)
        out, launch = (ctypes.c_char * artifact.meta["param_size"])(), (ctypes.c_int * 6)()
        return make(ctypes.addressof(buf), None, ctypes.addressof(out), launch), bytes(out), list(launch)

    rc, raw, launch = params(127, 264, 272)
    assert rc == 0
    tile_m, tile_n, _ = spec.threadblock_shape
    assert sorted(launch[:2]) == sorted([-(-127 // tile_m), -(-264 // tile_n)]) and launch[3] > 0
    # Deterministic bytes (padding included), so patched Params can be compared with fresh ones.
    assert all(params(127, 264, 272)[1] == raw for _ in range(3))
    patched = bytearray(raw)
    for value in set(pointers.values()):  # C and D share a value: patch every copy
        needle = struct.pack("<Q", value)
        offsets = [i for i in range(len(raw) - 7) if raw[i:i + 8] == needle]
        assert offsets, hex(value)
        for offset in offsets:
            struct.pack_into("<Q", patched, offset, value + 0x1000_0000)
    pointers.update({name: value + 0x1000_0000 for name, value in pointers.items()})
    assert bytes(patched) == params(127, 264, 272)[1]
    assert params(127, 264, 270)[0] == 1  # K not a multiple of 16: can_implement refuses


@pytest.mark.slow
@pytest.mark.parametrize("key", [75, 80, SM75_EVT])
def test_pointer_patch_plan_reproduces_fresh_params(built_kernels, key):
    """The launcher's sentinel search on a 2.x kernel, run on the CPU (no module load, no launch)."""
    _, artifact = built_kernels[key]
    kernel = GemmKernel(artifact)
    kernel._sm_counts[0] = 132  # SM count of an H100, so no GPU query is needed
    M, N, K = 127, 264, 272
    in_arguments = {name for _, name in kernel.layout.pointers}  # an EVT kernel's C is absent (null)
    nonnull = tuple(name in in_arguments for name in kernel.pointer_names)
    state = kernel._prepare(M, N, K, nonnull, (), 0)
    assert state.words is not None
    assert {slot for _, slot in state.words} == {i for i, flag in enumerate(nonnull) if flag}
    pointers = [0x7F00_0000_0000 + 0x4000 * i if flag else 0 for i, flag in enumerate(nonnull)]
    patched = kernel._patched(state.params, [(8 * word, slot) for word, slot in state.words], pointers)
    fresh, grid, block = kernel.fresh_params(M, N, K, pointers, device=0)
    assert bytes(patched) == fresh and grid == state.grid and block == state.block


@pytest.mark.slow
def test_second_build_is_all_cache_hits(built_plain_kernels):
    """build_kernels.py over kernels already built compiles nothing."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_kernels.py"), "--arch", "90", "--epilogue", "none",
         "--bucket", "small"], env=env, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "0 built, 5 cache hits, 0 failed" in result.stderr  # the 3 generations' and the 2 any-N kernels


@pytest.mark.slow
def test_failed_compile_raises_with_nvcc_output(tmp_path):
    spec = _spec(80)
    emitted = emit(spec)
    emitted.device_source += "\n#error deliberately broken kernel\n"
    with pytest.raises(CutlassBuildError, match="deliberately broken kernel"):
        gemm_build._compile(spec, emitted, tmp_path / "never", "0" * 64, 0.0)
    assert not (tmp_path / "never").exists()
