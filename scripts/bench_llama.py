"""End to end: a Llama-style decoder (random weights) in fp16 and with every quantization mode.

The model: hidden 4096, 32 query heads and 8 KV heads of 128 (grouped-query attention through
``scaled_dot_product_attention``), a static KV cache, RoPE, RMSNorm, SwiGLU MLP 14336; 8 layers
(``--layers``). For each mode - fp16 (cuBLAS), W4A16 and W8A16 (weight-only, block 128), W8A8 per
channel (int8 per-token activations, CUTLASS int8 GEMM + dequant epilogue), W8A8 per K block
(scheme 2, fused), torchao's Int4WeightOnlyConfig where torchao imports, and a probe with every
linear replaced by an uninitialized output of its shape (the rest of the step: attention, norms, RoPE,
SwiGLU, KV-cache writes, which bound any weight format's speed-up) - one run reports
side by side: the decode step (one token) at batch 1 and 16, eager and
``torch.compile(mode="reduce-overhead")``; prefill of 2048 tokens at batch 1, eager and compiled;
the weights' GPU memory; SQNR of the prefill output against the fp16 model. A second table: the
host time of one QuantLinear call at M = 1 against nn.Linear fp16 (target <= 1.2x).

The MLP's gate and up projections are two linears (``--mlp separate``, the default: the layout of a Hugging
Face Llama checkpoint) or one of twice the width whose output is split (``--mlp fused``: the layout vLLM and
TensorRT-LLM load them into, one launch instead of two per layer); the QKV projection is one linear either way.

``--inductor-pdl`` sets ``torch._inductor.config.triton.enable_pdl`` for every mode (inductor's Triton kernels
launched as programmatic dependents that trigger theirs early; what vLLM turns on for decode under full CUDA graphs):
the GEMVs of the weight-only modes, themselves programmatic dependents on Hopper, then start their weight loads while
inductor's norms and activations run.

    python scripts/bench_llama.py [--quick] [--mlp separate|fused] [--inductor-pdl] [--out PATH]
    python scripts/bench_llama.py --host-only      # the host-time table alone (under a minute)
"""
from __future__ import annotations

import argparse
import copy
import gc
import logging
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _timing import call_us, host_us, table, write_report
from torch import nn

import cutlass_ops
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8BlockScaledConfig, W8A8ChannelConfig, WeightOnlyConfig

log = logging.getLogger("bench_llama")

MODES = {
    "fp16": None,
    "W4A16": WeightOnlyConfig(bits=4, block_size=128),
    "W8A16": WeightOnlyConfig(bits=8, block_size=128),
    "W8A8 per channel": W8A8ChannelConfig(),
    "W8A8 per K block": W8A8BlockConfig(block_size=128, path="fused"),
    "torchao int4 tinygemm bf16": "torchao",
    "no linears (rest of the step)": "skip",
}


class NoLinear(nn.Module):
    """The "no linears" probe: the layer's output shape, uninitialized (no kernel, no weight read), so the
    row times everything of the step except the linears - what no weight format can shrink."""

    def __init__(self, out_features: int):
        super().__init__()
        self.out_features = out_features

    def forward(self, x):
        return x.new_empty(*x.shape[:-1], self.out_features)


def strip_linears(model: nn.Module) -> None:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, NoLinear(child.out_features))


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, batch: int, max_len: int, dtype):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        shape = (batch, kv_heads, max_len, self.hd)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = rope(q.view(B, T, self.heads, self.hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, self.kv_heads, self.hd), cos[:, None], sin[:, None])
        # The new keys / values scattered into the caches in place ([B, T, kv_heads, hd] at [b, :, pos]):
        # written as index_copy_ on the batch slice, torch.compile copies the whole slice (2 x 2 kernels of
        # 1-3.5 us per layer measured at batch 1 on an H100: scripts/profile_decode.py).
        rows = torch.arange(B, device=x.device)[:, None]
        self.k_cache[rows, :, pos[None, :]] = k
        self.v_cache[rows, :, pos[None, :]] = v.view(B, T, self.kv_heads, self.hd)
        a = F.scaled_dot_product_attention(q, self.k_cache[:B], self.v_cache[:B], attn_mask=mask, enable_gqa=True)
        return self.o(a.transpose(1, 2).reshape(B, T, -1))


