#!/usr/bin/env python3
"""Host cost per call of the public entry points, layer by layer, and where it goes (cProfile).

On the GPU: for ``int8_gemm`` (dequant epilogue, f16 out, per kernel generation), ``linear``
(W4A16, M = 1), ``linear_w8a8`` (fused path) and ``quantize_activation``, prints the host time per
call of each layer (public API -> op -> plan -> kernel launch -> the bare driver launch) on a
problem small enough that the GPU keeps up, then the top functions of a cProfile run of the public
call. A benchmark (not a test):

    python3 scripts/profile_host.py       # -> scripts/results/<gpu>/profile_host.md (or --out)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import _timing
import torch

CALLS = 3000


def host_us(fn, calls: int = CALLS) -> float:
    return _timing.host_us(fn, iters=calls, warmup=100)


def profile(fn, calls: int = 2000, top: int = 18) -> str:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    text = out.getvalue()
    return text[text.find("ncalls"):] if "ncalls" in text else text


def int8_gemm_layers(arch: int, M: int, N: int, K: int) -> list[tuple[str, float]]:
    import cutlass_ops
    from cutlass_ops import cutlass as gemm
    from custom_kernels.launch import params_address

    A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
    B = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
    s_row, s_col = torch.rand(M, device="cuda"), torch.rand(N, device="cuda")
    bias = torch.rand(N, device="cuda")
    out = torch.empty(M, N, dtype=torch.float16, device="cuda")
    kw = dict(scale_row=s_row, scale_col=s_col, bias=bias)
    plan = gemm.get_plan(0, arch, "dequant", "f16", M)
    M_, N_, K_, pointers, scalars, _ = plan.launch_arguments(A, B, out, **dict(kw))
    kernel = plan.kernel
    state, params = kernel._params_for(M_, N_, K_, pointers, scalars, 0)
    stream = torch.cuda.current_stream().cuda_stream
    rows = [
        ("cutlass_ops.int8_gemm (public API)", host_us(lambda: cutlass_ops.int8_gemm(A, B, "dequant", arch=arch,
                                                                                       out_dtype=torch.float16, **kw))),
        ("cutlass_ops.int8_gemm(out=D) (public API, D given)", host_us(lambda: cutlass_ops.int8_gemm(
            A, B, "dequant", arch=arch, out=out, **kw))),
        ("cutlass_ops.cutlass.int8_gemm", host_us(lambda: gemm.int8_gemm(A, B, "dequant", arch=arch,
                                                                        out_dtype=torch.float16, **kw))),
        ("plan(A, B, **inputs) (allocates D)", host_us(lambda: plan(A, B, **kw))),
        ("plan(A, B, out=D, **inputs)", host_us(lambda: plan(A, B, out=out, **kw))),
        ("plan.launch_arguments only", host_us(lambda: plan.launch_arguments(A, B, out, **kw))),
        ("GemmKernel.launch(pointers)", host_us(lambda: kernel.launch(M_, N_, K_, pointers, scalars, device=0))),
        ("torch.empty(M, N) f16", host_us(lambda: torch.empty(M, N, dtype=torch.float16, device="cuda"))),
    ]
    # The bare driver launch of the same Params through a prebuilt LaunchShape.
    keep, params_addr = params_address(params)
    shape = kernel.launch_shape(state.grid, state.block, 0)
    rows.append(("LaunchShape.launch: cuLaunchKernelEx (ctypes)", host_us(lambda: shape.launch(stream, params_addr))))
    try:
        rows.append(("torch._int_mm (reference)", host_us(lambda: torch._int_mm(A, B.t()))))
    except RuntimeError as exc:
        rows.append((f"torch._int_mm: {exc}".splitlines()[0][:60], float("nan")))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/profile_host.md")
    p.add_argument("--archs", type=int, nargs="+", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    import cutlass_ops
    from cutlass_ops.formats import quantize_weight

    major, minor = torch.cuda.get_device_capability()
    cc = 10 * major + minor
    archs = args.archs or [a for a in (90, 80, 75) if a <= cc and (a != 90 or cc == 90)]
    lines = [f"# Host cost per call on {torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}; {CALLS} back-to-back calls on problems the GPU keeps up with; us per call.", ""]
    M, N, K = 32, 1024, 1024
    for arch in archs:
        lines += [f"## int8_gemm, dequant epilogue, f16 out, Sm{arch} kernel (M={M}, N={N}, K={K})", "",
                  "| layer | host us |", "|---|---|"]
        for name, us in int8_gemm_layers(arch, M, N, K):
            lines.append(f"| {name} | {us:.1f} |")
        lines.append("")
        print("\n".join(lines[-14:]), flush=True)

    A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
    B = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda")
    kw = dict(scale_row=torch.rand(M, device="cuda"), scale_col=torch.rand(N, device="cuda"),
              bias=torch.rand(N, device="cuda"))
    lines += ["### cProfile: cutlass_ops.int8_gemm (default arch), 2000 calls", "", "```",
              profile(lambda: cutlass_ops.int8_gemm(A, B, "dequant", out_dtype=torch.float16, **kw)), "```", ""]

    x1 = torch.randn(1, K, device="cuda", dtype=torch.float16)
    qw4 = quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=4, block_size=128)
    qw8 = quantize_weight(torch.randn(N, K, device="cuda") * 0.02, bits=8, block_size=128)
    from cutlass_ops import weight_only as wo

    x16 = torch.randn(16, K, device="cuda", dtype=torch.float16)
    plan4 = wo.get_plan(qw4, 1, torch.float16, x1.device.index)
    out1 = torch.empty(1, N, device="cuda", dtype=torch.float16)
    rows = [
        ("cutlass_ops.linear W4A16 M=1", host_us(lambda: cutlass_ops.linear(x1, qw4))),
        ("weight_only.linear_weight_only W4A16 M=1", host_us(lambda: wo.linear_weight_only(x1, qw4))),
        ("weight_only plan(x, out) W4A16 M=1 (cached plan, launch)", host_us(lambda: plan4(x1, 0, 0, out1))),
        ("cutlass_ops.linear_w8a8 fused M=16", host_us(lambda: cutlass_ops.linear_w8a8(x16, qw8))),
        ("cutlass_ops.quantize_activation M=16", host_us(lambda: cutlass_ops.quantize_activation(x16, 128))),
        ("torch.matmul fp16 M=1 (reference)", host_us(lambda: torch.matmul(x1, x1.new_empty(N, K).T))),
    ]
    lines += [f"## Other entry points (N={N}, K={K})", "", "| call | host us |", "|---|---|"]
    lines += [f"| {name} | {us:.1f} |" for name, us in rows]
    lines += ["", "### cProfile: cutlass_ops.linear W4A16 M=1, 2000 calls", "", "```",
              profile(lambda: cutlass_ops.linear(x1, qw4)), "```", "",
              "### cProfile: cutlass_ops.linear_w8a8 fused M=16, 2000 calls", "", "```",
              profile(lambda: cutlass_ops.linear_w8a8(x16, qw8)), "```", ""]
    _timing.write_report(lines, args.out, "profile_host")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
