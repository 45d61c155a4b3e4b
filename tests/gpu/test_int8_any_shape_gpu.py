"""int8_gemm and int8_gemm_requant at any N and K (cutlass_ops/cutlass/padding.py) on a GPU.

N and K from {1, 3, 257, 1000, 4097} (none a multiple of 16), M in {1, 33}: every registered
epilogue with every output type it writes, ``out=`` given and not, through the public API. int32 and
int8 results must equal the exact product / the float64 reference bit for bit (power-of-two requant
multipliers make every int8 value exact); float results are held to the same bound as
tests/gpu/test_int8_gemm_gpu.py (whose helpers this file uses). Also: every kernel generation, the
padded weight copied once and again after an in-place change, CUDA-graph replays reading B's current
values, errors naming the caller's sizes. Sm80 plans run an unaligned N on the any-N kernels (nothing padded
along N; tests/gpu/test_int8_any_n_gpu.py), so the tests of Sm75's N padding force ``arch=75``; Sm90 plans pad
N at M <= 64 and on long any-N grids (cutlass/plan.py ``pads_N``: the last tests here), D taken out of
D_pad by unpad_rows.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import epilogues

# the aligned tests' helpers (and so their tolerance), loaded once whichever file pytest imports first
_spec = importlib.util.spec_from_file_location("test_int8_gemm_gpu", Path(__file__).with_name("test_int8_gemm_gpu.py"))
_base = sys.modules.setdefault("test_int8_gemm_gpu", importlib.util.module_from_spec(_spec))
if not hasattr(_base, "_check_float"):
    _spec.loader.exec_module(_base)
ARCHS, _check_float, _exact, _inputs, _int8 = _base.ARCHS, _base._check_float, _base._exact, _base._inputs, _base._int8

pytestmark = pytest.mark.gpu

PAIRS = [(name, element) for name in epilogues.names() for element in epilogues.get(name).output_dtypes]
# (M, N, K): both N and K unaligned, K tiny and large, N tiny and large; each pair of PAIRS takes two
SHAPES = [(1, 1, 1), (33, 3, 257), (1, 257, 1000), (33, 1000, 3), (1, 4097, 257), (33, 257, 4097),
          (1, 1000, 4097), (33, 4097, 1000), (1, 3, 4097), (33, 1, 3), (1, 1000, 257), (33, 257, 1)]


def _cases() -> list:
    """Each (epilogue, output type) twice: one M = 1 and one M = 33 shape, one call with ``out=``."""
    cases = []
    for j, (name, element) in enumerate(PAIRS):
        for r in (0, 1):
            M, N, K = SHAPES[(2 * j + 7 * r) % len(SHAPES)]
            with_out = bool((j + r) % 2)
            cases.append(pytest.param(name, element, M, N, K, with_out,
                                      id=f"{name}-{element}-M{M}-N{N}-K{K}" + ("-out" if with_out else "")))
    return cases


CASES = _cases()
SCALARS = {"lo": -100.0, "hi": 90.0}  # requant_clamp's range


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(4321)


@pytest.fixture(scope="module")
def co():
    import cutlass_ops
    return cutlass_ops


def _epilogue_inputs(name: str, M: int, N: int, gen: torch.Generator) -> dict:
    """The aligned tests' inputs; power-of-two requant multipliers (exact int8 results) and the scalars."""
    spec = epilogues.get(name)
    inputs = _inputs(name, M, N, gen, power_of_two=True)
    inputs.update({n: SCALARS[n] for n, kind in spec.inputs if kind == "scalar"})
    return inputs


def _check(D: torch.Tensor, A: torch.Tensor, B: torch.Tensor, name: str, element: str, inputs: dict) -> None:
    spec = epilogues.get(name)
    accum = _exact(A, B).cpu()
    assert D.dtype == epilogues.OUTPUT_DTYPES[element] and D.shape == accum.shape and D.is_contiguous()
    ref = spec.reference(accum, element, **inputs)
    if element in ("s32", "s8"):
        assert torch.equal(D.cpu().double(), ref.double())
        return
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    terms = spec.reference(accum.abs(), element, **{k: v.abs() for k, v in tensors.items()},
                           **{k: v for k, v in inputs.items() if k not in tensors})
    _check_float(D, ref, element, terms.abs())


