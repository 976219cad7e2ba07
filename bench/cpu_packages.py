"""The native CPU packages side by side (issue 33; docs/performance.md, "Native CPU packages"): the exporter
compiles each demo model's x86-64-v4, x86-64-v4-bf16 and x86-64-v4-int8 packages beside its base package
(model.cpu.pt2, x86-64-v3) and puts the bf16 and int8 ones through their fidelity gate on the model's test
split (labels agree on >= 99.5 % of texts, entity F1 within 0.3 points, alpha and beta within 0.02), then
through the speed gate (kept only if faster than every package the server would load after it); the
UNTRAINED BERT-base-sized bench model gets the same packages without gates (no test split: it is for speed
alone). qvi-bench-model then
measures the TorchScript file and every package a version kept, in one process, alternating at each batch
size, one torch thread.

Only the variants this CPU can run are built (pt2.cpu_flags against /proc/cpuinfo). The stores live in
bench/models/cpu_packages/ (ignored by git), each model's keyed by the exporter's code and its checkpoint,
so a later run re-exports only what changed; the compiled packages are cached in QVI_PT2_CACHE. Cold, on
two cores, the exports take about 40 minutes (BERT-base's four packages most of it); warm, the section
measures for about 10.

bench/run.py runs it in the full run (--cpu-packages, all four models by default) and alone with
--cpu-packages-only; this file holds the exporting, the measuring and the markdown section.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_STORE = os.path.join(REPO, "model_store")
VARIANTS = ("x86-64-v4", "x86-64-v4-bf16", "x86-64-v4-int8")
BERT = "bert_base_qvi"
MODELS = ("sentiment", "topics", "ner", BERT)
DEMO_WORDS, DEMO_BATCHES, DEMO_SECONDS = (20, 100), "1,8,32", 3
BERT_TOKENS, BERT_BATCHES, BERT_SECONDS = 128, "1,8", 10
BERT_TARGET = 3.0  # the best package against fp32 TorchScript at batch 8, 128 tokens


def _qvi(module: str):
    """A module of the model zoo's package (model_store/qvi), imported from this process."""
    if MODEL_STORE not in sys.path:
        sys.path.insert(0, MODEL_STORE)
    import importlib
    return importlib.import_module(f"qvi.{module}")


def _pt2():
    return _qvi("pt2")


def runnable_variants() -> List[str]:
    """The variants whose instructions this CPU has (a package for others would not load here): the
    demo's own choice (qvi.demo.demo_cpu_variants)."""
    return _qvi("demo").demo_cpu_variants(VARIANTS)


def test_split(model: str) -> str:
    """A demo model's test split, as the demo's set-up wrote it (relative to model_store/)."""
    demo = _qvi("demo")
    corpus = next(corpus for name, corpus, *_ in demo.DEMO if name == model)
    return os.path.join(os.path.relpath(demo.DEFAULT_CORPORA, MODEL_STORE), corpus, f"test.{demo.EXTENSIONS[corpus]}")


def _key(model: str, variants: List[str]) -> str:
    """What a model's store was made from: the exporter's code, the checkpoint, the variants asked for."""
    h = hashlib.sha256(" ".join(variants).encode())
    qvi = os.path.join(MODEL_STORE, "qvi")
    files = [os.path.join(qvi, f) for f in sorted(os.listdir(qvi)) if f.endswith(".py")]
    if model != BERT:
        files.append(os.path.join(MODEL_STORE, "work", f"{model}.ckpt"))
    for path in files:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def export(store: str, model: str, variants: List[str], log) -> None:
    """Exports `model` with `variants` into store/<model>/1 unless a store made from the same inputs is there."""
    folder = os.path.join(store, model)
    key = _key(model, variants)
    key_file = os.path.join(folder, "key")
    if os.path.exists(key_file):
        with open(key_file) as f:
            if f.read() == key:
                return
    shutil.rmtree(folder, ignore_errors=True)
    cache = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2"))
    if model == BERT:
        cmd = [sys.executable, "-m", "qvi", "bench-model", "--store", store, "--packages", *variants]
    else:
        cmd = [sys.executable, "-m", "qvi", "export", "--checkpoint", f"work/{model}.ckpt", "--store", store,
               "--name", model, "--version", "1", "--cpu-variants", *variants, "--fidelity-test", test_split(model)]
    cmd += ["--pt2-cache", cache]
    shown = " ".join(os.path.relpath(c, MODEL_STORE) if c.startswith(REPO) else c for c in cmd)
    log(f"exporting {model}'s CPU packages: (cd model_store && {shown})")
    subprocess.run(cmd, check=True, cwd=MODEL_STORE, stdout=subprocess.DEVNULL)
    with open(key_file, "w") as f:
        f.write(key)


