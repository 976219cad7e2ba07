"""Inductor's weight freezing in the CPU package, measured side by side (docs/performance.md, "Frozen
weights"): exports the demo classifier's checkpoint (model_store/work/sentiment.ckpt, written by the
demo's set-up) twice into temporary stores, once with freezing forced on (the Linear layers run in
oneDNN with weights packed at compile time) and once forced off (the Linear layers call aten's addmm,
MKL's sgemm on the CPU), both for the same CPU target; then qvi-bench-model measures the
two packages and the TorchScript file, the two processes alternating, for a few rounds. Prints the
median texts/s per batch size and the ratios.

    .venv/bin/python bench/freezing_ab.py [--rounds 3] [--seconds 3] [--batch-sizes 1,4,8,16] [--words 20]

About 4 minutes to compile both on two free cores, then rounds x 2 x batch sizes x seconds (x 2
formats for the frozen store). One torch thread, the process on whatever cores it is given. The
exporter's default ("--cpu-freezing auto", model_store/qvi/pt2.py) makes this choice itself from a
shorter timing at batch 1 and 8; this measures it at more sizes, in the server's C++ runner.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))
from qvi import workflow  # noqa: E402

CKPT = os.path.join(REPO, "model_store", "work", "sentiment.ckpt")


def export(store, freezing):
    """The version folder exported from CKPT with freezing forced on or off (no package cache)."""
    workflow.export_checkpoint(CKPT, store, "sentiment", 1, {}, "both", freezing="on" if freezing else "off")
    return os.path.join(store, "sentiment", "1")


def measure(version, fmt, a, out):
    subprocess.run([os.path.join(REPO, "build", "qvi-bench-model"), "--model", version, "--format", fmt,
                    "--batch-sizes", a.batch_sizes, "--seconds", str(a.seconds), "--words", str(a.words),
                    "--json", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--words", type=float, default=20)
    a = ap.parse_args()
    if not os.path.exists(CKPT):
        sys.exit(f"{CKPT} is missing: run scripts/setup.sh (the demo's set-up writes it)")
    rows = {}  # (variant, batch size) -> [texts/s]
    with tempfile.TemporaryDirectory(prefix="qvi_freezing_") as work:
        versions = {"frozen": export(os.path.join(work, "frozen"), True),
                    "unfrozen": export(os.path.join(work, "unfrozen"), False)}
        out = os.path.join(work, "steps.json")
        for r in range(a.rounds):
            for name, version in versions.items():
                for st in measure(version, "both" if name == "frozen" else "pt2", a, out):
                    variant = "torchscript" if st["format"] == "torchscript" else f"pt2 {name}"
                    rows.setdefault((variant, st["batch_size"]), []).append(st["texts_per_s"])
            print(f"round {r + 1} of {a.rounds} measured", file=sys.stderr)
    sizes = sorted({bs for _, bs in rows})
    print(f"texts/s, median of {a.rounds} rounds (~{a.words:g}-word texts, one torch thread)")
    print(f"{'batch':>5} {'torchscript':>12} {'pt2 frozen':>11} {'pt2 unfrozen':>13} {'frozen/unfrozen':>16} "
          f"{'unfrozen/torchscript':>21}")
    for bs in sizes:
        ts, fr, un = (statistics.median(rows[(v, bs)]) for v in ("torchscript", "pt2 frozen", "pt2 unfrozen"))
        print(f"{bs:>5} {ts:>12,.0f} {fr:>11,.0f} {un:>13,.0f} {fr / un:>15.2f}x {un / ts:>20.2f}x")


if __name__ == "__main__":
    main()