def rope(t, cos, sin):
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1)


class Layer(nn.Module):
    def __init__(self, d, mlp, heads, kv_heads, batch, max_len, dtype, fused_mlp=False):
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.attn = Attention(d, heads, kv_heads, batch, max_len, dtype)
        if fused_mlp:  # rows [0, mlp) gate, [mlp, 2 mlp) up
            self.gate_up = nn.Linear(d, 2 * mlp, bias=False)
        else:
            self.gate, self.up = nn.Linear(d, mlp, bias=False), nn.Linear(d, mlp, bias=False)
        self.down = nn.Linear(mlp, d, bias=False)

    def forward(self, x, pos, cos, sin, mask):
        x = x + self.attn(self.n1(x), pos, cos, sin, mask)
        h = self.n2(x)
        if hasattr(self, "gate_up"):
            gate, up = self.gate_up(h).chunk(2, dim=-1)
        else:
            gate, up = self.gate(h), self.up(h)
        return x + self.down(F.silu(gate) * up)


class Decoder(nn.Module):
    """Hidden states in, hidden states out (no embedding / LM head: those are not quantized)."""

    def __init__(self, layers=8, d=4096, mlp=14336, heads=32, kv_heads=8, batch=16, max_len=2048 + 64,
                 dtype=torch.float16, fused_mlp=False):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, mlp, heads, kv_heads, batch, max_len, dtype, fused_mlp)
                                    for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd // 2, dtype=torch.float32) / (hd // 2)))
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", angles.cos().to(dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(dtype), persistent=False)

    def forward(self, x, pos):
        cos, sin = self.cos[pos], self.sin[pos]
        # causal over the cache, built once per step for every layer
        mask = torch.arange(self.layers[0].attn.k_cache.shape[2], device=x.device)[None, :] <= pos[:, None]
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.norm(x)


def build(args, mode: str):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Decoder(layers=args.layers, max_len=args.prefill + 64,
                        fused_mlp=args.mlp == "fused").half().eval()
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[1]))
    config = MODES[mode]
    if config == "torchao":  # tinygemm takes bf16 activations only: this column runs the model in bf16
        from torchao.quantization import Int4WeightOnlyConfig, quantize_
        model = model.to(torch.bfloat16)
        quantize_(model, Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d"))
    elif config == "skip":
        strip_linears(model)
    elif config is not None:
        summary = cutlass_ops.quantize_(model, config)
        log.info("%s: %s", mode, summary)
    return model


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for n, t in list(model.named_parameters()) + list(model.named_buffers())
               if "cache" not in n and n not in ("cos", "sin"))


def sqnr_db(y, ref) -> float:
    noise = (y.float() - ref.float()).pow(2).mean()
    return float(10 * torch.log10(ref.float().pow(2).mean() / noise.clamp_min(1e-30)))


def measure(model, args, ref_out):
    d, dtype = 4096, model.cos.dtype
    gen = torch.Generator(device="cuda").manual_seed(1)  # the same inputs for every mode
    row, x_pre = {}, torch.randn(1, args.prefill, d, device="cuda", dtype=torch.float16, generator=gen).to(dtype)
    pos_pre = torch.arange(args.prefill, device="cuda")
    with torch.no_grad():
        out = model(x_pre[:, :args.sqnr_tokens], pos_pre[:args.sqnr_tokens])
        row["sqnr"] = sqnr_db(out, ref_out) if ref_out is not None else float("inf")
        row["prefill eager"] = call_us(lambda: model(x_pre, pos_pre), iters=args.iters_prefill, warmup=2) / 1e3
        compiled_pre = torch.compile(model, fullgraph=True)
        row["prefill compiled"] = call_us(lambda: compiled_pre(x_pre, pos_pre), iters=args.iters_prefill,
                                          warmup=3) / 1e3
        step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for batch in (1, 16):
            x = torch.randn(batch, 1, d, device="cuda", dtype=torch.float16, generator=gen).to(dtype)
            pos = torch.tensor([args.prefill], device="cuda")
            row[f"decode b{batch} eager"] = call_us(lambda: model(x, pos), iters=args.iters) / 1e3

            def graphed():
                torch.compiler.cudagraph_mark_step_begin()
                return step(x, pos)
            row[f"decode b{batch} compiled"] = call_us(graphed, iters=args.iters, warmup=5) / 1e3
    row["weights GiB"] = weight_bytes(model) / 2**30
    return row, out