def gates(store: str, model: str) -> Dict[str, dict]:
    """The model card's report of each variant (kept, fidelity, speed, why not kept)."""
    pt2 = _pt2()
    card = json.loads(pt2.read_extra(os.path.join(store, model, "1", "model.cpu.pt2"))["manifest.json"])["model_card"]
    return card.get("cpu_packages", {})


def package_name(step: dict) -> str:
    """A qvi-bench-model step's package: TorchScript, base (model.cpu.pt2) or the variant's name."""
    if step["format"] != "pt2":
        return "TorchScript"
    file = step["file"]
    return "base" if file == "model.cpu.pt2" else file[len("model.cpu."):-len(".pt2")]


def measure(work: str, store: str, model: str, variants: List[str], log, build: str,
            plan: Optional[Tuple[Sequence[int], str, float]] = None) -> List[dict]:
    """TorchScript and each package the version holds, side by side: one qvi-bench-model run per text length.
    plan: (lengths in words, batch sizes, seconds per step), else the model's defaults above."""
    version = os.path.join(store, model, "1")
    held = ["base"] + [v for v in variants if os.path.exists(os.path.join(version, f"model.cpu.{v}.pt2"))]
    extra = ["--words-stddev", "0"] if model == BERT else []  # BERT: exactly 128 tokens
    if plan is None:
        plan = ((BERT_TOKENS,), BERT_BATCHES, BERT_SECONDS) if model == BERT else (DEMO_WORDS, DEMO_BATCHES, DEMO_SECONDS)
    lengths, batches, seconds = plan
    runs = []
    for words in lengths:
        out = os.path.join(work, f"cpu_packages_{model}_{words}.json")
        cmd = [os.path.join(build, "qvi-bench-model"), "--model", version, "--format", "both", "--cpu-packages",
               ",".join(held), "--batch-sizes", batches, "--seconds", str(seconds), "--words", str(words), *extra,
               "--json", out]
        log(" ".join(c.replace(REPO + "/", "") for c in cmd))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            r = json.load(f)
        runs.append({"words": words, "steps": [dict(s, package=package_name(s)) for s in r["steps"]]})
    return runs


def run(work: str, models: List[str], log, build: str) -> dict:
    """Exports (as needed) and measures each model; the section's results."""
    variants = runnable_variants()
    out = {"variants": variants, "cpu": _pt2().cpu_model(), "models": {}}
    if not variants:
        log("this CPU runs none of the native CPU packages (x86-64-v4 needs AVX-512): section left out")
        return out
    store = os.path.join(REPO, "bench", "models", "cpu_packages")
    for model in models:
        export(store, model, variants, log)
        out["models"][model] = {"gates": {} if model == BERT else gates(store, model),
                                "runs": measure(work, store, model, variants, log, build)}
    return out


def smoke(work: str, log, build: str) -> dict:
    """bench/run.py --smoke: this section's code on the demo store's sentiment version as the set-up made it (its
    packages; nothing exported), measured for a moment at one length and batch size: the zoo's modules imported
    beside the API's, the card's gates read, the section's markdown made."""
    store = os.path.join(MODEL_STORE, "store")
    variants = runnable_variants()
    out = {"variants": variants, "cpu": _pt2().cpu_model(), "models": {}}
    if not os.path.exists(os.path.join(store, "sentiment", "1", "model.cpu.pt2")):
        log("the demo store's sentiment has no model.cpu.pt2 (this CPU builds none): CPU packages left out")
        return out
    out["models"]["sentiment"] = {"gates": gates(store, "sentiment"),
                                  "runs": measure(work, store, "sentiment", variants, log, build,
                                                  plan=((DEMO_WORDS[0],), "1", 0.3))}
    return out


def _fidelity_cell(report: dict) -> str:
    f = report.get("fidelity")
    if not isinstance(f, dict):
        return "-"
    parts = [f"labels agree {100 * f['label_agreement']:.2f} %"]
    if "f1" in f:
        parts.append(f"entity F1 {f['f1']:.2f} vs {f['f1_float32']:.2f}")
    if "accuracy" in f:
        parts.append(f"accuracy {100 * f['accuracy']:.2f} vs {100 * f['accuracy_float32']:.2f}")
    parts.append(f"max Δα {f['max_abs_attention']:.4f}, max Δβ {f['max_abs_gates']:.4f}")
    return ", ".join(parts)