@pytest.mark.parametrize("name,element,M,N,K,with_out", CASES)
def test_every_epilogue_any_N_K(co, name, element, M, N, K, with_out, gen):
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs(name, M, N, gen)
    dtype = epilogues.OUTPUT_DTYPES[element]
    if with_out:
        out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda") if dtype.is_floating_point else \
            torch.full((M, N), -7, dtype=dtype, device="cuda")
        D = co.int8_gemm(A, B, name, out=out, **inputs)
        assert D is out
    else:
        D = co.int8_gemm(A, B, name, out_dtype=dtype, **inputs)
    _check(D, A, B, name, element, inputs)


@pytest.mark.parametrize("arch", ARCHS)
def test_int32_every_generation(co, arch, gen):
    """int32 D at N = 257: the any-N kernel for Sm80 plans, padded to 264 on Sm75 (8 per store) and to 260 on
    Sm90 (M = 33 <= 64: the aligned kernel, then unpad_rows)."""
    A, B = _int8(33, 1000, generator=gen), _int8(257, 1000, generator=gen)
    D = co.int8_gemm(A, B, arch=arch)
    assert D.shape == (33, 257) and torch.equal(D.long(), _exact(A, B))


@pytest.mark.parametrize("clamp", [(-128, 127), (-100, 90)])
def test_requant_N_1000(co, clamp, gen):
    M, N, K = 33, 1000, 257
    A, W = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    M_scale = (2.0 ** -torch.randint(8, 12, (N,), generator=gen).float()).cuda()
    fused_bias = torch.randint(-3000, 3001, (N,), generator=gen).float().cuda()
    O_q = co.int8_gemm_requant(A, W, M_scale, fused_bias, clamp=clamp)
    ref = epilogues.get("requant").reference(_exact(A, W).cpu(), "s8", multiplier=M_scale, fused_bias=fused_bias)
    assert O_q.shape == (M, N) and torch.equal(O_q.cpu().double(), ref.clamp(*clamp))


def test_requant_N_1000_into_out(gen):
    from cutlass_ops.cutlass import int8_gemm_requant

    M, N, K = 1, 1000, 1000
    A, W = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    M_scale = (2.0 ** -torch.randint(10, 14, (N,), generator=gen).float()).cuda()
    out = torch.full((M, N), -7, dtype=torch.int8, device="cuda")
    assert int8_gemm_requant(A, W, M_scale, None, out=out) is out
    ref = epilogues.get("requant").reference(_exact(A, W).cpu(), "s8", multiplier=M_scale, fused_bias=None)
    assert torch.equal(out.cpu().double(), ref)


def test_only_K_unaligned_writes_into_out(co, gen):
    """N aligned: the kernel writes ``out`` itself (no D_pad)."""
    A, B = _int8(33, 1000, generator=gen), _int8(256, 1000, generator=gen)
    out = torch.full((33, 256), -7, dtype=torch.int32, device="cuda")
    assert co.int8_gemm(A, B, out=out) is out and torch.equal(out.long(), _exact(A, B))


@pytest.mark.parametrize("arch", ARCHS)
def test_only_N_unaligned(co, arch, gen):
    """K aligned: A goes to the kernel as it is; Sm75 and (M <= 64) Sm90 pad B and D to N = 272 (int8 D: 16 per
    store), Sm80 pads nothing (the any-N kernel)."""
    from cutlass_ops.cutlass import padding

    M, N, K = 33, 257, 1024
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs("requant", M, N, gen)
    D = co.int8_gemm(A, B, "requant", arch=arch, **inputs)
    _check(D, A, B, "requant", "s8", inputs)
    copies = padding._padded.get(B)
    assert (set(copies) == {(272, K)}) if arch in (75, 90) else copies is None


def test_weight_padded_once_and_again_after_an_in_place_change(co, gen):
    """Sm75 (the generation that pads N): B and the per-column inputs padded once, again after a change."""
    from cutlass_ops.cutlass import padding

    M, N, K = 33, 257, 1000
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    inputs = _epilogue_inputs("dequant", M, N, gen)
    D = co.int8_gemm(A, B, "dequant", out_dtype=torch.float32, arch=75, **inputs)
    _check(D, A, B, "dequant", "f32", inputs)
    B_copies, col_copies = padding._padded.get(B), padding._padded.get(inputs["scale_col"])
    assert B_copies and col_copies  # kept per weight-side tensor
    B_pad, col_pad = next(iter(B_copies.values())), next(iter(col_copies.values()))
    A = _int8(M, K, generator=gen)
    D = co.int8_gemm(A, B, "dequant", out_dtype=torch.float32, arch=75, **inputs)
    _check(D, A, B, "dequant", "f32", inputs)
    assert next(iter(padding._padded.get(B).values())) is B_pad  # the second call copied only A
    assert next(iter(padding._padded.get(inputs["scale_col"]).values())) is col_pad
    B.copy_(_int8(N, K, generator=gen))  # in place: new values, a new version
    inputs["scale_col"].mul_(2.0)
    D = co.int8_gemm(A, B, "dequant", out_dtype=torch.float32, arch=75, **inputs)
    _check(D, A, B, "dequant", "f32", inputs)
    assert next(iter(padding._padded.get(B).values())) is not B_pad


