"""The steps `python -m qvi` and the demo share: read a corpus, train from arguments, load a
checkpoint, export it into a model store, score an exported artifact. Below both cli.py (the
commands) and demo.py (the demo store), so that neither imports the other back."""
import argparse
import contextlib
import os
import sys
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from qvi import artifact, pt2, reproducible, vectors
from qvi.data import Example, build_vocab, encode_examples, read_classification, read_conll, tag_set
from qvi.models import ARCHITECTURES, CONTEXT_KINDS, ModelConfig, build_model
from qvi.nn import INTERACTIONS, SCORES
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_from_json, config_to_json
from qvi.train import TrainOptions, evaluate, options_to_json, train

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
    ap.add_argument("--casing", action="store_true",
                    help="fold each token's case class into its id (tokenizer rule 7) and embed it: for lower-cased "
                         "vocabularies (and vectors) that should still see 'Paris' apart from 'paris'")
    ap.add_argument("--case-dim", type=int, default=8, help="width of the case feature with --casing")
    ap.add_argument("--vectors", help="pretrained word vectors for the embedding: glove-6b-50d (built by set-up) or "
                                      "a folder with words.txt and vectors.npy; --emb-dim must match")
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
    tok = TokenizerConfig(level=args.level, lowercase=not args.no_lowercase, max_tokens=args.max_tokens,
                          casing=args.casing)
    pretrained = vectors.load(args.vectors) if args.vectors else None
    if pretrained is not None:
        vectors.check_dim(pretrained, args.emb_dim)  # before reading any corpus
    train_ex = read_corpus(args.train, args.task, args.conll_join)
    dev_ex = read_corpus(args.dev, args.task, args.conll_join)
    labels = label_list(args.task, train_ex, args.scheme)
    vocab = build_vocab(train_ex, tok, args.min_count, args.max_vocab,
                        lambda have, size: vectors.extra_words(pretrained, have, size))
    config = ModelConfig(arch=args.arch, vocab_size=len(vocab), num_outputs=len(labels), g=args.g,
                         score=args.score, context=args.context or "", emb_dim=args.emb_dim, hidden=args.hidden,
                         heads=args.heads, layers=args.layers, ffn=args.ffn, dropout=args.dropout, max_tokens=args.max_tokens,
                         boundary_ids=sorted({vocab.id(b) for b in BOUNDARIES} - {1}),
                         case_dim=args.case_dim if args.casing else 0)
    embedding, found = vectors.embedding_init(pretrained, vocab.tokens, args.seed) if pretrained else (None, 0)
    tagging = args.task == "tagging"
    enc = lambda ex: encode_examples(ex, tok, vocab, labels, args.scheme, tagging)  # noqa: E731
    options = TrainOptions(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                           threads=args.threads, progress=not args.quiet)
    model, history = train(config, enc(train_ex), enc(dev_ex), labels, options, embedding)
    best = max(history, key=lambda h: h["dev_accuracy" if not tagging else "dev_f1"])  # the epoch kept
    metrics: Dict[str, object] = {"dev": {k[4:]: v for k, v in best.items() if k.startswith("dev_")}}
    if args.test:
        metrics["test"] = evaluate(model, config, enc(read_corpus(args.test, args.task, args.conll_join)), labels)
    return {
        "config": config.to_json(), "tokenizer": config_to_json(tok), "vocab": vocab.tokens,
        "labels": labels, "scheme": args.scheme if tagging else "", "state_dict": model.state_dict(),
        # How it was trained: the options, and the CPU kernels' pinned instruction set (qvi/reproducible.py).
        "train_options": {**options_to_json(options), **reproducible.recipe()},
        "history": history, "best_epoch": best["epoch"], "metrics": metrics,
        "data": {"train": os.path.basename(args.train), "dev": os.path.basename(args.dev),
                 "test": os.path.basename(args.test) if args.test else None,
                 "train_size": len(train_ex), "dev_size": len(dev_ex),
                 "vectors": {"name": args.vectors, "dim": pretrained.dim, "words_with_vectors": found}
                 if pretrained else None},
    }


def load_checkpoint(path: str) -> Tuple[torch.nn.Module, Dict[str, object]]:
    ckpt = torch.load(path, weights_only=False)
    config = ModelConfig(**ckpt["config"])
    model = build_model(config)
    model.load_state_dict(ckpt["state_dict"])
    return model.eval(), ckpt


def add_freezing_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cpu-freezing", choices=pt2.FREEZING, default=pt2.DEFAULT_FREEZING,
                   help="Inductor's weight freezing in CPU packages. auto: compile with and without, time both "
                        "on this machine and keep the faster (pt2.json's freezing_choice says what was measured); "
                        "on/off: force it")


