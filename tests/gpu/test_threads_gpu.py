"""Two threads calling ``linear``, ``int8_gemm`` and ``linear_w8a8`` on their own streams with shared
weights for 10^4 calls each get exactly the single-threaded results (under ~30 s on an H100)."""
from __future__ import annotations

import threading

import pytest
import torch

pytestmark = pytest.mark.gpu

CALLS = 10_000
SHAPES = (1, 3, 17, 64)  # M: GEMV and GEMM strategies, per-M plans built concurrently


@pytest.fixture(scope="module")
def setup():
    import cutlass_ops as co

    g = torch.Generator().manual_seed(0)
    W = torch.randn(256, 512, generator=g)
    qw4 = co.quantize_weight(W, bits=4, block_size=128).to("cuda")
    qw8 = co.quantize_weight(W, bits=8, block_size=128).to("cuda")
    B = torch.randint(-8, 8, (256, 512), generator=g, dtype=torch.int8).cuda()
    xs = {M: torch.randn(M, 512, generator=g).cuda().half() for M in SHAPES}
    As = {M: torch.randint(-8, 8, (M, 512), generator=g, dtype=torch.int8).cuda() for M in SHAPES}
    ops = {
        "linear": lambda M: co.linear(xs[M], qw4),
        "int8_gemm": lambda M: co.int8_gemm(As[M], B),
        "linear_w8a8": lambda M: co.linear_w8a8(xs[M], qw8),
    }
    # single-threaded results, computed before any plan exists in the other threads
    ref = {(name, M): fn(M).clone() for name, fn in ops.items() for M in SHAPES}
    torch.cuda.synchronize()
    return ops, ref


def test_two_threads_on_their_own_streams(setup):
    ops, ref = setup
    keys = [(name, M) for name in ops for M in SHAPES]
    errors: list[str] = []

    def worker(tid: int):
        stream = torch.cuda.Stream()
        mismatches = 0
        try:
            with torch.cuda.stream(stream):
                for i in range(CALLS):
                    name, M = keys[(i * 7 + tid) % len(keys)]
                    out = ops[name](M)
                    if i % 97 == 0 or i >= CALLS - len(keys):  # compare often, never sync every call
                        stream.synchronize()
                        mismatches += not torch.equal(out, ref[(name, M)])
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"thread {tid}: {type(exc).__name__}: {exc}")
        if mismatches:
            errors.append(f"thread {tid}: {mismatches} results differ from the single-threaded ones")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_threads_first_cuda_work_is_ours(setup):
    """A new thread whose first CUDA work is one of our launches (no torch stream or runtime call before it,
    as on autograd's device threads, where a backward formula launches our dequantize kernel): the
    launcher binds the primary context there instead of failing with CUDA_ERROR_INVALID_CONTEXT."""
    ops, ref = setup
    results, errors = {}, []

    def worker():
        try:
            for name, fn in ops.items():
                for M in SHAPES:
                    results[(name, M)] = fn(M)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for key, out in results.items():
        assert torch.equal(out, ref[key]), key
