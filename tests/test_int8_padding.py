"""Any N and K for the int8 GEMMs, on the CPU. The any-N kernels (cutlass_ops/cutlass/tuning.py
``any_n_spec``): which spec each generation gets, that the build lists them, the int32 C that lets
CUTLASS 2.x store an int8 / f16 / bf16 D one element at a time, and (slow) that one compiles and its
host library takes an odd N. The padding left for K and Sm75 (cutlass_ops/cutlass/padding.py): padded
sizes, zero fill, the memo of weight-side copies (reused, redone after an in-place change, dropped
with the tensor), and, for every registered epilogue, that the epilogue of the padded problem sliced
to [M, N] equals the epilogue of the problem itself (float64 references, exact integer accumulators).
On a GPU: tests/gpu/test_int8_any_n_gpu.py and tests/gpu/test_int8_any_shape_gpu.py."""
from __future__ import annotations

import ctypes
import gc
import shutil

import pytest
import torch

import epilogues
from cutlass_ops.cutlass import padding, tuning
from cutlass_ops.cutlass.tuning import ALIGNMENT_K, alignment_D, any_n_spec, configured_specs

PAIRS = [(n, e) for n in epilogues.names() for e in epilogues.get(n).output_dtypes]
H100 = "NVIDIA H100 80GB HBM3"


def _int8(*shape, seed=0) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("N,K,align_D,expected", [
    (257, 1000, 4, (260, 1024)),    # int32 / f32 D on Sm90; K to 128 (24 <= 1000 / 32 zero columns)
    (1000, 3, 16, (1008, 16)),      # int8 D: 1000 = 62.5 x 16
    (1, 1, 8, (8, 16)),
    (4097, 4097, 8, (4104, 4224)),
    (64, 100, 8, (64, 112)),        # 128 would add 28 > 100 / 32 columns: 16
    (1024, 4112, 16, (1024, 4112)),  # aligned (K % 16 == 0): unchanged
    (1024, 4096, 16, (1024, 4096)),
])
def test_padded_sizes(N, K, align_D, expected):
    assert padding.padded_sizes(N, K, align_D) == expected
    assert padding.needs_padding(N, K, align_D) == (expected != (N, K))


@pytest.mark.parametrize("K", [1, 15, 17, 100, 127, 129, 1000, 4095, 4097, 8191, 12289])
def test_padded_K_is_the_smallest_16_multiple_or_a_cheap_128_multiple(K):
    K_pad = padding.padded_K(K)
    assert K_pad >= K and K_pad % 16 == 0 and K_pad - K < 128
    if K_pad % 128:
        assert K_pad == -(-K // 16) * 16 and -(-K // 128) * 128 - K > K // 32
    else:
        assert K_pad - K <= K // 32 or K_pad == -(-K // 16) * 16


def test_pad_rows_on_the_cpu_is_F_pad():
    A = _int8(5, 37)
    A_pad = padding.pad_rows(A, 48)
    assert A_pad.shape == (5, 48) and A_pad.is_contiguous()
    assert torch.equal(A_pad[:, :37], A) and not A_pad[:, 37:].any()
    assert padding.pad_rows(A_pad, 48) is A_pad


@pytest.mark.parametrize("arch", [75, 80, "90a"])
def test_pad_rows_kernel_compiles(arch):
    from custom_kernels import nvrtc

    source, name, defines = padding.PAD_ROWS_KERNEL
    cubin = nvrtc.compile_file(source, arch, defines=defines)
    assert cubin.data[:4] == b"\x7fELF" and name.encode() + b"\0" in cubin.data


@pytest.mark.parametrize("arch", [75, 80, "90a"])
@pytest.mark.parametrize("load_bytes", [1, 2, 4, 8, 16])
def test_unpad_rows_kernel_compiles(arch, load_bytes):
    from custom_kernels import nvrtc

    source, name = padding.UNPAD_ROWS_KERNEL
    cubin = nvrtc.compile_file(source, arch, defines={"LOAD_BYTES": load_bytes})
    assert cubin.data[:4] == b"\x7fELF" and name.encode() + b"\0" in cubin.data


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.int32])
def test_unpad_rows_on_the_cpu_is_the_slice(dtype):
    D_pad = torch.arange(5 * 16).reshape(5, 16).to(dtype)
    D = padding.unpad_rows(D_pad, 13)
    assert D.shape == (5, 13) and D.is_contiguous() and torch.equal(D, D_pad[:, :13])
    out = torch.zeros(5, 13, dtype=dtype)
    assert padding.unpad_rows(D_pad, 13, out) is out and torch.equal(out, D_pad[:, :13])
    assert padding.unpad_rows(D_pad, 16) is D_pad
    one = padding.unpad_rows(D_pad[:1], 13)  # one row: the slice itself, already contiguous
    assert one.is_contiguous() and one.data_ptr() == D_pad.data_ptr()