FORMATS = ("torchscript", "pt2", "both")


def export_checkpoint(ckpt_path: str, store: str, name: str, version: int, card: Dict[str, object],
                      fmt: str = "torchscript", device: str = "cpu", cpu_target: str = pt2.DEFAULT_CPU_TARGET,
                      pt2_cache: Optional[str] = None, cpu_variants: Sequence[str] = (),
                      fidelity_test: Optional[str] = None, conll_join: str = " ",
                      freezing: str = pt2.DEFAULT_FREEZING, speed_gate: bool = True) -> List[str]:
    """Writes the formats `fmt` asks for into <store>/<name>/<version>/; returns the paths written.
    With "both", an architecture that cannot be exported to a .pt2 gets model.pt alone (its manifest
    says why); asked for "pt2" alone, it is an error. `cpu_variants` (pt2.CPU_VARIANTS) adds CPU
    packages beside model.cpu.pt2; a bfloat16 or int8 one only if it passes the fidelity gate on the
    corpus `fidelity_test` (qvi/fidelity.py) and is faster than the packages the server would load
    after it (keep_if_faster; with `speed_gate` False it is not timed, and its report says so).
    The model card records each variant's measurement.
    `freezing` (pt2.FREEZING) decides the CPU packages' weight freezing."""
    model, ckpt = load_checkpoint(ckpt_path)
    config = ModelConfig(**ckpt["config"])
    vocab = Vocabulary(ckpt["vocab"])
    tok = config_from_json(ckpt["tokenizer"])
    card = dict(card)
    card.setdefault("metrics", ckpt["metrics"])
    card.setdefault("seed", ckpt["train_options"]["seed"])
    card.setdefault("training", {"options": ckpt["train_options"], "data": ckpt["data"]})
    status = pt2.export_status(config.arch)
    if fmt == "pt2" and not status["exportable"]:
        raise SystemExit(f"{config.arch} cannot be exported to a .pt2: {status['reason']}")
    packages = fmt in ("pt2", "both") and bool(status["exportable"])
    if cpu_variants and not (packages and device == "cpu"):
        raise SystemExit("--cpu-variants needs CPU packages (--device cpu, --format pt2 or both, an exportable model)")
    with contextlib.ExitStack() as stack:
        cache = pt2_cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="qvi-pt2-"))
        kept = []
        if cpu_variants:
            probe = artifact.build_manifest(name, config, tok, vocab, ckpt["labels"], ckpt["scheme"], card)
            card["cpu_packages"] = {}
            for variant in cpu_variants:
                report = _variant(model, config, probe, vocab, ckpt, variant, cache, fidelity_test, conll_join,
                                  freezing)
                card["cpu_packages"][variant] = report  # type: ignore[index]
                if report["kept"]:
                    kept.append(variant)
            if not speed_gate:
                for variant in set(kept) & {BF16, INT8}:
                    card["cpu_packages"][variant]["speed"] = "not gated (--cpu-speed-gate off)"  # type: ignore[index]
            elif BF16 in kept or INT8 in kept:
                keep_if_faster(model, probe, vocab.to_text(), len(vocab), cache, cpu_target, freezing, kept,
                           card["cpu_packages"])  # type: ignore[arg-type]
        manifest = artifact.build_manifest(name, config, tok, vocab, ckpt["labels"], ckpt["scheme"], card)
        written = []
        if fmt in ("torchscript", "both"):
            written.append(artifact.export(model, manifest, vocab, store, version))
        if packages:
            folder = os.path.join(store, name, str(version))
            written.append(pt2.write_cached(model, manifest, vocab.to_text(), folder, device, cpu_target, cache,
                                            freezing=freezing))
            for variant in kept:
                target, dtype = pt2.CPU_VARIANTS[variant]
                written.append(pt2.write_cached(model, manifest, vocab.to_text(), folder, "cpu", target, cache,
                                                dtype, pt2.variant_file(variant), freezing))
    return written


INT8, BF16, V4 = "x86-64-v4-int8", "x86-64-v4-bf16", "x86-64-v4"
# The order in which the server's "auto" loads a version's CPU packages (kCpuPackages in
# server/core/spec/serving_config.h): the first this CPU can run.
AUTO_ORDER = (INT8, BF16, V4, "base")


