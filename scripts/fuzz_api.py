"""Bad inputs through the public API: each must raise a Python exception naming the argument.

:func:`make_cases` builds the cases (wrong dtype, device, rank, shape, stride, overlapping or
aliasing ``out``, NaN/Inf scales, out-of-range int4 values, mismatched ``QuantizedWeight`` fields,
unknown options) on a device; ``tests/test_fuzz_api.py`` runs them on the CPU (those that fail
before the GPU check) and ``tests/gpu/test_fuzz_api_gpu.py`` on a GPU, each followed by a valid
call. Run on a GPU machine, this script writes the table (case, argument, exception, message,
verdict) to ``scripts/results/<gpu>/fuzz_api.md``:

    python scripts/fuzz_api.py [--out PATH]
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

NEEDS_GPU = "needs an NVIDIA GPU"


@dataclass(frozen=True)
class Case:
    name: str  # the test id
    argument: str  # the word the exception's message must contain
    call: Callable[[], object]
    gpu_only: bool = False  # a device mismatch: needs two devices (CPU and CUDA)


@dataclass
class Outcome:
    case: Case
    exc_type: str  # "" when nothing was raised
    message: str

    @property
    def verdict(self) -> str:
        if not self.exc_type:
            return "NOT CAUGHT (no exception)"
        if NEEDS_GPU in self.message:
            return "needs a GPU to reach its check"
        if self.argument_named:
            return "ok"
        return "raised, argument not named"

    @property
    def argument_named(self) -> bool:
        return self.case.argument.lower() in self.message.lower()


def run_case(case: Case) -> Outcome:
    try:
        case.call()
    except Exception as exc:  # noqa: BLE001 - the point is to record what was raised
        return Outcome(case, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    return Outcome(case, "", "")


def _inputs(device: str) -> dict:
    import cutlass_ops as co

    g = torch.Generator().manual_seed(0)
    dtype = torch.float16 if device != "cpu" else torch.float32
    W = torch.randn(64, 128, generator=g)
    W_conv = torch.randn(64, 32, 3, 3, generator=g)
    return {
        "qw8": co.quantize_weight(W, bits=8, block_size=32).to(device),
        "qw4": co.quantize_weight(W, bits=4, block_size=32).to(device),
        "qwc": co.quantize_conv_weight(W_conv, bits=8).to(device),
        "x": torch.randn(4, 128, generator=g).to(device, dtype),
        "xc": torch.randn(2, 32, 8, 8, generator=g).to(device, dtype),
        "A": torch.randint(-3, 4, (16, 64), generator=g, dtype=torch.int8).to(device),
        "B": torch.randint(-3, 4, (32, 64), generator=g, dtype=torch.int8).to(device),
        "sr": torch.rand(16, generator=g).to(device), "sc": torch.rand(32, generator=g).to(device),
        "W": W, "dtype": dtype, "device": device,
    }


def _with(qw, **fields):
    """A copy of ``qw`` with fields replaced behind validate()'s back (as a user mutating it would)."""
    out = object.__new__(type(qw))
    out.__dict__.update(qw.__dict__)
    out.__dict__.update(fields)
    return out


def _nan(t: torch.Tensor, value=float("nan")) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[0] = value
    return t


