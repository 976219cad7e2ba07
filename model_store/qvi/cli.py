"""python -m qvi — train, evaluate and export QVI models, and build the demo model store.

    python -m qvi train    --task classification --arch cnn_att --g qvi --train T --dev D --out ckpt.pt
    python -m qvi evaluate --checkpoint ckpt.pt --test TEST        (or --artifact model.pt)
    python -m qvi export   --checkpoint ckpt.pt --store model_store/store --name NAME --version 1 [--format both]
    python -m qvi demo     --store model_store/store               (the demo models the server serves)
    python -m qvi results  --seeds 5                               (model_store/README.md's table)
    python -m qvi bench-model --dtype bfloat16                     (UNTRAINED BERT-base size, benchmarks only)
"""
import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from qvi import artifact, pt2
from qvi.data import Encoded, Example, build_vocab, encode_examples, read_classification, read_conll, tag_set
from qvi.models import ARCHITECTURES, CONTEXT_KINDS, ModelConfig, build_model
from qvi.nn import INTERACTIONS, SCORES
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_from_json, config_to_json
from qvi.train import TrainOptions, evaluate, options_to_json, seed_everything, train

BOUNDARIES = (".", "!", "?", "。", "！", "？", "…")


def read_corpus(path: str, task: str, join: str) -> List[Example]:
    return read_classification(path) if task == "classification" else read_conll(path, join=join)


def label_list(task: str, examples: Sequence[Example], scheme: str) -> List[str]:
    if task == "classification":
        return sorted({e.label for e in examples})
    return tag_set(sorted({s[2] for e in examples for s in e.spans}), scheme)