def test_alignments_are_16_bytes_of_D():
    """What the sizes are rounded to: K to 16 int8 elements, N to 16 bytes of D (2.x int32: 8 elements)."""
    assert ALIGNMENT_K == 16
    assert [alignment_D(90, e) for e in ("s8", "f16", "bf16", "f32", "s32")] == [16, 8, 8, 4, 4]
    assert alignment_D(80, "s32") == alignment_D(75, "s32") == 8


def test_pad_columns_and_weight_fill_zeros():
    A, B = _int8(3, 5), _int8(7, 5, seed=1)
    A_pad = padding.pad_columns(A, 16)
    assert A_pad.shape == (3, 16) and A_pad.is_contiguous()
    assert torch.equal(A_pad[:, :5], A) and not A_pad[:, 5:].any()
    B_pad = padding.pad_weight(B, 8, 16)
    assert B_pad.shape == (8, 16) and B_pad.is_contiguous()
    assert torch.equal(B_pad[:7, :5], B) and not B_pad[7:].any() and not B_pad[:, 5:].any()
    aligned = _int8(16, 32)
    assert padding.pad_columns(aligned, 32) is aligned and padding.pad_weight(aligned, 16, 32) is aligned


def test_weight_copy_is_reused_redone_after_in_place_change_and_dropped_with_the_tensor():
    B = _int8(257, 1000)
    first = padding.pad_weight(B, 260, 1008)
    assert padding.pad_weight(B, 260, 1008) is first  # the same weight: no second copy
    other_shape = padding.pad_weight(B, 272, 1008)  # another D alignment of the same weight: its own copy
    assert other_shape is not first and padding.pad_weight(B, 272, 1008) is other_shape
    assert padding.pad_weight(B.clone(), 260, 1008) is not first  # keyed on identity, not on values
    B[0, 0] = B[0, 0] + 1  # in place: a new version, re-padded with the new values
    again = padding.pad_weight(B, 260, 1008)
    assert again is not first and torch.equal(again[:257, :1000], B) and not torch.equal(first[:257, :1000], B)
    kept = len(padding._padded)
    del B, first, other_shape, again
    gc.collect()
    assert len(padding._padded) < kept  # freed with the weight


@pytest.mark.parametrize("shape", [(257,), (1, 257), (257, 1)])
def test_per_col_input_padded_to_1d_and_memoized(shape):
    v = torch.randn(shape)
    v_pad = padding.pad_per_col(v, 272)
    assert v_pad.shape == (272,) and torch.equal(v_pad[:257], v.reshape(-1)) and not v_pad[257:].any()
    assert padding.pad_per_col(v, 272) is v_pad
    v.mul_(2.0)
    assert torch.equal(padding.pad_per_col(v, 272)[:257], v.reshape(-1))
    assert padding.pad_per_col(v, 257) is v  # N already aligned: the tensor itself


def test_inference_tensors_are_memoized_too():
    with torch.inference_mode():
        B = _int8(3, 17)
    assert padding.pad_weight(B, 16, 32) is padding.pad_weight(B, 16, 32)


def _epilogue_inputs(spec, M: int, N: int, gen: torch.Generator) -> dict:
    inputs = {}
    for name, kind in spec.inputs:
        if kind == "scalar":
            inputs[name] = {"lo": -100.0, "hi": 90.0}.get(name, 1.0)
        elif kind == "matrix":
            inputs[name] = torch.randn(M, N, generator=gen)
        else:
            inputs[name] = torch.rand(M if kind == "per_row" else N, generator=gen) * 1e-3 + 1e-4
    return inputs


