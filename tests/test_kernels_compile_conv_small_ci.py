"""The small-Cg conv kernels (conv_small_ci.cu) build with NVRTC (sm_75/80/90) and plain nvcc, each (dtype,
bits) module exports exactly the entry points SmallCiPlan names, their shared memory fits, and the host's
rules (which convs the strategy takes, the launch grid) hold. No GPU needed; the kernel's source runs on
the CPU in tests/test_conv_small_ci_host_emulation.py and on the GPU in tests/gpu/test_conv_small_ci_gpu.py."""
from __future__ import annotations

import re
import struct

import pytest
import torch

from custom_kernels import nvrtc
from cutlass_ops.conv.geometry import DTYPE_CODES, ConvGeometry, conv2d_output_shape
from cutlass_ops.conv.small_ci import (
    BLOCKS_PER_SM, COT, MAX_GRID_Y, SMEM_BUDGET, TH, THREADS, TW, SmallCiPlan, launch_config, patch_shape,
    small_ci_unsupported, smem_bytes,
)
from _nvcc import nvcc_cubin

SOURCE = "conv_small_ci.cu"
DTYPES = {1: torch.float32, 2: torch.float16, 3: torch.bfloat16}
MODULES = [(t, b) for t in DTYPES for b in (4, 8)]
SM75_SMEM_OPTIN, SM86_SMEM_OPTIN = 64 * 1024, 99 * 1024  # opt-in maxima per block: the two smallest targets
SM90_SMEM_PER_SM, RESERVED_PER_BLOCK = 228 * 1024, 1024


def _entries(data: bytes) -> set[str]:
    """The conv_small_ci_* kernel names in a cubin (extern "C": unmangled in the ELF string table)."""
    return {m.decode() for m in re.findall(rb"conv_small_ci_[a-z0-9_]+?(?=\x00)", data)}


def _plan_names(dtype: torch.dtype, bits: int) -> set[str]:
    return {name for cl in (False, True) for _, name, _ in SmallCiPlan.kernels(dtype, bits, cl)}


ALL_ENTRIES = set().union(*(_plan_names(DTYPES[t], b) for t, b in MODULES))