def make_cases(device: str) -> list[Case]:
    """Every bad-input case, built on ``device`` ("cpu" or "cuda")."""
    import cutlass_ops as co
    from cutlass_ops.formats import pack_int4

    v = _inputs(device)
    qw8, qw4, qwc, x, xc, A, B, sr, sc = (v[k] for k in ("qw8", "qw4", "qwc", "x", "xc", "A", "B", "sr", "sc"))
    other = "cpu" if device != "cpu" else "meta"
    c: list[Case] = []

    def add(name, argument, call, gpu_only=False):
        c.append(Case(name, argument, call, gpu_only))

    # linear
    add("linear-x-int32", "x", lambda: co.linear(x.to(torch.int32), qw8))
    add("linear-x-wrong-K", "x", lambda: co.linear(x[:, :96], qw8))
    add("linear-x-0d", "x", lambda: co.linear(x[0, 0], qw8))
    add("linear-qw-tensor", "qw", lambda: co.linear(x, qw8.qweight))
    add("linear-bias-shape", "bias", lambda: co.linear(x, qw8, torch.zeros(63, device=device, dtype=x.dtype)))
    add("linear-bias-int", "bias", lambda: co.linear(x, qw8, torch.zeros(64, device=device, dtype=torch.int32)))
    add("linear-act-unknown", "activation", lambda: co.linear(x, qw8, activation="gelu"))
    add("linear-act-code", "activation", lambda: co.linear(x, qw8, activation=7))
    add("linear-act-type", "activation", lambda: co.linear(x, qw8, activation=[1]))
    add("linear-unknown-option", "split", lambda: co.linear(x, qw8, split=4))
    add("linear-scale-nan", "scale", lambda: co.linear(x, _with(qw8, scale=_nan(qw8.scale))))
    add("linear-scale-inf", "scale", lambda: co.linear(x, _with(qw8, scale=_nan(qw8.scale, float("inf")))))
    add("linear-offset-nan", "offset", lambda: co.linear(x, _with(qw8, offset=_nan(qw8.offset))))
    add("linear-qw-N-mismatch", "N", lambda: co.linear(x, _with(qw8, N=65)))
    add("linear-qw-K-mismatch", "K", lambda: co.linear(x, _with(qw8, K=96)))
    add("linear-qw-bits-5", "bits", lambda: co.linear(x, _with(qw8, bits=5)))
    add("linear-qw-block-48", "block_size", lambda: co.linear(x, _with(qw8, block_size=48)))
    add("linear-qw-scale-f16", "scale", lambda: co.linear(x, _with(qw8, scale=qw8.scale.half())))
    add("linear-qw-scale-shape", "scale", lambda: co.linear(x, _with(qw8, scale=qw8.scale[:, :2])))
    add("linear-qw-qweight-uint8", "qweight", lambda: co.linear(x, _with(qw8, qweight=qw8.qweight.view(torch.uint8))))
    add("linear-qw4-qweight-int8", "qweight", lambda: co.linear(x, _with(qw4, qweight=qw4.qweight.view(torch.int8))))
    add("linear-qw-qweight-strided", "qweight",
        lambda: co.linear(x, _with(qw8, qweight=torch.empty(128, 64, dtype=torch.int8, device=device).t())))
    add("linear-x-other-device", "x", lambda: co.linear(x.to(other), qw8), gpu_only=True)
    add("linear-bias-other-device", "bias", lambda: co.linear(x, qw8, torch.zeros(64).to(other)), gpu_only=True)
    add("linear-qw-other-device", "qw", lambda: co.linear(x, qw8.to(other)), gpu_only=True)
    # conv2d
    add("conv-x-3d", "x", lambda: co.conv2d(xc[0], qwc))
    add("conv-x-int", "x", lambda: co.conv2d(xc.to(torch.int32), qwc))
    add("conv-qw-linear", "conv_shape", lambda: co.conv2d(xc, qw8))
    add("conv-stride-0", "stride", lambda: co.conv2d(xc, qwc, stride=0))
    add("conv-stride-3tuple", "stride", lambda: co.conv2d(xc, qwc, stride=(1, 2, 3)))
    add("conv-padding-neg", "padding", lambda: co.conv2d(xc, qwc, padding=-1))
    add("conv-dilation-0", "dilation", lambda: co.conv2d(xc, qwc, dilation=0))
    add("conv-channels", "x", lambda: co.conv2d(xc[:, :16], qwc))
    add("conv-bias-shape", "bias", lambda: co.conv2d(xc, qwc, torch.zeros(3, device=device, dtype=xc.dtype)))
    add("conv-act", "activation", lambda: co.conv2d(xc, qwc, activation="swish"))
    add("conv-too-small", "x", lambda: co.conv2d(xc[:, :, :1, :1], qwc))
    add("conv-stride-float", "stride", lambda: co.conv2d(xc, qwc, stride=1.5))
    add("conv-scale-nan", "scale", lambda: co.conv2d(xc, _with(qwc, scale=_nan(qwc.scale))))
    # linear_w8a8
    add("w8a8-qw-int4", "qw", lambda: co.linear_w8a8(x, qw4))
    add("w8a8-path", "path", lambda: co.linear_w8a8(x, qw8, path="bogus"))
    add("w8a8-x-int8", "x", lambda: co.linear_w8a8(x.to(torch.int8), qw8))
    add("w8a8-x-wrong-K", "x", lambda: co.linear_w8a8(x[:, :64], qw8))
    add("w8a8-bias-shape", "bias", lambda: co.linear_w8a8(x, qw8, torch.zeros(1, device=device, dtype=x.dtype)))
    add("w8a8-scale-inf", "scale", lambda: co.linear_w8a8(x, _with(qw8, scale=_nan(qw8.scale, float("inf")))))
    add("w8a8-unknown-option", "block", lambda: co.linear_w8a8(x, qw8, block=64))
    # int8_gemm
    add("gemm-A-float", "A", lambda: co.int8_gemm(A.float(), B))
    add("gemm-B-float", "B", lambda: co.int8_gemm(A, B.float()))
    add("gemm-A-3d", "A", lambda: co.int8_gemm(A[None], B))
    add("gemm-K-mismatch", "K", lambda: co.int8_gemm(A, B[:, :48]))
    add("gemm-A-list", "A", lambda: co.int8_gemm(A.tolist(), B))
    add("gemm-epilogue-unknown", "epilogue", lambda: co.int8_gemm(A, B, "bogus"))
    add("gemm-epilogue-int", "epilogue", lambda: co.int8_gemm(A, B, 3))
    add("gemm-arch-str", "arch", lambda: co.int8_gemm(A, B, arch="sm_xx"))
    add("gemm-arch-bool", "arch", lambda: co.int8_gemm(A, B, arch=True))
    add("gemm-out-dtype-str", "out_dtype", lambda: co.int8_gemm(A, B, out_dtype="float"))
    add("gemm-out-shape", "out", lambda: co.int8_gemm(A, B, out=torch.empty(16, 31, dtype=torch.int32, device=device)))
    add("gemm-out-dtype", "out", lambda: co.int8_gemm(A, B, out=torch.empty(16, 32, dtype=torch.float64, device=device)))
    add("gemm-out-strided", "out",
        lambda: co.int8_gemm(A, B, out=torch.empty(32, 16, dtype=torch.int32, device=device).t()))
    add("gemm-out-overlapping", "out",
        lambda: co.int8_gemm(A, B, out=torch.empty(1, 32, dtype=torch.int32, device=device).expand(16, 32)))
    add("gemm-out-aliases-A", "out",
        lambda: co.int8_gemm(A, B[:16], out=A.view(torch.int32)))
    add("gemm-out-other-device", "out",
        lambda: co.int8_gemm(A, B, out=torch.empty(16, 32, dtype=torch.int32).to(other)), gpu_only=True)
    add("gemm-B-other-device", "B", lambda: co.int8_gemm(A, B.to(other)), gpu_only=True)
    add("gemm-dequant-missing", "scale_row", lambda: co.int8_gemm(A, B, "dequant", scale_col=sc))
    add("gemm-dequant-row-size", "scale_row", lambda: co.int8_gemm(A, B, "dequant", scale_row=sr[:5], scale_col=sc))
    add("gemm-dequant-row-f16", "scale_row", lambda: co.int8_gemm(A, B, "dequant", scale_row=sr.half(), scale_col=sc))
    add("gemm-dequant-col-nan", "scale_col", lambda: co.int8_gemm(A, B, "dequant", scale_row=sr, scale_col=_nan(sc)))
    add("gemm-dequant-unknown-input", "foo", lambda: co.int8_gemm(A, B, "dequant", scale_row=sr, scale_col=sc, foo=sr))
    # any N and K run on padded operands (cutlass/padding.py): its checks name the caller's sizes
    add("gemm-padded-col-size", "scale_col",
        lambda: co.int8_gemm(A[:, :40], B[:3, :40], "dequant", scale_row=sr, scale_col=sc))
    add("gemm-padded-out-shape", "out", lambda: co.int8_gemm(A, B[:3], out=torch.empty(16, 4, dtype=torch.int32,
                                                                                         device=device)))
    # int8_gemm_requant
    ms, fb = torch.rand(32, device=device), torch.zeros(32, device=device)
    add("requant-M_scale-f16", "M_scale", lambda: co.int8_gemm_requant(A, B, ms.half(), fb))
    add("requant-fused_bias-shape", "fused_bias", lambda: co.int8_gemm_requant(A, B, ms, fb[:4]))
    add("requant-clamp-order", "clamp", lambda: co.int8_gemm_requant(A, B, ms, fb, clamp=(10, -10)))
    add("requant-clamp-len", "clamp", lambda: co.int8_gemm_requant(A, B, ms, fb, clamp=(0,)))
    add("requant-clamp-range", "clamp", lambda: co.int8_gemm_requant(A, B, ms, fb, clamp=(-200, 0)))
    add("requant-M_scale-nan", "M_scale", lambda: co.int8_gemm_requant(A, B, _nan(ms), fb))
    # quantize_activation / quantize_weight / pack_int4
    add("quant-act-int", "x", lambda: co.quantize_activation(A))
    add("quant-act-3d", "x", lambda: co.quantize_activation(x[None]))
    add("quant-act-block-0", "block_size", lambda: co.quantize_activation(x, 0))
    add("quant-act-block-divides", "block_size", lambda: co.quantize_activation(x, 48))
    add("quant-w-3d", "w", lambda: co.quantize_weight(v["W"][None]))
    add("quant-w-bits-3", "bits", lambda: co.quantize_weight(v["W"], bits=3))
    add("quant-w-block", "block_size", lambda: co.quantize_weight(v["W"], block_size=48))
    add("quant-w-method", "method", lambda: co.quantize_weight(v["W"], method="bogus"))
    add("quant-w-options", "options", lambda: co.quantize_weight(v["W"], options={"bogus": 1}))
    add("quant-w-nan", "w", lambda: co.quantize_weight(_nan(v["W"])))
    add("pack-int4-range", "q", lambda: pack_int4(torch.full((4, 8), 9, dtype=torch.int8)))
    add("qw-ctor-int4-values", "qweight",
        lambda: co.QuantizedWeight(torch.zeros(4, 8, dtype=torch.int8), torch.ones(4, 1), torch.zeros(4, 1), 4, 8, 4, 8))
    add("qw-ctor-N-0", "N",
        lambda: co.QuantizedWeight(torch.zeros(0, 8, dtype=torch.int8), torch.ones(0, 1), torch.zeros(0, 1), 8, 8, 0, 8))
    c += _module_cases(device, v)
    return c


