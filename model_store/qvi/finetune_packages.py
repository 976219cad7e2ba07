"""Reduced-precision CPU packages of a fine-tuned encoder (qvi.finetune), through the same gates as the zoo's models.

    python -m qvi finetune-packages --model store/sentiment-minilm/1/model.pt \\
        [--variants x86-64-v4-bf16 x86-64-v4-int8] [--data data] [--pt2-cache work/pt2] [--no-speed-gate] [--dry-run]

Each variant (pt2.CPU_VARIANTS) is compiled from the model.pt's weights, then measured on the task's test split
against the float32 eager model by the fidelity gate (qvi/fidelity.py: labels agree on 99.5 % of texts, a tagger's
entity F1 within 0.3 points, α and β within 0.02), and, where it passes, timed against the packages the server's
"auto" would load after it (qvi.workflow's speed gate). The card of model.pt records every measurement
(`cpu_packages`), kept or not; the kept packages are written beside model.pt, where the server's `cpu_package:
"auto"` picks the first this CPU can run. `--dry-run` measures and prints without writing anything.

A tagger's F1 here is over its sub-words' tags (the gate compares the package with the float32 model on the same
tags), not over words as the card's test score is.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from qvi import artifact, pt2
from qvi.finetune import HERE, TASKS, finetuned_config, load_finetuned, read_split
from qvi.subword_data import SubwordData
from qvi.hf_encoders import Encoder, EncoderConfig
from qvi.hf_import import TOKENIZER_FILE

DEFAULT_VARIANTS = ("x86-64-v4-bf16", "x86-64-v4-int8")


def measure_variant(model: Encoder, config: EncoderConfig, manifest: Dict[str, object], tokenizer_text: str,
                    variant: str, data: SubwordData, split: str, labels: Sequence[str], cache: str,
                    staging: str) -> Dict[str, object]:
    """Compiles `variant` into `staging` (through the compile cache) and runs the fidelity gate: what the card says
    of it, and whether it is kept ("kept", before the speed gate)."""
    from qvi import fidelity
    target, dtype = pt2.CPU_VARIANTS[variant]
    report: Dict[str, object] = {"cpu_target": target, "dtype": dtype}
    t0 = time.perf_counter()
    try:
        path = pt2.write_cached(model, manifest, tokenizer_text, staging, "cpu", target, cache, dtype,
                                pt2.variant_file(variant))
    except Exception as e:  # noqa: BLE001  (an optional package: its failure is reported, not fatal)
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        return dict(report, kept=False, not_kept=f"did not compile or pass the package check: {why}")
    compiled = time.perf_counter() - t0
    gate = fidelity.measure(path, model, config, data.items, labels)  # type: ignore[arg-type]
    report.update(fidelity_test=split, fidelity=gate, kept=bool(gate["passed"]),
                  seconds={"compile": round(compiled, 1), "gate": round(time.perf_counter() - t0 - compiled, 1)})
    if model.crf is not None:
        report["fidelity_f1_over"] = "sub-words"
    return report


def add_variants(model_pt: str, variants: Sequence[str], data_dir: str, cache: str, speed_gate: bool = True,
                 write: bool = True, log=print, test_limit: int = 0) -> Dict[str, Dict[str, object]]:
    """Measures each of `variants` for the fine-tuned `model_pt`; with `write`, its card records them and the kept
    packages are written beside it (model.pt and model.cpu.pt2 again, with the card). Returns the reports.
    `test_limit` > 0: the gate runs on the test split's first texts only (tests)."""
    from qvi import workflow
    have = set(pt2.required_cpu_flags("native"))
    for variant in variants:
        missing = sorted(set(pt2.cpu_flags(*pt2.CPU_VARIANTS[variant])) - have)
        if missing:
            raise SystemExit(f"cannot compile and check the {variant} package on this CPU: it lacks "
                             f"{', '.join(missing)}")
    model, manifest, tokenizer_text = load_finetuned(model_pt)
    card: Dict[str, object] = manifest["model_card"]  # type: ignore[assignment]
    task = str(card["training"]["task"])  # type: ignore[index]
    config = finetuned_config(manifest)
    names = manifest["labels"] if config.task == "classification" else manifest["tags"]
    labels = [str(x) for x in names]  # type: ignore[union-attr]
    max_tokens = int(manifest["architecture"]["config"]["max_tokens"])  # type: ignore[index]
    with tempfile.TemporaryDirectory(prefix="qvi-variants-") as staging:
        tok_path = os.path.join(staging, TOKENIZER_FILE)
        with open(tok_path, "w", encoding="utf-8") as f:
            f.write(tokenizer_text)
        split = os.path.join(data_dir, TASKS[task][1], TASKS[task][2].format("test"))
        examples = read_split(task, split)
        data = SubwordData(tok_path, examples[:test_limit] if test_limit > 0 else examples, labels,
                           config.task == "tagging", max_tokens)
        shown = os.path.relpath(os.path.abspath(split), HERE)  # data/<corpus>/test.<ext>, as the cards say
        reports: Dict[str, Dict[str, object]] = {}
        for variant in variants:
            reports[variant] = measure_variant(model, config, manifest, tokenizer_text, variant, data, shown, labels,
                                               cache, os.path.join(staging, variant))
            log(f"{variant}: {_summary(reports[variant])}")
        kept = [v for v in variants if reports[v]["kept"]]
        if kept and speed_gate:
            workflow.keep_if_faster(model, manifest, tokenizer_text, config.vocab_size, cache, pt2.DEFAULT_CPU_TARGET,
                                      pt2.DEFAULT_FREEZING, kept, reports)
            for variant in variants:
                log(f"{variant}: speed {json.dumps(reports[variant].get('speed', '-'))} -> "
                    f"{'kept' if variant in kept else 'not kept'}")
        elif kept:
            for variant in kept:
                reports[variant]["speed"] = "not gated (--no-speed-gate)"
    if write:
        card["cpu_packages"] = reports
        folder = os.path.dirname(model_pt)
        artifact.export_files(model, manifest, {TOKENIZER_FILE: tokenizer_text},
                              os.path.dirname(os.path.dirname(folder)), int(os.path.basename(folder)))
        pt2.write_cached(model, manifest, tokenizer_text, folder, "cpu", pt2.DEFAULT_CPU_TARGET, cache)
        for variant in variants:
            stale = os.path.join(folder, pt2.variant_file(variant))
            if variant in kept:
                target, dtype = pt2.CPU_VARIANTS[variant]
                pt2.write_cached(model, manifest, tokenizer_text, folder, "cpu", target, cache, dtype,
                                 pt2.variant_file(variant))
            elif os.path.exists(stale):
                os.unlink(stale)  # a package measured before that no longer passes: the card says why
    return reports