def _sections(elf: bytes) -> dict[str, int]:
    """{section name: size} of an ELF64 little-endian image (a cubin)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def header(i):  # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, ...
        return struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)

    names = header(shstrndx)[4]
    out = {}
    for i in range(shnum):
        name, size = header(i)[0], header(i)[5]
        out[elf[names + name:elf.index(b"\0", names + name)].decode()] = size
    return out


def geometry(batch=1, Ci=3, H=224, W=224, Co=64, k=7, stride=2, padding=3, dilation=1, block_size=None, groups=1,
             kw=None) -> ConvGeometry:
    Kh, Kw = k, kw or k
    Oh, Ow = conv2d_output_shape(H, W, Kh, Kw, (stride,) * 2, (padding,) * 2, (dilation,) * 2)
    return ConvGeometry(batch, H, W, Ci, Oh, Ow, Co, Kh, Kw, stride, stride, padding, padding, dilation, dilation,
                        block_size or Ci // groups, 0, groups)


STEM = geometry()

# ---------------------------------------------------------------------------------------------
# builds
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [75, 80, 90])
def test_nvrtc_builds_every_entry_point(arch):
    cubin = nvrtc.compile_file(SOURCE, arch)
    assert cubin.data[:4] == b"\x7fELF"
    assert _entries(cubin.data) == ALL_ENTRIES
    assert ALL_ENTRIES == {f"conv_small_ci_{t}_w{b}_{layout}" for t in ("f32", "f16", "bf16") for b in (4, 8)
                           for layout in ("nchw", "nhwc")}


@pytest.mark.parametrize("t_code, bits", MODULES)
def test_each_module_exports_exactly_its_entry_points(t_code, bits):
    """SmallCiPlan builds one module per (dtype, bits) through CUOPS_CONV_T / CUOPS_CONV_BITS."""
    dtype = DTYPES[t_code]
    ((source, name, defines),) = SmallCiPlan.kernels(dtype, bits, True)
    assert source == SOURCE and defines == {"CUOPS_CONV_T": t_code, "CUOPS_CONV_BITS": bits}
    tag = DTYPE_CODES[dtype][1]
    assert name == f"conv_small_ci_{tag}_w{bits}_nhwc"
    assert SmallCiPlan.kernels(dtype, bits, False)[0][1] == f"conv_small_ci_{tag}_w{bits}_nchw"
    data = nvrtc.compile_file(source, 90, defines=defines).data
    assert _entries(data) == _plan_names(dtype, bits) == {f"conv_small_ci_{tag}_w{bits}_{layout}"
                                                           for layout in ("nchw", "nhwc")}


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_plain_nvcc_builds(arch, tmp_path):
    """The same file compiles as ordinary CUDA C++ with nvcc."""
    try:
        cubin = nvcc_cubin(SOURCE, tmp_path, arch)
    except RuntimeError as exc:  # nvcc_path: no toolkit on this machine
        pytest.skip(str(exc))
    assert _entries(cubin) == ALL_ENTRIES


def test_host_mirrors_kernel_constants():
    text = nvrtc.kernel_path(SOURCE).read_text()
    for name, value in (("TH", TH), ("TW", TW), ("COT", COT), ("THREADS", THREADS)):
        match = re.search(rf"constexpr int {name} = (\d+);", text)
        assert match and int(match.group(1)) == value, name
    bounds = re.findall(r'extern "C" __global__ void __launch_bounds__\((\d+), (\d+)\)', text)
    assert bounds == [(str(THREADS), str(BLOCKS_PER_SM))]


# ---------------------------------------------------------------------------------------------
# shared memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [75, 80, 90])
def test_shared_memory_is_dynamic_and_the_stem_fits(arch):
    """No static shared memory (sm_90's cubins carry the 1 KiB the system reserves per block in the
    kernel's .nv.shared section); the stem's dynamic bytes fit every target, and on an sm_90 SM the
    four blocks __launch_bounds__ asks for."""
    data = nvrtc.compile_file(SOURCE, arch).data
    sections = _sections(data)
    reserved = RESERVED_PER_BLOCK if arch >= 90 else 0
    for name in ALL_ENTRIES:
        assert sections.get(f".nv.shared.{name}", 0) <= reserved, name
    config = launch_config(STEM, sms=132)
    assert config.smem == smem_bytes(STEM) == 4 * (147 * COT + 148 + 4 + 3 * 9 * 2 * 67) == 52712
    assert config.smem <= SM75_SMEM_OPTIN and SMEM_BUDGET <= SM86_SMEM_OPTIN
    assert BLOCKS_PER_SM * (config.smem + RESERVED_PER_BLOCK) <= SM90_SMEM_PER_SM


def test_the_gpu_limit_lowers_the_budget():
    """The stem with a fourth channel (70,272 bytes) fits the budget, not sm_75's 64 KiB (the plan passes
    its GPU's opt-in limit)."""
    g = geometry(Ci=4, block_size=4)
    assert smem_bytes(g) == 70272 and small_ci_unsupported(g, torch.float16) is None
    assert "70272 bytes > 65536" in small_ci_unsupported(g, torch.float16, SM75_SMEM_OPTIN)
    assert small_ci_unsupported(STEM, torch.float16, SM75_SMEM_OPTIN) is None
    assert small_ci_unsupported(g, torch.float16, 10 ** 6) is None  # a larger GPU limit does not raise the budget
    assert small_ci_unsupported(geometry(Ci=6, block_size=6), torch.float16, 10 ** 6) is not None


def test_patch_shape():
    assert patch_shape(STEM) == ((TH - 1) * 2 + 6 + 1, TW + 3)  # 9 rows, 67 slots per phase
    assert patch_shape(geometry(k=3, stride=1, padding=1)) == (TH + 2, TW + 2)
    assert patch_shape(geometry(k=5, stride=3, padding=0, dilation=2)) == ((TH - 1) * 3 + 8 + 1, TW + 8 // 3)
    assert patch_shape(geometry(k=1, stride=2, padding=0)) == ((TH - 1) * 2 + 1, TW)


# ---------------------------------------------------------------------------------------------
# which convs the strategy takes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("g", [
    STEM,
    geometry(batch=32),
    geometry(block_size=147),
    geometry(block_size=1),
    geometry(Ci=1, Co=1, H=1, W=1, k=1, stride=1, padding=0),
    geometry(Ci=4, Co=13, H=17, W=23, k=5, stride=3, padding=1, dilation=2, block_size=4),
    geometry(Ci=8, Co=96, k=3, stride=1, padding=1, groups=2),
    geometry(Ci=6, Co=6, k=3, stride=1, padding=1, groups=6, block_size=1),  # depthwise fits too
    geometry(Ci=16, Co=32, k=3, stride=1, padding=1, block_size=16),            # K = 144
    geometry(Ci=64, Co=64, k=1, stride=1, padding=0, block_size=64),            # 1x1, K = 64
    geometry(Ci=3, k=3, kw=11, stride=2, padding=1),
], ids=str)
def test_small_ci_takes(g):
    for dtype in DTYPES.values():
        assert small_ci_unsupported(g, dtype) is None