def keep_if_faster(model: torch.nn.Module, manifest: Dict[str, object], text: str, vocab_size: int, cache: str,
                   cpu_target: str, freezing: str, kept: List[str], reports: Dict[str, Dict[str, object]]) -> None:
    """Keeps a reduced-precision package (bf16, int8) only where it wins: timed on this machine against
    the base package and every other variant kept (pt2.time_packages: one torch thread, a lone short text
    and a batch of eight), it must be faster by the geometric mean than every package the server's "auto"
    would load after it -- bf16 than x86-64-v4 and the base, int8 than those and a kept bf16 -- since
    "auto" loads it first. Where one of those is as fast it is dropped (the demo classifier's bf16 ran
    its lone short texts at about half the base package's speed on a CPU with AMX; there bf16 also ran
    faster than int8 even at BERT-base's size: docs/performance.md), and its report ("speed") says
    against what. `text` is the package's vocabulary (vocab.txt) or tokenizer.json."""
    with tempfile.TemporaryDirectory(prefix="qvi-speed-") as staging:
        paths = {"base": pt2.write_cached(model, manifest, text, os.path.join(staging, "base"), "cpu", cpu_target,
                                          cache, freezing=freezing)}
        for variant in kept:
            target, dtype = pt2.CPU_VARIANTS[variant]
            paths[variant] = pt2.write_cached(model, manifest, text, os.path.join(staging, variant), "cpu", target,
                                              cache, dtype, freezing=freezing)
        ms = pt2.time_packages(paths, vocab_size)
    scores = {name: pt2.geometric_mean(times) for name, times in ms.items()}
    fastest = min(scores, key=lambda name: scores[name])
    for variant in (BF16, INT8):  # bf16 first: whether int8 must beat it depends on bf16 being kept
        if variant not in kept:
            continue
        after = [n for n in AUTO_ORDER[AUTO_ORDER.index(variant) + 1:] if n == "base" or n in kept]
        rival = min(after, key=lambda name: scores[name])  # a tie goes to the one listed first
        report = reports[variant]
        report["speed"] = {"ms": ms, "fastest": fastest, "cpu": pt2.cpu_model(), "torch_threads": 1}
        if scores[rival] <= scores[variant]:
            kept.remove(variant)
            report["kept"] = False
            report["not_kept"] = f"slower on this CPU than {'model.cpu.pt2' if rival == 'base' else rival}"


def _variant(model: torch.nn.Module, config: ModelConfig, manifest: Dict[str, object], vocab: Vocabulary,
             ckpt: Dict[str, object], variant: str, cache: str, fidelity_test: Optional[str],
             conll_join: str, freezing: str) -> Dict[str, object]:
    """Compiles one CPU variant into `cache` and measures it: what the card says of it, and whether
    it is kept ("kept")."""
    from qvi import fidelity
    target, dtype = pt2.CPU_VARIANTS[variant]
    missing = sorted(set(pt2.cpu_flags(target, dtype)) - set(pt2.required_cpu_flags("native")))
    if missing:
        raise SystemExit(f"cannot compile and check the {variant} package on this CPU: it lacks {', '.join(missing)}")
    if dtype != "float32" and not fidelity_test:
        raise SystemExit(f"the {variant} package needs --fidelity-test (a test split for its fidelity gate)")
    report: Dict[str, object] = {"cpu_target": target, "dtype": dtype}
    with tempfile.TemporaryDirectory(prefix="qvi-variant-") as staging:
        try:
            path = pt2.write_cached(model, manifest, vocab.to_text(), staging, "cpu", target, cache, dtype,
                                    freezing=freezing)
        except Exception as e:  # noqa: BLE001  (an optional package: its failure is reported, not fatal)
            if dtype == "float32":
                raise  # the same model in float32 compiled for the base package: a bug, not a limit
            # A reduced-precision package that does not compile (torchao 0.17's int8 lowering fails on
            # the CNN-Att model's transposed Linear inputs with dynamic shapes) or strays past its
            # package check (CHECK_TOLERANCE) is left out, and the card says why.
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
            print(f"qvi export: the {variant} package is not kept: {why}", file=sys.stderr)
            return dict(report, kept=False, not_kept=f"did not compile or pass the package check: {why}")
        if dtype == "float32":
            return dict(report, kept=True)
        task = config.task
        labels = ckpt["labels"]
        data = encode_examples(read_corpus(str(fidelity_test), task, conll_join), config_from_json(ckpt["tokenizer"]),
                               vocab, labels, str(ckpt["scheme"]), task == "tagging")  # type: ignore[arg-type]
        gate = fidelity.measure(path, model, config, data, labels)  # type: ignore[arg-type]
    report.update(fidelity_test=os.path.basename(str(fidelity_test)), fidelity=gate, kept=bool(gate["passed"]))
    return report


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