def test_cuda_graph_replay_reads_current_B(co, gen):
    """Inside a capture nothing is memoized: the pad of B is a copy in the graph, so a replay after B
    changed in place uses the new B (as the unpadded path does)."""
    M, N, K = 33, 257, 1000
    A, B = _int8(M, K, generator=gen), _int8(N, K, generator=gen)
    co.int8_gemm(A, B)  # warm-up: load the kernel, prepare the padded shape (and memoize B's pad eagerly)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        D = co.int8_gemm(A, B)
    for _ in range(2):
        A.copy_(_int8(M, K, generator=gen))
        B.copy_(_int8(N, K, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(D.long(), _exact(A, B))
    assert torch.equal(co.int8_gemm(A, B).long(), _exact(A, B))  # eager after the graph: B's new version


def test_errors_name_the_callers_sizes(co, gen):
    A, B = _int8(4, 40, generator=gen), _int8(257, 40, generator=gen)
    with pytest.raises(ValueError, match=r"scale_col must be \[N=257\]"):
        co.int8_gemm(A, B, "dequant", scale_row=torch.ones(4, device="cuda"), scale_col=torch.ones(260, device="cuda"))
    with pytest.raises(ValueError, match=r"out must be a contiguous torch.int32 tensor \[M=4, N=257\]"):
        co.int8_gemm(A, B, out=torch.empty(4, 260, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="scale_row"):
        co.int8_gemm(A, B, "dequant", scale_col=torch.ones(257, device="cuda"))
    with pytest.raises(TypeError, match="unexpected"):
        co.int8_gemm(A, B, "none", scale=torch.ones(257, device="cuda"))


@pytest.mark.parametrize("M,K,K_pad", [(1, 1, 16), (3, 100, 112), (64, 4097, 4224), (1029, 4097, 4112),
                                       (5000, 33, 48), (7, 4112, 4224)])
def test_pad_rows_kernel_equals_F_pad(co, M, K, K_pad):
    """pad_rows_i8 (the A padding of K % 16 != 0) against F.pad, at unaligned row starts, ragged grids and a grid
    that strides (M = 5000: more vectors than 4 x SMs x 256 threads)."""
    from cutlass_ops.cutlass import padding

    A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
    A_pad = padding.pad_rows(A, K_pad)
    assert A_pad.shape == (M, K_pad) and A_pad.is_contiguous() and A_pad.data_ptr() % 16 == 0
    assert torch.equal(A_pad, torch.nn.functional.pad(A, (0, K_pad - K)))
    shifted = torch.empty(M * K + 1, dtype=torch.int8, device="cuda")[1:].view(M, K)  # rows off 16 bytes too
    shifted.copy_(A)
    assert torch.equal(padding.pad_rows(shifted, K_pad), A_pad)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.int32])
@pytest.mark.parametrize("M,N,N_pad", [(2, 1000, 1008), (64, 257, 272), (1029, 4097, 4112), (5000, 3, 16),
                                       (7, 1, 16), (3, 4104, 4112)])
def test_unpad_rows_kernel_equals_the_slice(co, dtype, M, N, N_pad):
    """unpad_rows (D = D_pad[:, :N] after a GEMM on a padded N) against torch's slice: every load width (gcd of a
    row's bytes and 16: 1 to 16), a last vector shorter than 16 bytes, a grid that strides (M = 5000), into a
    fresh D and into ``out``; an ``out`` off 16 bytes takes torch's copy."""
    from cutlass_ops.cutlass import padding

    D_pad = torch.randint(-1000, 1000, (M, N_pad), device="cuda").to(dtype)
    D = padding.unpad_rows(D_pad, N)
    assert D.shape == (M, N) and D.is_contiguous() and torch.equal(D, D_pad[:, :N])
    out = torch.zeros(M, N, dtype=dtype, device="cuda")
    assert padding.unpad_rows(D_pad, N, out) is out and torch.equal(out, D_pad[:, :N])
    shifted = torch.zeros(M * N + 1, dtype=dtype, device="cuda")[1:].view(M, N)
    assert torch.equal(padding.unpad_rows(D_pad, N, shifted), D_pad[:, :N])


@pytest.mark.parametrize("element", ["s32", "s8", "f16"])
@pytest.mark.parametrize("M,N", [(64, 1000), (1024, 257), (300, 4097)])
def test_padded_N_at_M_above_1_reads_the_gemm_it_follows(co, monkeypatch, element, M, N, gen):
    """The padded-N path at M > 1 (the aligned kernel on N_pad, then unpad_rows as its programmatic dependent on
    Hopper), forced where the any-N kernel would run: three calls back to back into one ``out``, each on other
    operands, leave the last call's exact result (a copy that ran ahead of its GEMM would leave an earlier one's)."""
    from cutlass_ops.cutlass import plan as plan_module

    monkeypatch.setattr(plan_module.Int8Gemm, "any_n_for", lambda self, M, N, device: None)
    name = {"s32": "none", "s8": "requant", "f16": "dequant"}[element]
    dtype = epilogues.OUTPUT_DTYPES[element]
    inputs = _epilogue_inputs(name, M, N, gen)
    B = _int8(N, 4096, generator=gen)
    As = [_int8(M, 4096, generator=gen) for _ in range(3)]
    out = torch.empty(M, N, dtype=dtype, device="cuda")
    for A in As:
        co.int8_gemm(A, B, name, out=out, **inputs)
    _check(out, As[-1], B, name, element, inputs)
    D = co.int8_gemm(As[0], B, name, out_dtype=dtype, **inputs)
    _check(D, As[0], B, name, element, inputs)
    from custom_kernels import host_ext
    if host_ext.load() is None:
        return
    # The C++ path takes the same call again (B's and the inputs' padded copies registered by the Python path)
    def python_path(*args, **kwargs):
        raise AssertionError("the padded-N call went through Python, not the C++ path")
    monkeypatch.setattr(plan_module.Int8Gemm, "_run_padded", python_path)
    out.fill_(0)
    co.int8_gemm(As[-1], B, name, out=out, **inputs)
    _check(out, As[-1], B, name, element, inputs)


@pytest.mark.parametrize("M,N,padded", [(64, 1000, True), (2, 4097, True), (33, 257, True), (128, 257, False),
                                        (1024, 257, False), (1024, 1000, True), (1024, 4097, False)])
def test_hopper_pads_N_at_small_M_and_keeps_any_N_where_it_won(co, M, N, padded, gen):
    """Sm90 plans (cutlass/plan.py ``pads_N``): an unaligned N at M <= 64 runs on the aligned kernel over N padded
    (B's copy kept, D out of D_pad by unpad_rows), and at M = 1024 for N = 1000 (a long any-N grid, no extra wave
    padded); at M = 128 / 1024 with N = 257 and M = 1024 with N = 4097 (136 padded tiles: a second wave on an
    H100 / H200) the any-N kernel; while a graph is captured always the any-N kernel. Exact results either way.
    (The rule's thresholds count SMs: on a GPU of other SM counts some of these cases may differ.)"""
    from custom_kernels.device import sm_count

    if sm_count(0) != 132 and M == 1024:
        pytest.skip(f"the M = 1024 cases assume 132 SMs (this GPU: {sm_count(0)})")
    from cutlass_ops.cutlass import padding, plan_for

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the padded-N rule beyond M = 1 is Hopper's (Sm90 plans)")
    A, B = _int8(M, 512, generator=gen), _int8(N, 512, generator=gen)
    inputs = _epilogue_inputs("requant", M, N, gen)
    plan = plan_for(M, torch.cuda.current_device(), "requant", None, torch.int8)
    assert (plan.any_n_for(M, N, 0) is None) == padded
    D = co.int8_gemm(A, B, "requant", **inputs)
    _check(D, A, B, "requant", "s8", inputs)
    assert bool(padding._padded.get(B)) == padded
    B2 = B.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert plan.any_n_for(M, N, 0) is not None
        G = co.int8_gemm(A, B2, "requant", **inputs)
    graph.replay()
    torch.cuda.synchronize()
    assert padding._padded.get(B2) is None
    _check(G, A, B2, "requant", "s8", inputs)