@pytest.mark.parametrize("g, dtype, reason", [
    (STEM, torch.float64, "fp32, fp16 or bf16"),
    (STEM, torch.int8, "fp32, fp16 or bf16"),
    (geometry(block_size=2), torch.float16, r"block_size=2 must divide K = Kh\*Kw\*Ci/groups = 147"),
    (geometry(Ci=6, Co=64, groups=4), torch.float16, "groups=4 must divide Ci=6"),
    (geometry(Ci=64, k=3, stride=1, padding=1, block_size=64), torch.float16, "shared memory: .* > 101376"),  # K 576
    (geometry(Ci=3, k=11, stride=4, padding=2), torch.float16, r"K = Kh\*Kw\*Ci/groups = 11\*11\*3 = 363"),  # AlexNet
    (geometry(Ci=8, k=5, stride=3), torch.bfloat16, "shared memory"),
    (geometry(Co=64 * (MAX_GRID_Y + 1), H=7, W=7), torch.float16, "channel tiles > 65535"),
    (ConvGeometry(1, 9, 9, 3, 0, 0, 8, 3, 3, 1, 1, 0, 0, 1, 1, 3, 0, 1), torch.float16, "positive sizes"),
    (geometry(batch=3000), torch.float16, r"out \[3000, 64, 112, 112\] has 2\^31 elements or more"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_small_ci_refuses(g, dtype, reason):
    got = small_ci_unsupported(g, dtype)
    assert got is not None and re.search(reason, got), got


def test_every_accepted_geometry_fits_the_budget():
    """The K limit the budget implies, for the common small-Cg shapes (stride 1 / 2, 3x3 / 7x7)."""
    for k, stride in ((3, 1), (3, 2), (7, 2), (1, 1)):
        fits = [Ci for Ci in range(1, 200) if small_ci_unsupported(geometry(Ci=Ci, k=k, stride=stride, padding=k // 2,
                                                                            block_size=1), torch.float16) is None]
        assert fits == list(range(1, len(fits) + 1)) and fits, (k, stride)  # a prefix: fewer channels always fit
        assert smem_bytes(geometry(Ci=fits[-1], k=k, stride=stride, padding=k // 2, block_size=1)) <= SMEM_BUDGET
    assert small_ci_unsupported(geometry(Ci=5, k=7), torch.float16) is None  # the stem with 5 channels: K = 245
    assert small_ci_unsupported(geometry(Ci=6, k=7), torch.float16) is not None


# ---------------------------------------------------------------------------------------------
# launch grid
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("g, sms, blocks, grid", [
    (STEM, 132, 4, (112, 1, 1)),                           # batch 1: 56 row pairs x 2 column tiles
    (geometry(batch=32), 132, 4, (528, 1, 1)),             # one wave of persistent blocks
    (geometry(batch=32), 132, 3, (396, 1, 1)),
    (geometry(Co=96), 132, 4, (112, 2, 1)),                # a ragged second channel tile
    (geometry(Ci=8, Co=192, groups=2, k=3, stride=1, padding=1, batch=8), 132, 4, (132, 4, 1)),  # 2 tiles per group
    (geometry(Ci=1, Co=1, H=1, W=1, k=1, stride=1, padding=0), 132, 4, (1, 1, 1)),
    (geometry(Co=64 * 600, H=9, W=9), 132, 4, (1, 600, 1)),
], ids=str)
def test_launch_config(g, sms, blocks, grid):
    config = launch_config(g, sms, blocks)
    assert config.grid == grid and config.block == (THREADS, 1, 1) and config.smem == smem_bytes(g)
    assert config.grid[1] <= MAX_GRID_Y


# ---------------------------------------------------------------------------------------------
# the plan's wiring, with the driver faked
# ---------------------------------------------------------------------------------------------


class _FakeKernel:
    def __init__(self, name: str):
        self.name, self.max_smem = name, 0

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        self.max_smem = max(self.max_smem, nbytes)

    def max_active_blocks(self, threads: int, smem: int, device: int) -> int:
        assert threads == THREADS and smem <= self.max_smem, "occupancy asked before the smem opt-in"
        return 3


class _FakeLaunch:
    def __init__(self, kernel, config, args, device):
        self.kernel, self.config, self.args, self.device, self.calls = kernel, config, args, device, []

    def __call__(self, **fields):
        self.calls.append(fields)


class _Ptr:
    def __init__(self, address: int):
        self.address = address

    def data_ptr(self) -> int:
        return self.address


def test_plan_builds_its_launch(monkeypatch):
    """SmallCiPlan without a GPU: the kernel it loads, the smem opt-in before the occupancy query, the grid
    from the GPU's SM count and occupancy, the geometry in the argument block, the pointers per call."""
    from cutlass_ops.conv import small_ci

    loaded = []
    monkeypatch.setattr(small_ci, "conv_kernel", lambda *a: loaded.append(a) or _FakeKernel(a[1]))
    monkeypatch.setattr(small_ci, "sm_count", lambda device: 132)
    monkeypatch.setattr(small_ci, "smem_limits", lambda device: (233472, 232448, 1024))
    monkeypatch.setattr(small_ci, "Launch", _FakeLaunch)
    g = geometry(batch=32, block_size=49)
    plan = SmallCiPlan(g, torch.bfloat16, 8, False, 0, "90a")
    assert loaded == [(SOURCE, "conv_small_ci_bf16_w8_nchw", torch.bfloat16, 8, "90a")]
    assert plan.launch.kernel.max_smem == smem_bytes(g)
    assert plan.launch.config == launch_config(g, 132, 3) and plan.launch.config.grid == (396, 1, 1)
    assert {name: getattr(plan.launch.args, name) for name in g.kernel_fields()} == g.kernel_fields()
    qw = type("QW", (), {"qweight": _Ptr(16), "scale": _Ptr(32), "offset": _Ptr(48)})()
    plan(_Ptr(1024), qw, None, _Ptr(4096))
    plan(_Ptr(1024), qw, _Ptr(64), _Ptr(4096))
    assert plan.launch.calls == [dict(x=1024, qweight=16, scale=32, offset=48, bias=0, out=4096),
                                 dict(x=1024, qweight=16, scale=32, offset=48, bias=64, out=4096)]


def test_plan_refuses_what_its_gpu_cannot_hold(monkeypatch):
    """On an sm_75 (64 KiB opt-in) the stem with a fourth channel (70,272 bytes) is refused by name."""
    from cutlass_ops.conv import small_ci

    monkeypatch.setattr(small_ci, "smem_limits", lambda device: (65536, 65536, 0))
    with pytest.raises(ValueError, match="strategy='small_ci' cannot run this conv: .*70272 bytes > 65536"):
        SmallCiPlan(geometry(Ci=4, block_size=4), torch.float16, 4, True, 0, "75")
