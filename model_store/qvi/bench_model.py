"""`python -m qvi bench-model`: an UNTRAINED QVI Transformer classifier of BERT-base size, for
benchmarks only.

12 layers, width 768, 12 heads, feed-forward 3072, 128 tokens, a 30,522-token vocabulary (BERT-base's
sizes) with QVI in every layer and in the pooling. Its weights are random (seeded): its answers mean
nothing, and its manifest, model card and name say so. It measures what serving a model of this size
costs — with and without the per-layer maps, in float32 or a half-precision variant — and never goes
into the default store.

    python -m qvi bench-model --store bench/models                      # bert_base_qvi (float32)
    python -m qvi bench-model --store bench/models --dtype bfloat16     # bert_base_qvi_bf16
    python -m qvi bench-model --store bench/models --packages x86-64-v4 x86-64-v4-bf16
                                  # bert_base_qvi with model.cpu.pt2 and the native CPU packages
"""
import argparse
import os
from typing import Dict, Optional, Sequence

import torch

from qvi import artifact, pt2
from qvi.models import ModelConfig, build_model
from qvi.tokenizer import PAD, UNK, TokenizerConfig, Vocabulary

# The words qvi-perf and qvi-bench-model generate texts from (client/load_texts.h), so that bench
# texts are real tokens of this vocabulary rather than all [UNK].
BENCH_WORDS = ("the a film movie story acting plot characters is was and but not very good bad great boring "
               "funny moving slow smart dull beautiful script director ending scenes performance cast it this with "
               "too long short best worst of in an almost never always every minute hour , . !").split()

SUFFIX = {"float32": "", "bfloat16": "_bf16", "float16": "_fp16"}


def bench_config(layers: int = 12, width: int = 768, heads: int = 12, ffn: int = 3072, max_tokens: int = 128,
                 vocab_size: int = 30522) -> ModelConfig:
    return ModelConfig("transformer", vocab_size, 2, g="qvi", emb_dim=width, hidden=width, heads=heads,
                       layers=layers, ffn=ffn, max_tokens=max_tokens, dropout=0.0)


def bench_vocabulary(size: int) -> Vocabulary:
    tokens = [PAD, UNK] + list(BENCH_WORDS)
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    return Vocabulary(tokens)


def export_bench_model(store: str, config: ModelConfig, dtype: str = "float32", seed: int = 0,
                       name: str = "bert_base_qvi", packages: Sequence[str] = (), cache: Optional[str] = None) -> str:
    torch.manual_seed(seed)
    model = build_model(config).eval()
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    vocab = bench_vocabulary(config.vocab_size)
    card: Dict[str, object] = {
        "description": (f"UNTRAINED — random weights (seed {seed}); its answers mean nothing. A QVI Transformer "
                        f"classifier of BERT-base size ({config.layers} layers, width {config.hidden}, "
                        f"{config.heads} heads, {config.max_tokens} tokens) in {dtype}, for benchmarks only."),
        "untrained": True,
        "training_data": "none",
        "reproduce": f"python -m qvi bench-model --dtype {dtype} --seed {seed}",
    }
    if packages:
        # No test split means no fidelity gate: what a bf16 or int8 package costs in fidelity is
        # measured on the trained demo models (docs/performance.md); here only its speed is. Nor is
        # there a speed gate: every package asked for is written, to be measured side by side, so the
        # server's "auto" takes the first in its order (int8 before bf16), not the fastest: pin one.
        card["cpu_packages"] = {v: {"cpu_target": pt2.CPU_VARIANTS[v][0], "dtype": pt2.CPU_VARIANTS[v][1],
                                    "kept": True, "fidelity": "not measured: untrained, no test split",
                                    "speed": "not gated: written for side-by-side measurement"}
                                for v in packages}
    manifest = artifact.build_manifest(name + SUFFIX[dtype], config, TokenizerConfig(max_tokens=config.max_tokens),
                                       vocab, ["label_0", "label_1"], "", card)
    outputs = manifest["outputs"]
    assert isinstance(outputs, dict)
    for spec in outputs.values():
        if spec["dtype"] == "float32":
            spec["dtype"] = dtype
    path = artifact.export(model, manifest, vocab, store, 1)
    if packages:
        if dtype != "float32":
            raise SystemExit("--packages compiles from the float32 model: use it without --dtype")
        folder = os.path.dirname(path)
        pt2.write_cached(model, manifest, vocab.to_text(), folder, "cpu", pt2.DEFAULT_CPU_TARGET, cache)
        for variant in packages:
            target, package_dtype = pt2.CPU_VARIANTS[variant]
            pt2.write_cached(model, manifest, vocab.to_text(), folder, "cpu", target, cache, package_dtype,
                             pt2.variant_file(variant))
    return path


def cmd_bench_model(args: argparse.Namespace) -> None:
    config = bench_config(args.layers, args.width, args.heads, args.ffn, args.max_tokens, args.vocab_size)
    print(export_bench_model(args.store, config, args.dtype, args.seed, packages=args.packages or (),
                             cache=args.pt2_cache))


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench-model", help="export an UNTRAINED BERT-base-sized QVI classifier for benchmarks")
    p.add_argument("--store", default="../bench/models", help="a store of its own, never the default one")
    p.add_argument("--dtype", choices=tuple(SUFFIX), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=3072)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--packages", nargs="*", choices=tuple(pt2.CPU_VARIANTS),
                   help="also compile model.cpu.pt2 and these CPU packages beside it (float32 model only; no "
                        "fidelity gate: the model is untrained and has no test split)")
    p.add_argument("--pt2-cache", help="reuse packages compiled before from the same weights, code and target")
    p.set_defaults(func=cmd_bench_model)