def _speed_cell(report: dict) -> str:
    s = report.get("speed")
    if not s or isinstance(s, str):  # not timed, or why not ("not gated (--cpu-speed-gate off)")
        return s or "-"
    ms = s["ms"]
    return "; ".join(f"{name} " + " / ".join(f"{v:.2f}" for v in times.values()) for name, times in ms.items()) + \
        f" ms (fastest: {s['fastest']})"


def markdown(section: dict, command: str) -> str:
    variants = section.get("variants", [])
    lines = ["## Native CPU packages (in-process, one torch thread)", ""]
    if not section.get("models"):
        return "\n".join(lines + ["Not measured: this CPU runs none of the native packages (x86-64-v4 needs "
                                  "AVX-512).", ""])
    lines += [
        f"The exporter's packages for this CPU ({section['cpu']}): `model.cpu.pt2` (x86-64-v3, AVX2, the base) and "
        + ", ".join(f"`model.cpu.{v}.pt2`" for v in variants)
        + ". bf16 and int8 are kept only if they pass the fidelity gate against float32 on the model's test split "
        "(labels agree on >= 99.5 % of texts, entity F1 within 0.3 points, α and β within 0.02) and then the speed "
        "gate: one torch thread, times of a lone 24-token text / a batch of 8, faster by their geometric mean than "
        "every package the server's `auto` would load after it (it loads the first kept of int8, bf16, x86-64-v4, "
        "base). qvi-bench-model measures "
        "the TorchScript file (fp32, what the peers serve) and every package the version kept in one process, "
        "alternating at each batch size. `bert_base_qvi` is UNTRAINED (BERT-base's sizes: 12 layers, width 768, "
        "12 heads, 128 tokens): every package is written without gates, for speed only.",
        "",
        "Reproduce this section alone with:",
        "",
        "```sh",
        command,
        "```",
        "",
        "### The gates (from each model card)",
        "",
        "| model | package | kept | fidelity against float32 | speed gate (ms: 1×24 / 8×24) | why not kept |",
        "|---|---|---|---|---|---|",
    ]
    lines += _gate_rows(section)
    lines += _speed_rows(section, ["TorchScript", "base", *variants])
    lines.append("")
    return "\n".join(lines)


def _gate_rows(section: dict) -> list:
    """One row per gated package of each model: kept or not, and why."""
    lines = []
    for model, r in section["models"].items():
        for variant, report in r["gates"].items():
            if report.get("dtype") == "float32":
                continue  # x86-64-v4 in float32 has no gate: kept whenever it compiles
            why = report.get("not_kept") or ("; ".join(report["fidelity"].get("failed", []))
                                             if isinstance(report.get("fidelity"), dict) else "")
            lines.append(f"| {model} | {variant} | {'yes' if report['kept'] else 'no'} | {_fidelity_cell(report)} | "
                         f"{_speed_cell(report)} | {why.replace('|', '/') or '-'} |")
    return lines


def _speed_rows(section: dict, names: list) -> list:
    """The texts/s table of every package, and the BERT-base-sized model's line against its target."""
    lines = ["", "### Texts/s (`-`: the package was not kept)", "",
             "| model | words | batch | " + " | ".join(names) + " | best package / TorchScript |",
             "|---|---:|---:|" + "---:|" * len(names) + "---|"]
    bert_line = None
    for model, r in section["models"].items():
        for length in r["runs"]:
            by_batch: Dict[int, Dict[str, float]] = {}
            for s in length["steps"]:
                by_batch.setdefault(s["batch_size"], {})[s["package"]] = s["texts_per_s"]
            for batch, speeds in sorted(by_batch.items()):
                best = max((n for n in speeds if n != "TorchScript"), key=lambda n: speeds[n])
                ratio = speeds[best] / speeds["TorchScript"]
                cells = [f"{speeds[n]:.1f}" if n in speeds else "-" for n in names]
                lines.append(f"| {model} | {length['words']} | {batch} | " + " | ".join(cells)
                             + f" | {best}: {ratio:.2f} x |")
                if model == BERT and batch == 8:
                    bert_line = (f"- BERT-base-sized, batch 8, {length['words']} tokens: the best package ({best}) "
                                 f"{speeds[best]:.1f} texts/s against fp32 TorchScript's {speeds['TorchScript']:.1f}: "
                                 f"**{ratio:.2f} x** (target >= {BERT_TARGET:g} x).")
    return lines + (["", bert_line] if bert_line else [])