@pytest.mark.parametrize("name,element", [(n, e) for n in epilogues.names() for e in epilogues.get(n).output_dtypes])
@pytest.mark.parametrize("M,N,K", [(1, 3, 257), (33, 257, 1000), (5, 1000, 3)])
def test_padded_problem_gives_the_same_D(name, element, M, N, K):
    """pad_operands on every input kind: per_row untouched, per_col and matrix padded to N_pad, A and B
    with zeros; D_pad[:, :N] of the float64 reference is D of the original problem, bit for bit."""
    gen = torch.Generator().manual_seed(M * N + K)
    spec = epilogues.get(name)
    A, B = _int8(M, K, seed=1), _int8(N, K, seed=2)
    inputs = _epilogue_inputs(spec, M, N, gen)
    N_pad, K_pad = padding.padded_sizes(N, K, alignment_D(90, element))
    A_pad, B_pad, padded = padding.pad_operands(A, B, inputs, spec.tensor_inputs, N_pad, K_pad)
    assert A_pad.shape == (M, K_pad) and B_pad.shape == (N_pad, K_pad)
    for input_name, kind in spec.tensor_inputs:
        value = padded[input_name]
        if kind == "per_row":
            assert value is inputs[input_name]
        else:
            assert value.numel() == (N_pad if kind == "per_col" else M * N_pad)
    accum = A.double() @ B.double().T
    accum_pad = A_pad.double() @ B_pad.double().T
    assert torch.equal(accum_pad[:, :N], accum)  # zero K columns add nothing
    D = spec.reference(accum, element, **inputs)
    D_pad = spec.reference(accum_pad, element, **padded)
    assert D_pad.shape == (M, N_pad) and torch.equal(D_pad[:, :N], D)


def test_absent_and_unknown_inputs_pass_through():
    """Optional inputs left out or None, and names the epilogue does not take, reach the plan as given
    (the plan's checks name them)."""
    spec = epilogues.get("dequant")
    A, B = _int8(2, 20), _int8(5, 20)
    inputs = {"scale_row": torch.ones(2), "scale_col": torch.ones(5), "bias": None, "scales": "x"}
    _, _, padded = padding.pad_operands(A, B, inputs, spec.tensor_inputs, 8, 32)
    assert padded["bias"] is None and padded["scales"] == "x" and padded["scale_col"].shape == (8,)
    assert set(padded) == set(inputs)


# -- the any-N kernels ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel_cc,device_cc,target", [(90, 90, "90"), (80, 90, "90"), (80, 86, "86"), (80, 80, "80")])
@pytest.mark.parametrize("name,element", PAIRS)
def test_any_n_kernel_is_sm80_storing_one_element(name, element, kernel_cc, device_cc, target):
    """One tile for every M and D type (the tables' "80" -> "any_n"), int8 rows of A and B still 16 at a time."""
    spec = any_n_spec(kernel_cc, device_cc, name, element)
    assert (spec.kernel_cc, spec.target_arch, spec.alignment_D) == (80, target, 1)
    assert (spec.threadblock_shape, spec.stages, spec.warp_count) == ((64, 64, 128), 4, (2, 2, 1))
    assert (spec.epilogue, spec.element_D, spec.alignment_A, spec.alignment_B) == (name, element, 16, 16)
    assert any_n_spec(kernel_cc, device_cc, name, element, H100) == spec  # the H100 table keeps default.json's


def test_any_n_tile_comes_from_the_gpu_table(tmp_path, monkeypatch):
    shutil.copytree(tuning.TUNING_DIR, tmp_path / "tuning")
    monkeypatch.setattr(tuning, "TUNING_DIR", tmp_path / "tuning")
    tmp_path = tmp_path / "tuning"
    (tmp_path / "Test_GPU.json").write_text('{"80": {"any_n": {"threadblock_shape": [64, 128, 64], "stages": 6}}}')
    tuning.table.cache_clear()
    try:
        assert any_n_spec(80, 80, "dequant", "f16", "Test GPU").threadblock_shape == (64, 128, 64)
        assert any_n_spec(80, 80, "dequant", "f16").threadblock_shape == (64, 64, 128)
        (tmp_path / "Other_GPU.json").write_text('{"80": {"any_n": null}}')
        with pytest.raises(ValueError, match="'any_n' tile for Sm80"):
            any_n_spec(90, 90, "none", "s32", "Other GPU")
    finally:
        tuning.table.cache_clear()


def test_sm75_plans_have_no_any_n_kernel():
    assert any_n_spec(75, 90, "none", "s32") is None and any_n_spec(75, 75, "requant", "s8") is None
    assert not [s for s in configured_specs(75) if s.alignment_D == 1]


def test_large_bucket_has_its_own_any_n_tile():
    """The large M bucket takes "any_n_large" (128 x 128 x 64: the 64 x 64 tile ran M = 1024, N = 4097 at
    2.48x the aligned time per element on an H200); the others "any_n"."""
    large = any_n_spec(80, 90, "dequant", "f16", H100, "any_n_large")
    assert (large.threadblock_shape, large.stages, large.alignment_D) == ((128, 128, 64), 4, 1)
    assert any_n_spec(80, 90, "dequant", "f16", H100, "any_n") == any_n_spec(80, 90, "dequant", "f16")


