"""The paper's question on a pretrained encoder: does query-value interaction help when the encoder is MiniLM,
fine-tuned? Each task is fine-tuned (qvi.finetune) from the same pretrained weights as

    classifiers:  attention   attention pooling (eq. 1-2) on the last layer, no QVI        (the baseline)
                  qvi         QVI pooling (eq. 4-6)
                  qvi-layers  attention pooling, QVI in the top N self-attention layers (eq. 7-10)
    taggers:      plain       CRF on the encoder, no QVI                                    (the baseline)
                  qvi-layers  QVI in the top N layers

with several seeds each (the same seed: the same batches in the same order for every variant, and the new
parameters drawn from the same generator -- QVI pooling draws its own W and u first, so its classifier starts from
other numbers), and scored on the test split. Runs are appended to a JSON file as they finish, so a study can be stopped and resumed.

    python -m qvi finetune-study --task sentiment --seeds 1 2 3 --epochs 2 --out study.json
    python -m qvi finetune-study --table study.json      # the markdown table

The table gives each variant's mean ± standard deviation over seeds, its difference from the baseline, the
paired t over seeds (the same seeds) with its two-sided p (Student's t, seeds - 1 degrees), and a paired bootstrap
over the test texts (both variants' answers to the same texts, seeds pooled: the p-value of the difference having
the other sign).
"""
import argparse
import json
import os
import statistics
from typing import Dict, List, Sequence

import numpy as np
from scipy.stats import t as scipy_t

from qvi.finetune import PRETRAINED, TASKS, FinetuneOptions, finetune

VARIANTS = {"classification": ("attention", "qvi", "qvi-layers"), "tagging": ("plain", "qvi-layers")}


def options(variant: str, seed: int, a: argparse.Namespace) -> FinetuneOptions:
    return FinetuneOptions(pooling="qvi" if variant == "qvi" else "attention",
                           qvi_layers=a.qvi_layers if variant == "qvi-layers" else 0, epochs=a.epochs,
                           max_tokens=a.max_tokens, frozen_layers=a.frozen_layers, limit=a.limit, seed=seed,
                           threads=a.threads)


def run_study(a: argparse.Namespace) -> None:
    done: List[Dict[str, object]] = []
    if os.path.exists(a.out):
        with open(a.out, encoding="utf-8") as f:
            done = json.load(f)
    kind = TASKS[a.task][0]
    variants = a.variants or VARIANTS[kind]
    if set(variants) - set(VARIANTS[kind]):
        raise SystemExit(f"finetune-study: a {kind} task's variants are {', '.join(VARIANTS[kind])}")
    for seed in a.seeds:  # seed by seed: an interrupted study still has whole pairs
        for variant in variants:
            same = [r for r in done if r["task"] == a.task and r["variant"] == variant and r["seed"] == seed]
            if same:
                asked = options(variant, seed, a)
                had = same[0]["options"]
                for key in ("epochs", "qvi_layers", "limit", "frozen_layers", "pooling"):
                    if had[key] != getattr(asked, key):  # type: ignore[index]
                        raise SystemExit(f"finetune-study: {a.out} ran {variant} seed {seed} with {key} {had[key]}, "
                                         f"not {getattr(asked, key)}: use another --out")
                continue
            _, _, _, report = finetune(a.task, a.data, a.pretrained, options(variant, seed, a))
            done.append(dict(report, variant=variant, seed=seed))
            with open(a.out + ".tmp", "w", encoding="utf-8") as f:
                json.dump(done, f)
            os.replace(a.out + ".tmp", a.out)


def _score(items: np.ndarray, tagging: bool) -> float:
    """Accuracy, or entity F1 from per-text [right, found, gold] counts, in points."""
    if not tagging:
        return 100.0 * float(items[:, 0].mean())
    hit, found, gold = items.sum(axis=0)
    return 200.0 * hit / (found + gold) if found + gold else 0.0


def bootstrap_p(base: List[np.ndarray], other: List[np.ndarray], tagging: bool, rounds: int = 2000,
                seed: int = 0) -> float:
    """Two-sided p of the mean (over seeds) score difference by a paired bootstrap over texts."""
    rng = np.random.default_rng(seed)
    n = base[0].shape[0]
    diffs = np.empty(rounds)
    for r in range(rounds):
        pick = rng.integers(0, n, n)
        diffs[r] = np.mean([_score(o[pick], tagging) - _score(b[pick], tagging) for b, o in zip(base, other)])
    return float(min(1.0, 2 * min((diffs <= 0).mean(), (diffs >= 0).mean())))


def table(rows: Sequence[Dict[str, object]]) -> str:
    lines = ["| task | variant | seeds | test score (points) | Δ vs baseline | paired t (seeds) | p of t | "
             "bootstrap p (texts) |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for task in dict.fromkeys(str(r["task"]) for r in rows):
        tagging = TASKS[task][0] == "tagging"
        base_name = VARIANTS[TASKS[task][0]][0]
        by_variant: Dict[str, Dict[int, Dict[str, object]]] = {}
        for r in rows:
            if r["task"] == task:
                by_variant.setdefault(str(r["variant"]), {})[int(r["seed"])] = r  # type: ignore[arg-type]
        base = by_variant.get(base_name, {})
        for variant, runs in by_variant.items():
            seeds = sorted(runs)
            scores = [_score(np.array(runs[s]["test_items"]), tagging) for s in seeds]
            sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
            cells = [task, variant, str(len(seeds)), f"{statistics.mean(scores):.2f} ± {sd:.2f}"]
            common = [s for s in seeds if s in base]
            if variant == base_name or not common:
                cells += ["", "", "", ""]
            else:
                d = [_score(np.array(runs[s]["test_items"]), tagging) -
                     _score(np.array(base[s]["test_items"]), tagging) for s in common]
                sdd = statistics.stdev(d) if len(d) > 1 else 0.0
                t = statistics.mean(d) / (sdd / len(d) ** 0.5) if sdd > 0 else None
                p = bootstrap_p([np.array(base[s]["test_items"]) for s in common],
                                [np.array(runs[s]["test_items"]) for s in common], tagging)
                cells += [f"{statistics.mean(d):+.2f}", "n/a" if t is None else f"{t:+.2f}",
                          "n/a" if t is None else f"{2 * scipy_t.sf(abs(t), len(d) - 1):.3f}", f"{p:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_study(a: argparse.Namespace) -> None:
    if a.table:
        rows: List[Dict[str, object]] = []
        for path in a.table:
            with open(path, encoding="utf-8") as f:
                rows.extend(json.load(f))
        print(table(rows))
        return
    if not a.task or not a.out:
        raise SystemExit("finetune-study: --task and --out (or --table)")
    run_study(a)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune-study", help="QVI against attention on the fine-tuned MiniLM, several seeds")
    p.add_argument("--task", choices=tuple(TASKS))
    p.add_argument("--out", help="the results file (JSON; appended to, runs already in it are skipped)")
    p.add_argument("--table", nargs="*", help="print the markdown table of these results files")
    p.add_argument("--variants", nargs="*", help="default: every variant of the task's kind")
    p.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--qvi-layers", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--frozen-layers", type=int, default=0)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default="data")
    p.add_argument("--pretrained", default=PRETRAINED)
    p.set_defaults(func=cmd_study)
