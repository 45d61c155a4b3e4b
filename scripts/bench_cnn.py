"""End to end: a ResNet-50-shaped CNN (random weights, BatchNorm folded) in fp16 (cuDNN) and with
int4 / int8 weight-only convs (``cutlass_ops.quantize_(model, WeightOnlyConfig(...))``).

Reports, side by side in one run: images/s at batch 1 and 32 (224 x 224, channels_last), eager and
``torch.compile(mode="reduce-overhead")``; the weights' GPU memory; SQNR of the logits against the fp16
model. Layers a mode cannot take stay cuDNN (at block 128 the 7x7 stem, K = Kh*Kw*Ci = 147, which 128 does
not divide); the table says how many layers each mode converted.

    python scripts/bench_cnn.py [--quick] [--out PATH]
"""
from __future__ import annotations

import argparse
import gc
import logging
from pathlib import Path

import torch
from _timing import call_us, table, write_report
from torch import nn

import cutlass_ops
from cutlass_ops.quantize_model import WeightOnlyConfig

log = logging.getLogger("bench_cnn")

MODES = {
    "fp16 cuDNN": None,
    "int8 weights (per Ci)": WeightOnlyConfig(bits=8, block_size=None),
    "int4 weights (block 32)": WeightOnlyConfig(bits=4, block_size=32),
    "int4 weights (per Ci)": WeightOnlyConfig(bits=4, block_size=None),
}


def conv_bn(ci, co, k, stride=1):
    return nn.Sequential(nn.Conv2d(ci, co, k, stride, k // 2, bias=False), nn.BatchNorm2d(co))


class Bottleneck(nn.Module):
    def __init__(self, ci, width, stride):
        super().__init__()
        co = width * 4
        self.body = nn.Sequential(conv_bn(ci, width, 1), nn.ReLU(inplace=True), conv_bn(width, width, 3, stride),
                                  nn.ReLU(inplace=True), conv_bn(width, co, 1))
        self.skip = conv_bn(ci, co, 1, stride) if stride != 1 or ci != co else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(classes=1000):
    layers, ci = [conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(ci, width, stride if i == 0 else 1))
            ci = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ci, classes)]
    return nn.Sequential(*layers)


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Replace each (Conv2d, BatchNorm2d) pair by one Conv2d with the BN folded in (inference)."""
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Sequential) and len(m) == 2 and isinstance(m[0], nn.Conv2d) and isinstance(m[1],
                                                                                                       nn.BatchNorm2d):
            conv, bn = m
            s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            fused = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                              bias=True, device=conv.weight.device)
            fused.weight.data = conv.weight * s[:, None, None, None]
            fused.bias.data = bn.bias - bn.running_mean * s
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, fused)
    return model


def build(mode: str):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = resnet50()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics so the folding matters
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    model = fold_batchnorm(model.eval()).half().to(memory_format=torch.channels_last)
    converted = 0
    if MODES[mode] is not None:
        summary = cutlass_ops.quantize_(model, MODES[mode])
        log.info("%s: %s", mode, summary)
        converted = len(summary.converted)
    return model, converted


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def sqnr_db(y, ref) -> float:
    noise = (y.float() - ref.float()).pow(2).mean()
    return float(10 * torch.log10(ref.float().pow(2).mean() / noise.clamp_min(1e-30)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, batch 1 and 8")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_cnn.md")
    parser.add_argument("-v", action="store_true", help="INFO logs (quantize_ summaries)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.v else logging.WARNING)
    torch.backends.cudnn.benchmark = True
    batches, iters = ((1, 8), 5) if args.quick else ((1, 32), 30)
    gen = torch.Generator(device="cuda").manual_seed(1)
    images = {b: torch.randn(b, 3, 224, 224, device="cuda", dtype=torch.float16, generator=gen).to(
        memory_format=torch.channels_last) for b in batches}
    rows, ref, notes = [], None, []
    for mode in MODES:
        try:
            model, converted = build(mode)
            row = [mode, converted]
            with torch.no_grad():
                out = model(images[batches[0]])
                compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
                for b in batches:
                    x = images[b]
                    row.append(b * 1e6 / call_us(lambda: model(x), iters=iters, warmup=3))

                    def graphed():
                        torch.compiler.cudagraph_mark_step_begin()
                        return compiled(x)
                    row.append(b * 1e6 / call_us(graphed, iters=iters, warmup=5))
            row += [weight_bytes(model) / 2**20, sqnr_db(out, ref) if ref is not None else float("inf")]
        except Exception as e:  # one mode failing must not lose the others' numbers
            log.exception("mode %s failed", mode)
            notes.append(f"{mode}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
            continue
        finally:
            torch._dynamo.reset()
        if ref is None:
            ref = out
        rows.append(row)
        del model
        gc.collect()
        torch.cuda.empty_cache()
    header = ["weights", "layers quantized"]
    for b in batches:
        header += [f"b{b} eager img/s", f"b{b} compiled img/s"]
    header += ["weights MiB", "SQNR dB vs fp16"]
    fmt = [[r[0], r[1], *(f"{v:.1f}" for v in r[2:])] for r in rows]
    lines = ["ResNet-50-shaped CNN (BatchNorm folded into the convs), 224 x 224, fp16 channels_last activations; "
             "compiled = torch.compile(mode=\"reduce-overhead\", fullgraph=True). Layers a mode cannot take stay "
             "cuDNN / cuBLAS.", "", table(header, fmt), ""] + [f"- {n}" for n in notes]
    write_report(lines, out=args.out, bench="bench_cnn")


if __name__ == "__main__":
    main()