def add_train_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--task", choices=("classification", "tagging"), required=True)
    ap.add_argument("--arch", choices=ARCHITECTURES, required=True)
    ap.add_argument("--g", default="qvi", choices=INTERACTIONS + ("g1",),
                    help="attention values: qvi (gated, eq. 4-5/8-9), none = g1 (values only), g2, g3")
    ap.add_argument("--score", default="additive", choices=SCORES,
                    help="h(q, v) of the additive attention pooling (survey eq. 6-9; scaled_dot divides by √D)")
    ap.add_argument("--context", choices=CONTEXT_KINDS,
                    help="context of the context-aware gates (ctx_* architectures; default global): the mean "
                         "of the layer's input, every layer's output below it, or their means")
    ap.add_argument("--train", required=True, help="training corpus (TSV for classification, CoNLL for tagging)")
    ap.add_argument("--dev", required=True, help="development corpus, picks the best epoch")
    ap.add_argument("--test", help="test corpus, evaluated once at the end")
    ap.add_argument("--conll-join", default=" ", help="string that joins CoNLL tokens into the text")
    ap.add_argument("--level", default="word", choices=("word", "char"))
    ap.add_argument("--no-lowercase", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--scheme", default="BIO", choices=("BIO", "BIOES"))
    ap.add_argument("--min-count", type=int, default=1)
    ap.add_argument("--max-vocab", type=int, default=30000)
    for name, default in (("emb-dim", 64), ("hidden", 64), ("heads", 4), ("layers", 1), ("ffn", 128)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quiet", action="store_true", help="no progress bars")


def run_training(args: argparse.Namespace) -> Dict[str, object]:
    """Trains from parsed arguments; returns the checkpoint dictionary."""
    tok = TokenizerConfig(level=args.level, lowercase=not args.no_lowercase, max_tokens=args.max_tokens)
    train_ex = read_corpus(args.train, args.task, args.conll_join)
    dev_ex = read_corpus(args.dev, args.task, args.conll_join)
    labels = label_list(args.task, train_ex, args.scheme)
    vocab = build_vocab(train_ex, tok, args.min_count, args.max_vocab)
    config = ModelConfig(arch=args.arch, vocab_size=len(vocab), num_outputs=len(labels), g=args.g,
                         score=args.score, context=args.context or "", emb_dim=args.emb_dim, hidden=args.hidden,
                         heads=args.heads, layers=args.layers, ffn=args.ffn, dropout=args.dropout, max_tokens=args.max_tokens,
                         boundary_ids=sorted({vocab.id(b) for b in BOUNDARIES} - {1}))
    tagging = args.task == "tagging"
    enc = lambda ex: encode_examples(ex, tok, vocab, labels, args.scheme, tagging)  # noqa: E731
    options = TrainOptions(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                           threads=args.threads, progress=not args.quiet)
    model, history = train(config, enc(train_ex), enc(dev_ex), labels, options)
    best = max(history, key=lambda h: h["dev_accuracy" if not tagging else "dev_f1"])  # the epoch kept
    metrics: Dict[str, object] = {"dev": {k[4:]: v for k, v in best.items() if k.startswith("dev_")}}
    if args.test:
        metrics["test"] = evaluate(model, config, enc(read_corpus(args.test, args.task, args.conll_join)), labels)
    return {
        "config": config.to_json(), "tokenizer": config_to_json(tok), "vocab": vocab.tokens,
        "labels": labels, "scheme": args.scheme if tagging else "", "state_dict": model.state_dict(),
        "train_options": options_to_json(options), "history": history, "best_epoch": best["epoch"], "metrics": metrics,
        "data": {"train": os.path.basename(args.train), "dev": os.path.basename(args.dev),
                 "test": os.path.basename(args.test) if args.test else None,
                 "train_size": len(train_ex), "dev_size": len(dev_ex)},
    }


def load_checkpoint(path: str) -> Tuple[torch.nn.Module, Dict[str, object]]:
    ckpt = torch.load(path, weights_only=False)
    config = ModelConfig(**ckpt["config"])
    model = build_model(config)
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt


FORMATS = ("torchscript", "pt2", "both")


def export_checkpoint(ckpt_path: str, store: str, name: str, version: int, card: Dict[str, object],
                      fmt: str = "torchscript", device: str = "cpu", cpu_target: str = pt2.DEFAULT_CPU_TARGET,
                      pt2_cache: Optional[str] = None) -> List[str]:
    """Writes the formats `fmt` asks for into <store>/<name>/<version>/; returns the paths written.
    With "both", an architecture that cannot be exported to a .pt2 gets model.pt alone (its manifest
    says why); asked for "pt2" alone, it is an error."""
    model, ckpt = load_checkpoint(ckpt_path)
    config = ModelConfig(**ckpt["config"])
    vocab = Vocabulary(ckpt["vocab"])
    tok = config_from_json(ckpt["tokenizer"])
    card = dict(card)
    card.setdefault("metrics", ckpt["metrics"])
    card.setdefault("seed", ckpt["train_options"]["seed"])
    card.setdefault("training", {"options": ckpt["train_options"], "data": ckpt["data"]})
    manifest = artifact.build_manifest(name, config, tok, vocab, ckpt["labels"], ckpt["scheme"], card)
    written = []
    if fmt in ("torchscript", "both"):
        written.append(artifact.export(model, manifest, vocab, store, version))
    status = pt2.export_status(config.arch)
    if fmt == "pt2" and not status["exportable"]:
        raise SystemExit(f"{config.arch} cannot be exported to a .pt2: {status['reason']}")
    if fmt in ("pt2", "both") and status["exportable"]:
        folder = os.path.join(store, name, str(version))
        written.append(pt2.write_cached(model, manifest, vocab.to_text(), folder, device, cpu_target, pt2_cache))
    return written


def evaluate_artifact(path: str, test: str, join: str) -> Dict[str, float]:
    """Scores an exported model.pt on a corpus through its manifest, vocabulary and TorchScript."""
    module, manifest, vocab = artifact.load(path)
    task = str(manifest["task"])
    tok = config_from_json(manifest["tokenizer"])  # type: ignore[arg-type]
    labels = manifest["labels"] if task == "classification" else manifest["tags"]
    config = ModelConfig(**manifest["architecture"]["config"])  # type: ignore[index]
    data = encode_examples(read_corpus(test, task, join), tok, vocab, labels,  # type: ignore[arg-type]
                           str(manifest.get("tag_scheme", "")), task == "tagging")
    return evaluate(module, config, data, labels)  # type: ignore[arg-type]


def cmd_train(args: argparse.Namespace) -> None:
    ckpt = run_training(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    torch.save(ckpt, args.out)
    print(json.dumps(ckpt["metrics"], indent=1))


def cmd_evaluate(args: argparse.Namespace) -> None:
    if args.artifact:
        scores = evaluate_artifact(args.artifact, args.test, args.conll_join)
    else:
        model, ckpt = load_checkpoint(args.checkpoint)
        config = ModelConfig(**ckpt["config"])
        tok = config_from_json(ckpt["tokenizer"])
        tagging = config.task == "tagging"
        data = encode_examples(read_corpus(args.test, config.task, args.conll_join), tok, Vocabulary(ckpt["vocab"]),
                               ckpt["labels"], ckpt["scheme"], tagging)
        scores = evaluate(model, config, data, ckpt["labels"])
    print(json.dumps(scores, indent=1))


def cmd_export(args: argparse.Namespace) -> None:
    card = {"description": args.description} if args.description else {}
    for path in export_checkpoint(args.checkpoint, args.store, args.name, args.version, card, args.format,
                                  args.device, args.cpu_target, args.pt2_cache):
        print(path)


def main(argv: Optional[Sequence[str]] = None) -> None:
    from qvi import demo  # the demo and results commands build on the functions above
    ap = argparse.ArgumentParser(prog="python -m qvi", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one model and save a checkpoint")
    add_train_args(p)
    p.add_argument("--out", required=True, help="checkpoint file to write")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("evaluate", help="score a checkpoint or an exported model.pt on a corpus")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--checkpoint")
    g.add_argument("--artifact")
    p.add_argument("--test", required=True)
    p.add_argument("--conll-join", default=" ")
    p.set_defaults(func=cmd_evaluate)
    p = sub.add_parser("export", help="export a checkpoint as <store>/<name>/<version>/model.pt and model.cpu.pt2")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", type=int, required=True)
    p.add_argument("--description", default="")
    p.add_argument("--format", choices=FORMATS, default="both",
                   help="model.pt (TorchScript), model.<device>.pt2 (AOTInductor), or both")
    p.add_argument("--device", choices=tuple(pt2.FILES), default="cpu", help="the device a .pt2 is compiled for")
    p.add_argument("--cpu-target", choices=tuple(pt2.CPU_TARGETS), default=pt2.DEFAULT_CPU_TARGET,
                   help="instruction set of a CPU .pt2: x86-64-v3 (AVX2; runs on any x86 server since ~2015) "
                        "or native (this machine's, e.g. AVX-512; for compiling on the node that serves it)")
    p.add_argument("--pt2-cache", help="reuse packages compiled before from the same weights, code and target")
    p.set_defaults(func=cmd_export)
    demo.add_commands(sub)
    from qvi import bench_model
    bench_model.add_commands(sub)
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