# The host-time table's layers: every QuantLinear mode (block-scaled: Hopper only, "n/a" elsewhere).
HOST_MODES = {**{m: c for m, c in MODES.items() if isinstance(c, (WeightOnlyConfig, W8A8BlockConfig,
                                                                   W8A8ChannelConfig))},
              "W8A8 block-scaled": W8A8BlockScaledConfig(block_size=128)}
HOST_ROUNDS = 3  # the layers take turns; each row is its least disturbed round (host noise only adds)


def host_overhead(args) -> list[list]:
    """Host us of one M = 1 call: QuantLinear (each mode) against nn.Linear fp16, 4096 x 4096, no bias.
    Each layer is called a few times first (its first calls prepare and register its shape), then the
    layers take turns over HOST_ROUNDS rounds of host_us (median of 5 short loops); a row is its minimum."""
    torch.manual_seed(0)
    lin = nn.Linear(4096, 4096, bias=False, device="cuda", dtype=torch.float16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    layers, failed = {"nn.Linear fp16": lin}, []
    with torch.no_grad():
        for mode, config in HOST_MODES.items():
            try:
                q = cutlass_ops.nn.QuantLinear.from_float(copy.deepcopy(lin), config)
                for _ in range(5):
                    q(x)
                torch.cuda.synchronize()
            except Exception as e:  # block-scaled off Hopper: a row saying why, the others measured
                failed.append([f"QuantLinear {mode}", f"n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})",
                               "-"])
                continue
            layers[f"QuantLinear {mode}"] = q
        best = {name: float("inf") for name in layers}
        for _ in range(HOST_ROUNDS):
            for name, layer in layers.items():
                best[name] = min(best[name], host_us(lambda: layer(x), iters=2000))
    base = best["nn.Linear fp16"]
    return [[name, us, us / base] for name, us in best.items()] + failed


def host_lines(host: list[list]) -> list[str]:
    fmt = lambda v, spec: format(v, spec) if isinstance(v, float) else v  # noqa: E731  ("n/a (why)" rows)
    return ["Host time of one eager M = 1 call (4096 x 4096, no bias, torch.no_grad), target <= 1.2x nn.Linear "
            f"(min over {HOST_ROUNDS} alternating rounds):", "",
            table(["layer", "host us", "x nn.Linear"], [[n, fmt(u, ".1f"), fmt(r, ".2f")] for n, u, r in host]), ""]


def use_inductor_pdl() -> None:
    """--inductor-pdl: inductor's Triton kernels launched as programmatic dependents (from the next compile on)."""
    import torch._inductor.config as inductor_config

    inductor_config.triton.enable_pdl = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, prefill 512, fewer iterations")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--mlp", choices=("separate", "fused"), default="separate",
                        help="gate and up as two linears (default) or one of twice the width")
    parser.add_argument("--out", type=Path, help="default: scripts/results/<gpu>/bench_llama.md")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of: " + ", ".join(MODES))
    parser.add_argument("--inductor-pdl", action="store_true",
                        help="torch._inductor.config.triton.enable_pdl = True for every mode (Hopper+)")
    parser.add_argument("--no-host", action="store_true", help="skip the host-time table")
    parser.add_argument("--host-only", action="store_true",
                        help="only the host-time table (under a minute; default --out: results/<gpu>/bench_llama_host.md)")
    parser.add_argument("-v", action="store_true", help="INFO logs (quantize_ summaries)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {list(MODES)}")
    logging.basicConfig(level=logging.INFO if args.v else logging.WARNING)
    if args.inductor_pdl:
        use_inductor_pdl()
    args.prefill, args.iters, args.iters_prefill, args.sqnr_tokens = 2048, 50, 5, 128
    if args.quick:
        args.layers, args.prefill, args.iters, args.iters_prefill = 2, 512, 10, 2
    rows, ref_out, notes = [], None, []
    host = [] if args.no_host else host_overhead(args)
    if args.host_only:
        write_report(host_lines(host), out=args.out, bench="bench_llama_host")
        return

    def report():  # after every mode: a run cut short still leaves the modes it measured
        header = ["mode", "decode b1 eager ms", "decode b1 compiled ms", "decode b16 eager ms",
                  "decode b16 compiled ms", f"prefill {args.prefill} eager ms", f"prefill {args.prefill} compiled ms",
                  "weights GiB", "SQNR dB vs fp16", "fp16 / mode: b1 compiled, b16 compiled, prefill compiled"]
        fp16 = next((r for r in rows if r[0] == "fp16"), None)
        fmt = [[r[0], *(f"{v:.3f}" if isinstance(v, float) else v for v in r[1:]),
                " / ".join(f"{fp16[i] / r[i]:.2f}x" for i in (2, 4, 6)) if fp16 else "-"] for r in rows]
        mlp = "gate and up as one linear" if args.mlp == "fused" else "gate and up as two linears"
        lines = [f"Llama-style decoder, {args.layers} layers, hidden 4096, MLP 14336 ({mlp}), GQA 32/8 heads, fp16 "
                 f"activations. Decode: one token after a {args.prefill}-token context; compiled = torch.compile("
                 f"mode=\"reduce-overhead\", fullgraph=True); prefill compiled = torch.compile(fullgraph=True). SQNR "
                 f"of the first {args.sqnr_tokens} prefill outputs against fp16."
                 + (" Inductor's Triton kernels launched with PDL (--inductor-pdl)." if args.inductor_pdl else "")
                 + " Targets (W4A16): decode b1 compiled >= 2.5x fp16, prefill <= 1.1x fp16 (fp16 / mode >= 0.91x).",
                 "", table(header, fmt), ""]
        rest = next((r for r in rows if MODES[r[0]] == "skip"), None)
        if rest and fp16:
            lines += [f"Without its linears the step takes {rest[2]:.3f} ms at batch 1 (compiled), so no weight format "
                      f"can make the b1 compiled step more than {fp16[2] / rest[2]:.2f}x faster than fp16 "
                      f"({fp16[2]:.3f} ms); at batch 16, {fp16[4] / rest[4]:.2f}x.", ""]
        if host:
            lines += host_lines(host)
        write_report(lines + [f"- {n}" for n in notes], out=args.out, bench="bench_llama")

    if "fp16" not in modes:  # the SQNR reference: the fp16 model's output, untimed
        with torch.no_grad():
            ref_model = build(args, "fp16")
            gen = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(1, args.prefill, 4096, device="cuda", dtype=torch.float16, generator=gen)
            ref_out = ref_model(x[:, :args.sqnr_tokens], torch.arange(args.sqnr_tokens, device="cuda"))
            del ref_model, x
    for mode in modes:
        if MODES[mode] == "torchao":
            try:
                import torchao.quantization  # noqa: F401
            except ImportError as e:
                notes.append(f"torchao column skipped: {e}")
                continue
        try:
            t0 = time.perf_counter()
            model = build(args, mode)
            row, out = measure(model, args, ref_out)
            log.info("%s measured in %.0f s", mode, time.perf_counter() - t0)
        except Exception as e:  # one mode failing must not lose the others' numbers
            log.exception("mode %s failed", mode)
            notes.append(f"{mode}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
            continue
        finally:
            torch._dynamo.reset()
        if mode == "fp16":
            ref_out = out
        rows.append([mode, row["decode b1 eager"], row["decode b1 compiled"], row["decode b16 eager"],
                     row["decode b16 compiled"], row["prefill eager"], row["prefill compiled"], row["weights GiB"],
                     "-" if MODES[mode] == "skip" else row["sqnr"]])
        del model
        gc.collect()
        torch.cuda.empty_cache()
        report()
    report()

if __name__ == "__main__":
    main()