def _summary(report: Dict[str, object]) -> str:
    gate: Optional[Dict[str, object]] = report.get("fidelity")  # type: ignore[assignment]
    if gate is None:
        return str(report.get("not_kept", ""))
    keys = ("label_agreement", "accuracy_float32", "accuracy", "f1_float32", "f1", "max_abs_attention",
            "max_abs_gates")
    figures = ", ".join(f"{k} {gate[k]}" for k in keys if k in gate)
    verdict = "passed" if gate["passed"] else "failed: " + "; ".join(gate["failed"])  # type: ignore[arg-type]
    return f"{figures} ({verdict})"


def cmd_packages(a: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        cache = a.pt2_cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="qvi-pt2-"))
        add_variants(a.model, a.variants, a.data, cache, not a.no_speed_gate, not a.dry_run,
                     log=lambda m: print(m, flush=True))


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune-packages", help="bf16 and int8 CPU packages of a fine-tuned encoder, kept only "
                                                 "through the fidelity and speed gates")
    p.add_argument("--model", required=True, help="a fine-tuned model.pt (qvi finetune, demo-pretrained)")
    p.add_argument("--variants", nargs="+", choices=tuple(pt2.CPU_VARIANTS), default=list(DEFAULT_VARIANTS))
    p.add_argument("--data", default="data")
    p.add_argument("--pt2-cache")
    p.add_argument("--no-speed-gate", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="measure and print; write nothing")
    p.set_defaults(func=cmd_packages)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: python -m qvi finetune-packages ...")
