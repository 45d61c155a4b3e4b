"""Call each public op once at ragged shapes, for compute-sanitizer (public API paths, CUTLASS included).

Every op of ``cutlass_ops`` (linear int4/int8 through each weight-only strategy the dispatch picks
for M = 1, 3, 17, 127; conv2d NCHW and channels_last; linear_w8a8 on each path; int8_gemm with
"none", "dequant" and a requant epilogue; int8_gemm_requant; quantize_activation) runs once at
shapes that are not tile multiples, then one line is printed. Build the kernels first (without the
sanitizer: NVRTC and nvcc under it are slow), then run it under each tool:

    python scripts/build_kernels.py && python scripts/sanitize_api.py      # warm the cache, check it runs
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 1 python scripts/sanitize_api.py
    compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 1 python scripts/sanitize_api.py

``CUTLASS_OPS_HOST_EXT=0`` also checks the Python launch path; ``--quick`` runs one M per op.
"""
from __future__ import annotations

import argparse
import sys

import torch


def calls(quick: bool):
    import cutlass_ops as co

    g = torch.Generator().manual_seed(0)
    Ms = (17,) if quick else (1, 3, 17, 127)
    N, K = 200, 384  # N not a multiple of 64/128 tiles; K = 3 blocks of 128
    W = torch.randn(N, K, generator=g)
    qw4 = co.quantize_weight(W, bits=4, block_size=128).to("cuda")
    qw8 = co.quantize_weight(W, bits=8, block_size=128).to("cuda")
    qwc = co.quantize_conv_weight(torch.randn(48, 32, 3, 3, generator=g), bits=8).to("cuda")
    bias = torch.randn(N, generator=g).cuda().half()
    Bq = torch.randint(-8, 8, (N, K), dtype=torch.int8, generator=g).cuda()
    perm = torch.randperm(K, generator=g).cuda()  # act-order: gemv_mma reads x through it (M <= 8)
    for M in Ms:
        x = torch.randn(M, K, generator=g).cuda().half()
        A = torch.randint(-8, 8, (M, K), dtype=torch.int8, generator=g).cuda()
        yield f"linear int4 M={M}", lambda: co.linear(x, qw4, bias, activation="relu")
        yield f"linear int8 M={M}", lambda: co.linear(x.bfloat16(), qw8)
        yield f"linear int4 act-order M={M}", lambda: co.linear(x, qw4, bias, perm=perm)
        for path in ("fused", "orchestrator", "literal"):
            yield f"linear_w8a8 {path} M={M}", lambda p=path: co.linear_w8a8(x, qw8, bias, path=p)
        yield f"int8_gemm none M={M}", lambda: co.int8_gemm(A, Bq[:192])
        yield f"int8_gemm dequant M={M}", lambda: co.int8_gemm(
            A, Bq[:192], "dequant", scale_row=torch.rand(M, device="cuda"), scale_col=torch.rand(192, device="cuda"),
            out_dtype=torch.float16)
        yield f"int8_gemm_requant M={M}", lambda: co.int8_gemm_requant(
            A, Bq[:192], torch.rand(192, device="cuda") / 512, torch.zeros(192, device="cuda"), clamp=(-100, 100))
        yield f"quantize_activation M={M}", lambda: co.quantize_activation(x, 128)
    xc = torch.randn(3, 32, 13, 11, generator=g).cuda().half()
    yield "conv2d NCHW", lambda: co.conv2d(xc, qwc, stride=2, padding=1)
    yield "conv2d channels_last", lambda: co.conv2d(xc.to(memory_format=torch.channels_last), qwc, padding=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sanitize_api.py needs a GPU")
    done, failed = 0, []
    for name, fn in calls(args.quick):
        try:
            fn()
            torch.cuda.synchronize()
            done += 1
        except Exception as exc:  # noqa: BLE001 - listed in the summary
            failed.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    print(f"sanitize_api: {done} calls ok, {len(failed)} failed" + "".join(f"\n  {f}" for f in failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