def _module_cases(device: str, v: dict) -> list[Case]:
    """cutlass_ops.nn.QuantLinear / QuantConv2d, when the package has them."""
    try:
        from cutlass_ops.nn import QuantConv2d, QuantLinear
    except ImportError:
        return []
    x, xc = v["x"], v["xc"]
    return [
        Case("nn-linear-mode", "mode", lambda: QuantLinear(128, 64, mode="bogus")),
        Case("nn-linear-features", "in_features", lambda: QuantLinear(0, 64)),
        Case("nn-linear-input", "x", lambda: QuantLinear(128, 64).to(device)(x[:, :96])),
        Case("nn-conv-kernel-size", "kernel_size", lambda: QuantConv2d(32, 64, 0)),
        Case("nn-conv-input", "x", lambda: QuantConv2d(32, 64, 3).to(device)(xc[:, :16])),
    ]


def main() -> None:
    from _timing import table, write_report  # scripts/ is on sys.path when this file runs as a script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fuzz_api.py needs a GPU (the CPU cases run in tests/test_fuzz_api.py)")
    import cutlass_ops as co

    valid = _inputs("cuda")
    rows, bad = [], 0
    for case in make_cases("cuda"):
        out = run_case(case)
        co.linear(valid["x"], valid["qw8"])  # a valid call after each: no sticky CUDA error
        co.int8_gemm(valid["A"], valid["B"])
        torch.cuda.synchronize()
        bad += out.verdict != "ok"
        rows.append([case.name, case.argument, out.exc_type or "-", out.message.replace("|", "/") or "-", out.verdict])
    summary = f"{len(rows)} cases, {len(rows) - bad} ok, {bad} not caught or not naming the argument"
    write_report([summary, "", table(["case", "argument", "exception", "message", "verdict"], rows)],
                 out=args.out, bench="fuzz_api")
    print(summary)


if __name__ == "__main__":
    main()