def test_narrow_any_n_tile_and_unknown_tile_names():
    """"any_n_narrow" (64 x 32 x 128) for grids of the any-N tile that leave SMs idle; other names refused."""
    narrow = any_n_spec(80, 90, "requant", "s8", H100, "any_n_narrow")
    assert (narrow.threadblock_shape, narrow.stages, narrow.warp_count, narrow.alignment_D) == \
        ((64, 32, 128), 4, (2, 1, 1), 1)
    with pytest.raises(ValueError, match="tile must be one of"):
        any_n_spec(80, 90, "requant", "s8", H100, "large")


@pytest.mark.parametrize("target", ["80", "86", "90"])
def test_configured_specs_end_with_the_any_n_kernels_per_epilogue_and_output(target):
    every = configured_specs(target)
    any_n = [s for s in every if s.alignment_D == 1]
    assert every[-len(any_n):] == any_n  # appended: the tuned kernels keep their order
    pairs = [(n, e, t) for n, e in PAIRS for t in tuning.ANY_N_TILES]
    assert [(s.epilogue, s.element_D) for s in any_n] == [(n, e) for n, e, _ in pairs]
    assert any_n == [any_n_spec(80, int(target), n, e, None, t) for n, e, t in pairs]
    assert configured_specs(target, buckets=("large",))[-len(any_n):] == any_n
    small_only = [s for s in configured_specs(target, buckets=("small",)) if s.alignment_D == 1]
    assert small_only == [any_n_spec(80, int(target), n, e, None, t) for n, e in PAIRS
                          for t in ("any_n", "any_n_narrow")]  # the wide tile: large M only
    assert not [s for s in configured_specs(target, any_n=False) if s.alignment_D == 1]
    assert len({s.name for s in every}) == len(every)


def test_any_n_kernels_take_an_int32_C_where_CUTLASS_needs_one():
    """CUTLASS 2.x epilogue iterators from int32 take int8 C 4, 8 or 16 and f16 / bf16 C 8 at a time."""
    for name, element in PAIRS:
        spec = any_n_spec(80, 90, name, element)
        expected = "f32" if name == "kblock_accumulate" else "s32" if element in ("s8", "f16", "bf16") else element
        assert spec.element_C == expected, spec.name
        aligned = tuning.kernel_spec(80, "90", name, element, "small")
        assert aligned.element_C == ("f32" if name == "kblock_accumulate" else element)  # unchanged


@pytest.mark.slow
def test_any_n_int8_kernel_compiles_and_takes_an_odd_N():
    """The requant (int8 D) any-N kernel builds (int32 C), and its host library's Params accept N = 257,
    which the 16-per-store kernels refuse (built on the CPU: CUTLASS 2.x Params need no driver)."""
    from cutlass_ops.cutlass.arguments import ArgumentLayout
    from cutlass_ops.cutlass.build import build
    from cutlass_ops.cutlass.kernel import _load_host_library

    spec = any_n_spec(80, 90, "requant", "s8")
    artifact, _ = build(spec)
    assert artifact.cubin_path.read_bytes()[:4] == b"\x7fELF"
    lib = _load_host_library(artifact.host_path)
    make = getattr(lib, f"{artifact.meta['kernel_name']}_cutlass_ops_params")
    make.argtypes, make.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    layout = ArgumentLayout(artifact.meta["arguments"])
    names = dict.fromkeys(name for _, name in layout.pointers)
    pointers = {name: 0x7F00_0000_0000 + 0x10_0000 * (i + 1) for i, name in enumerate(names)}

    def status(M, N, K):
        args = layout.fill(M, N, K, pointers)
        buf = (ctypes.c_char * len(args)).from_buffer(args)
        out, launch = (ctypes.c_char * artifact.meta["param_size"])(), (ctypes.c_int * 6)()
        return make(ctypes.addressof(buf), None, ctypes.addressof(out), launch), list(launch)

    for N in (1, 3, 257, 1000, 4097):
        rc, launch = status(64, N, 256)
        assert rc == 0, N
        assert sorted(launch[:2]) == sorted([1, -(-N // spec.threadblock_shape[1])])
    assert status(64, 257, 270)[0] == 1  # K not a multiple of 16: still refused (A is padded for it)
