"""cutlass_ops.default_variants: every NVRTC module the default dispatch can load, per architecture (no GPU).

A wheel ships exactly these cubins (with the sanitizer cases' modules), so a first call that loads a module
outside the set compiles on the user's machine (issue 21: W4A16 M = 1 took gemv_mma's small-M int4 variant,
linear_w8a8 fused M = 64 the "M" tile at block 128, and neither was shipped). Three checks:

- over a grid of problems (M = 1 .. 4096, typical and ragged N / K, every dtype, bits, block sizes that
  steer the dispatch, conv shapes with groups, every W8A8 block size and path), what the default dispatch
  picks, through the plans' own pure selection and define functions, is in the set;
- the grid reaches every module of the set (it is not padded with modules nothing loads);
- the plans themselves, built with the driver faked, load nothing that their ``kernels`` (and so the set)
  does not name: the pure functions cannot drift from what the constructors do.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cutlass_ops import default_variants as dv
from cutlass_ops.default_variants import KernelUse

REPO = Path(__file__).resolve().parent.parent
ARCHS = ("75", "80", "86", "89", "90a")
M_GRID = (1, 2, 8, 16, 17, 32, 33, 64, 65, 128, 256, 4096)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (N, K): square, Llama-style wide and tall, ragged; K = 4608 takes the non-power-of-two blocks 48 / 96
NK_GRID = ((1024, 1024), (4096, 4096), (14336, 4096), (4096, 14336), (4097, 4608), (259, 4608))
# 48 / 96: not (chunk * 2^j), so gemv_mma / gemm_small_m refuse them; 8 / 16: below gemm_mma's 16 or
# dequant's word; None: per channel
BLOCK_SIZES = (32, 64, 128, 256, 48, 96, 16, 8, None)


def _weight(bits: int, N: int, K: int, block_size: int | None):
    """The fields the dispatch reads (``strategy_problem`` is pure Python on them), or None if not a weight."""
    bs = K if block_size is None else block_size
    if K % bs or (bits == 4 and K % 8):
        return None
    return SimpleNamespace(bits=bits, N=N, K=K, block_size=bs)


def weight_only_grid():
    for dtype in DTYPES:
        for bits in dv.BITS:
            for N, K in NK_GRID:
                for block_size in BLOCK_SIZES:
                    qw = _weight(bits, N, K, block_size)
                    if qw is not None:
                        for M in M_GRID:
                            yield M, dtype, qw
    # the shapes of the shipped tuning files, at every M of their entries (weight_only.tuned)
    from cutlass_ops.weight_only.tuned import shipped_entries

    for _, entry in shipped_entries():
        for dtype in DTYPES:
            for M in range(entry.M_lo, entry.M_hi + 1):
                yield M, dtype, _weight(entry.bits, entry.N, entry.K, entry.block_size)


# (Ci, Co, groups, block_size): plain, grouped, depthwise, the RGB stem, a K-block of 9 taps
CONV_GRID = ((64, 64, 1, 64), (128, 256, 1, 128), (3, 64, 1, 3), (24, 24, 24, 9), (256, 256, 4, 64),
             (128, 128, 2, 64), (48, 20, 2, 24), (512, 64, 1, 128), (64, 64, 1, 32), (32, 72, 1, 96))


def conv_grid():
    for dtype in DTYPES:
        for bits in dv.BITS:
            for channels_last in (False, True):
                for Ci, Co, groups, block_size in CONV_GRID:
                    yield dtype, bits, channels_last, Ci, Co, groups, block_size


def loads(arch: str) -> dict[KernelUse, str]:
    """What the default dispatch of every public op loads over the grids on ``arch``: {kernel: a problem}."""
    from cutlass_ops.w8a8.tiles import BLOCK_SIZES as W8A8_BLOCKS

    cc = dv.target_cc(arch)
    found: dict[KernelUse, str] = {}

    def add(uses, problem):
        for use in uses:
            found.setdefault(use, problem)

    for M, dtype, qw in weight_only_grid():
        for gather in (False, True):
            add(dv.linear_kernels(M, dtype, qw, cc, gather=gather),
                f"linear M={M} {dtype} W{qw.bits} N={qw.N} K={qw.K} g{qw.block_size} act-order={gather}")
    for dtype in DTYPES:
        for bits in dv.BITS:
            add(dv.dequantize_kernels(dtype, bits), f"dequantize {dtype} W{bits}")
    for dtype in (*DTYPES, torch.float64):
        for bits in dv.BITS:
            add(dv.quantize_weight_kernels(dtype, bits), f"quantize_weight {dtype} W{bits}")
    for dtype in DTYPES:
        add(dv.quantize_per_token_kernels(dtype), f"quantize_per_token {dtype}")
    for problem in conv_grid():
        add(dv.conv2d_kernels(*problem, cc), f"conv2d {problem}")
    for K in (4096, 4097, 100):
        add(dv.int8_gemm_kernels(K), f"int8_gemm K={K}")
    for dtype in DTYPES:
        for block_size in (32, 64, 128, 256, 1024, 2048, 4096):
            add(dv.quantize_activation_kernels(dtype, block_size), f"quantize_activation {dtype} g{block_size}")
        for M in M_GRID:
            for N in (1024, 4097):
                for block_size in W8A8_BLOCKS:
                    for path in ("fused", "orchestrator", "literal"):
                        add(dv.linear_w8a8_kernels(M, N, dtype, block_size, arch, path),
                            f"linear_w8a8 {path} M={M} N={N} {dtype} g{block_size}")
    from cutlass_ops.w8a8.tiles import BLOCK_SCALED_SIZES

    for dtype in DTYPES:
        for M in M_GRID:
            for block_size in BLOCK_SCALED_SIZES:
                add(dv.linear_w8a8_block_scaled_kernels(M, 4097, dtype, block_size, arch),
                    f"linear_w8a8_block_scaled M={M} {dtype} g{block_size}")
    return found


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def grid_loads(arch):
    return loads(arch)


def test_the_default_dispatch_of_every_grid_problem_is_enumerated(arch, grid_loads):
    enumerated = dv.default_variants(arch)
    missing = {use: problem for use, problem in grid_loads.items() if use not in enumerated}
    assert not missing, "\n".join(f"{u.file} {dict(u.defines)} {u.name} <- {p}" for u, p in list(missing.items())[:20])


def test_the_grid_reaches_every_enumerated_module(arch, grid_loads):
    reached = {use.module for use in grid_loads}
    unreached = sorted(set(dv.default_modules(arch)) - reached)
    assert not unreached, unreached


def test_issue_21_first_calls_are_shipped():
    """The two first calls scripts/check_wheel_gpu.py saw compile on an H100."""
    from cutlass_ops.weight_only import SMALL_M_GEMV_MMA
    from cutlass_ops.w8a8.tiles import TILE_CONFIGS

    modules = dv.default_modules("90")  # "90" is the runtime's sm_90a
    w4 = _weight(4, 1024, 1024, 128)
    # on Hopper the GEMV is launched as a programmatic dependent (CUTLASS_OPS_PDL, default on): WO_PDL_WAIT
    gemv = ("gemv_mma.cu", tuple(sorted({"WO_ELEMENT": 0, "WO_BITS": 4, "WO_PDL_WAIT": 1,
                                         **SMALL_M_GEMV_MMA.defines()}.items())))
    assert {u.module for u in dv.linear_kernels(1, torch.float16, w4, 90)} >= {gemv}
    assert gemv in modules and "gemv_mma_mt1" in modules[gemv]
    fused = ("w8a8_kblock_fused.cu", tuple(sorted(TILE_CONFIGS["M"].defines(128).items())))
    assert fused in {u.module for u in dv.linear_w8a8_kernels(64, 1024, torch.float16, 128, "90a")}
    assert fused in modules


def test_sm90a_set_and_the_others():
    m90, m80, m75 = (dv.default_modules(a) for a in ("90a", "80", "75"))
    files90 = {f for f, _ in m90}
    assert {"gather_k.cu", "w8a8_kblock_wgmma.cu"} <= files90  # act-order PDL plan, Hopper wgmma tiles
    assert not {"gather_k.cu", "w8a8_kblock_wgmma.cu"} & {f for f, _ in m80}
    assert not {"gemv_mma.cu", "gemm_mma.cu", "conv_igemm.cu", "splitk_reduce.cu"} & {f for f, _ in m75}  # sm_80+
    # sm_90a: the same modules, the GEMV built as a programmatic dependent (WO_PDL_WAIT), and its own
    pdl = {(f, tuple(sorted({**dict(d), "WO_PDL_WAIT": 1}.items()))) if f == "gemv_mma.cu" else (f, d) for f, d in m80}
    assert pdl < set(m90)
    assert not any(f == "gemv_mma.cu" and "WO_PDL_WAIT" not in dict(d) for f, d in m90)
    assert set(dv.default_modules("90a", pdl=False)) > set(m80)  # CUTLASS_OPS_PDL=0: the plain GEMVs
    # a mma.sync W8A8 tile per block size that fits in shared memory, the wgmma ones on sm_90a only
    assert dv.default_modules("86") == m80 == dv.default_modules("sm_89")


def test_families_are_the_sanitizer_families():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import sanitize_kernels
    finally:
        sys.path.remove(str(REPO / "scripts"))
    for arch in ARCHS:
        served = set().union(*dv.default_variants(arch).values())
        assert served <= set(sanitize_kernels.FAMILIES) - {"converters_test"}
    assert set(dv.default_modules("90a", ["quant_a"])) == {("quant_a.cu", ())}
    for arch in ARCHS:  # every dtype and bits of quantize_weight's kernel: one module, no defines, on every GPU
        assert dv.default_modules(arch, ["quantize_weight"]) == {("quantize_weight.cu", ()): {
            f"quantize_weight_w{bits}_{tag}" for bits in dv.BITS for tag in ("f16", "bf16", "f32", "f64")}}
    # every weight-only strategy's family is one of them
    from cutlass_ops.weight_only import STRATEGIES

    assert {dv.FAMILY_OF_STRATEGY.get(s, s) for s in STRATEGIES} <= set(sanitize_kernels.FAMILIES)


def test_the_enumeration_follows_the_dispatch_switches(monkeypatch):
    """Read at call time: a strategy the dispatch is switched to joins the set, one switched off leaves it."""
    from cutlass_ops.weight_only import dispatch

    monkeypatch.setattr(dispatch, "GEMM_SMALL_M_DEFAULT", False)  # (sm_90a's tuning file still names it)
    assert "gemm_small_m.cu" not in {f for f, _ in dv.default_modules("80")}
    monkeypatch.setattr(dispatch, "SMALL_M_GEMV", {**dispatch.SMALL_M_GEMV, 3: "gemv_stream"})
    assert {("gemv_stream.cu", (("WO_BITS", b), ("WO_ELEMENT", e))) for b in (4, 8) for e in (0, 1)} <= set(
        dv.default_modules("80"))
    assert "gemv_stream.cu" not in {f for f, _ in dv.default_modules("75")}  # tensor-core GPUs only


# ------------------------------------------------------------------------------------------------
# the plans, built with the driver faked: what they load is what their kernels() name
# ------------------------------------------------------------------------------------------------

class _FakeKernel:
    def __init__(self, name):
        self.name = name

    def function(self, device=None):
        return 0  # a stand-in CUfunction: LaunchShape only stores it

    def set_max_dynamic_smem(self, nbytes):
        pass

    def max_active_blocks(self, threads, smem, device):
        return 2


@pytest.fixture
def recorder(monkeypatch):
    """(recorded loads, set_gpu(cc, sms)): every ``load_kernel`` the plans make, nothing compiled or loaded."""
    from custom_kernels import launch
    from cutlass_ops import conv, weight_only
    from cutlass_ops.conv import depthwise as conv_depthwise
    from cutlass_ops.conv import dequant_cudnn as conv_dequant_cudnn
    from cutlass_ops.conv import small_ci as conv_small_ci
    from cutlass_ops.weight_only import dequant_cublas, gemm_small_m, gemm_wgmma, gemv_mma, gemv_stream, splitk

    recorded: set[KernelUse] = set()
    gpu = {"cc": 90, "sms": 132}

    class _Module:
        def __init__(self, filename, arch, defines):
            self.filename, self.defines = filename, defines

        def kernel(self, name):
            recorded.add(KernelUse(self.filename, self.defines, name))
            return _FakeKernel(name)

    monkeypatch.setattr(launch, "_module", lambda filename, arch, defines: _Module(filename, arch, defines))
    monkeypatch.setattr(launch, "cu_launch_kernel_ex", lambda: None)  # PDL launches: nothing is launched
    monkeypatch.delenv("CUTLASS_OPS_PDL", raising=False)
    monkeypatch.setattr(weight_only, "capability", lambda device=None: gpu["cc"])
    for module in (weight_only, dequant_cublas):
        monkeypatch.setattr(module, "on_device", lambda device: contextlib.nullcontext())
    for module in (gemv_mma, splitk, gemv_stream, dequant_cublas, gemm_small_m, gemm_wgmma, conv, conv_depthwise,
                   conv_small_ci, conv_dequant_cudnn):
        if hasattr(module, "sm_count"):
            monkeypatch.setattr(module, "sm_count", lambda device: gpu["sms"])
    for module in (gemv_stream, gemm_small_m, conv_small_ci):
        monkeypatch.setattr(module, "smem_limits", lambda device: (233472, 232448, 1024))  # H100
    for module in (launch, conv):
        monkeypatch.setattr(module, "target_arch", lambda device=None: dv.nvrtc_target(gpu["cc"]))

    def set_gpu(cc: int, sms: int) -> None:
        gpu.update(cc=cc, sms=sms)
        recorded.clear()

    return recorded, set_gpu


def _fresh_weight(bits: int, N: int, K: int, block_size: int | None):
    """A small real QuantizedWeight on the CPU (its own tensors: no plan of another test is cached on them)."""
    from cutlass_ops.formats import quantize_weight

    g = torch.Generator().manual_seed(N + K + bits)
    return quantize_weight(torch.randn(N, K, generator=g), bits=bits, block_size=block_size, symmetric=False)


@pytest.mark.parametrize("cc", [75, 80, 90])
def test_weight_only_plans_load_what_their_kernels_name(recorder, cc):
    from cutlass_ops import weight_only

    recorded, set_gpu = recorder
    checked, seen = 0, set()
    for bits in dv.BITS:
        for N, K, block_size in ((256, 4608, 128), (64, 4608, 96), (512, 4608, 48), (4160, 1024, None),
                                 (64, 1024, 8)):
            qw = _fresh_weight(bits, N, K, block_size)
            for dtype in DTYPES:
                for M in (1, 2, 3, 8, 16, 33, 65, 128):
                    for sms in (8, 132):  # few SMs: no split; many: the GEMVs split K
                        for gather in (False, True):
                            set_gpu(cc, sms)
                            view = type(qw)(qw.qweight.clone(), qw.scale.clone(), qw.offset.clone(), bits,
                                            qw.block_size, N, K, symmetric=False)
                            plan = weight_only.get_plan(view, M, dtype, 0, gather=gather)
                            named = dv.linear_kernels(M, dtype, view, cc, gather=gather)
                            assert recorded, (M, dtype, bits, block_size)
                            assert recorded <= named, (plan.strategy, sorted(recorded - named))
                            assert plan.strategy == weight_only.choose_strategy(M, dtype, view, cc)
                            checked += 1
                            seen |= {use.file for use in recorded}
    assert checked > 500
    # gemm_small_m takes M = 17..64 where gemm_wgmma does not (sm_80; on sm_90 only through tuned entries)
    expected = {"gemv_simt.cu", "gemm_simt.cu", "dequant_weight.cu"} | (
        {"gemv_mma.cu", "gemm_mma.cu", "splitk_reduce.cu"} if cc >= 80 else set()) | (
        {"gemm_small_m.cu"} if cc == 80 else set()) | ({"gather_k.cu", "gemm_wgmma.cu"} if cc >= 90 else set())
    assert seen == expected, seen ^ expected


@pytest.mark.parametrize("cc", [75, 86, 90])
def test_conv_plans_load_what_their_kernels_name(recorder, cc):
    from cutlass_ops.conv import ConvGeometry, auto_strategy, conv2d_output_shape, plan_for
    from cutlass_ops.conv.igemm import igemm_problem

    recorded, set_gpu = recorder
    seen = set()
    KINDS = ("conv_direct", "conv_igemm", "conv_nchw_to_nhwc", "conv_splitk_reduce", "conv_depthwise",
             "conv_small_ci", "conv_dequant", "conv_bias_act")
    for dtype, bits, channels_last, Ci, Co, groups, block_size in conv_grid():
        for batch, H, sms in ((1, 7, 132), (8, 28, 8), (64, 56, 132)):  # split along K or not; at batch
            set_gpu(cc, sms)
            Oh, Ow = conv2d_output_shape(H, H, 3, 3, (1, 1), (1, 1), (1, 1))
            dims = (batch, H, H, Ci, Oh, Ow, Co, 3, 3, 1, 1, 1, 1, 1, 1, block_size, 1, groups)
            strategy = auto_strategy(ConvGeometry(*dims), dtype,
                                     igemm_problem(dtype, Ci // groups, Co, groups, block_size, cc))
            plan_for.__wrapped__(strategy, dtype, bits, channels_last, dims, None, 0)  # the plan cache bypassed
            named = dv.conv2d_kernels(dtype, bits, channels_last, Ci, Co, groups, block_size, cc)
            assert recorded and recorded <= named, sorted(recorded - named)
            seen |= {next(k for k in KINDS if use.name.startswith(k)) for use in recorded}
    assert seen == set(KINDS[:1] + KINDS[4:] if cc < 80 else KINDS)


# ------------------------------------------------------------------------------------------------
# what the wheel ships, and the one command that fills a cache with it
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import sanitize_kernels
        import wheel_manifest
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return sanitize_kernels, wheel_manifest


def test_the_wheel_ships_the_default_variants_and_the_runnable_cases(scripts):
    sanitize_kernels, wheel_manifest = scripts
    families = [f for f in sanitize_kernels.FAMILIES if f not in wheel_manifest.SELFTEST_FAMILIES]
    cases = sanitize_kernels.select(sanitize_kernels.build_cases(), None, families)
    for arch in ARCHS:
        shipped = wheel_manifest.nvrtc_modules(arch)
        default = dv.default_modules(arch)
        runnable = sanitize_kernels.case_modules(sanitize_kernels.runnable(cases, arch))
        assert set(shipped) == set(default) | set(runnable)
        assert all(shipped[m] >= names for m, names in (*default.items(), *runnable.items()))
        assert "converters_test.cu" not in {f for f, _ in shipped}
        if arch != "90a":  # a case that needs Hopper names no module of an older GPU
            assert "w8a8_kblock_wgmma.cu" not in {f for f, _ in shipped}
    # --family narrows both halves alike
    assert set(wheel_manifest.nvrtc_modules("90a", ["quant"])) == {("quant_a.cu", ())}


def test_build_only_default_variants_fills_the_cache(tmp_path):
    import subprocess

    from custom_kernels import cache

    env = {**os.environ, cache.ENV_VAR: str(tmp_path / "cache"),
           cache.PREBUILT_ENV_VAR: str(tmp_path / "none")}
    command = [sys.executable, str(REPO / "scripts" / "sanitize_kernels.py"), "--build-only", "--arch", "90a",
               "--family", "quant_a", "--default-variants", "-j", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 of 1 modules ok (0 from the cache, 1 compiled" in proc.stdout, proc.stdout
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "nvrtc").glob("*.cubin")] == ["quant_a"]
    proc = subprocess.run(command[:2] + ["--default-variants"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2 and "--default-variants needs --build-only" in proc.stderr
