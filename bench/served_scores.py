"""A demo model's test-split score measured through the server, beside the score its card states: the split's
texts sent by `qvi-client batch` (gRPC, one stream, 32 texts a request) to qvi-server serving the model's folder,
the answers scored as the trainer scored them -- a classifier's accuracy (the top label against the gold one), a
tagger's entity precision, recall and F1 over (start, end, type) spans of the text against the corpus' spans
(CoNLL words joined by one space, qvi.data.read_conll).

    .venv/bin/python bench/served_scores.py --model model_store/store/sentiment-minilm/1 \\
        --split model_store/data/sentiment/test.tsv
    .venv/bin/python bench/served_scores.py --model model_store/store/ner-e5/1 \\
        --split model_store/data/conll2003/test.conll

With --gates (a QVI classifier) it also says what β does there: its spread over the words, and how it ranks a
text's words against α and against their contributions. It prints both scores and their difference, and exits 1
when they differ by more than --tolerance points (the server and the trainer should compute the same answers;
float32 packages differ from the trainer in the last bits, which can move a text that sits on the boundary).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi.data import read_classification, read_conll  # noqa: E402

CLIENT = os.path.join(REPO, "build", "qvi-client")


def card_of(version_dir):
    import torch
    extra = {"manifest.json": ""}
    torch.jit.load(os.path.join(version_dir, "model.pt"), map_location="cpu", _extra_files=extra)
    manifest = json.loads(extra["manifest.json"])
    return manifest["name"], manifest["task"], manifest["model_card"]


def served_answers(version_dir, name, task, texts, work, explain=()):
    """The answers of the server to each text, in order."""
    from qvi_testing import ServerProcess
    store = os.path.join(work, "store")
    os.makedirs(os.path.join(store, name))
    os.symlink(os.path.abspath(version_dir), os.path.join(store, name, os.path.basename(version_dir)))
    inputs, outputs = os.path.join(work, "texts.jsonl"), os.path.join(work, "answers.jsonl")
    with open(inputs, "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": str(i), "text": text}) + "\n")
    proc = ServerProcess(store, work)
    try:
        done = subprocess.run([CLIENT, "--server", proc.address, "batch", "--model", name, "--task",
                               "tag" if task == "tagging" else "classify", "--texts-per-request", "32",
                               "--concurrency", "4", *(["--explain", *explain] if explain else []), inputs, outputs],
                              capture_output=True, text=True)
        print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "", flush=True)
        if done.returncode:
            raise SystemExit(f"qvi-client batch failed (exit {done.returncode}): {done.stderr[-2000:]}")
    finally:
        proc.stop()
    by_id = {}
    with open(outputs, encoding="utf-8") as f:
        for line in f:
            answer = json.loads(line)
            if "result" not in answer:
                raise SystemExit(f"text {answer.get('id')} failed: {answer}")
            by_id[answer["id"]] = answer["result"]
    return [by_id[str(i)] for i in range(len(texts))]


def score(task, examples, answers):
    if task == "classification":
        right = sum(a["labels"][0]["label"] == e.label for e, a in zip(examples, answers))
        return {"accuracy": right / len(examples)}
    hit = found = gold = 0
    for e, a in zip(examples, answers):
        want = {(s, t, label) for s, t, label in e.spans}
        got = {(s["start"], s["end"], s["label"]) for s in a.get("spans", [])}
        hit, found, gold = hit + len(want & got), found + len(got), gold + len(want)
    p, r = hit / max(found, 1), hit / max(gold, 1)
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def gates_summary(answers):
    """What β does on this split: its spread over the words, and within each text how it ranks the words
    against α and against the size of the word's contribution to the answered label (Spearman, mean over
    texts of 3 words or more)."""
    import numpy as np
    from scipy.stats import spearmanr
    betas, with_alpha, with_contribution = [], [], []
    for a in answers:
        tokens = a["tokens"]
        beta = np.array([t["gate"] for t in tokens])
        betas.extend(beta)
        if len(tokens) >= 3 and np.ptp(beta) > 0:
            alpha = np.array([t["attention"] for t in tokens])
            size = np.array([abs(t["contribution"][0]) for t in tokens])
            with_alpha.append(spearmanr(beta, alpha)[0] if np.ptp(alpha) > 0 else np.nan)
            with_contribution.append(spearmanr(beta, size)[0] if np.ptp(size) > 0 else np.nan)
    b = np.array(betas)
    print(f"  β over {len(b)} words: mean {b.mean():.3f}, sd {b.std():.3f}, 5-95 % [{np.percentile(b, 5):.3f}, "
          f"{np.percentile(b, 95):.3f}], below ½ {100 * (b < 0.5).mean():.1f} %")
    print(f"  within a text, Spearman ρ of β with α {np.nanmean(with_alpha):+.3f}, with |contribution| "
          f"{np.nanmean(with_contribution):+.3f} (mean over {len(with_alpha)} texts)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model's version folder (model.pt, model.cpu.pt2)")
    p.add_argument("--split", required=True, help="the test split: TSV (label<TAB>text) or CoNLL")
    p.add_argument("--tolerance", type=float, default=0.2, help="points the two scores may differ by")
    p.add_argument("--gates", action="store_true", help="a QVI classifier: also ask for α, β and contributions "
                                                        "and say what β does on the split")
    a = p.parse_args()
    name, task, card = card_of(a.model)
    examples = read_conll(a.split) if a.split.endswith(".conll") else read_classification(a.split)
    work = tempfile.mkdtemp(prefix="qvi_served_scores_")
    try:
        answers = served_answers(a.model, name, task, [e.text for e in examples], work,
                                 ("attention", "gates", "contributions") if a.gates else ())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    served = score(task, examples, answers)
    stated = card.get("test_scores") or card.get("metrics", {}).get("test", {})
    key = "f1" if task == "tagging" else "accuracy"
    print(f"{name}: {len(examples)} texts of {os.path.relpath(a.split, REPO)} through the server")
    for k, v in served.items():
        print(f"  {k:9s} served {100 * v:6.2f}   card {100 * stated.get(k, float('nan')):6.2f}")
    if a.gates:
        gates_summary(answers)
    gap = 100 * abs(served[key] - stated.get(key, float("nan")))
    print(f"  {key} differs by {gap:.2f} points (tolerance {a.tolerance})")
    sys.exit(0 if gap <= a.tolerance else 1)


if __name__ == "__main__":
    main()
