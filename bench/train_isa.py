"""What reproducible training costs, and whether it reproduces (model_store/qvi/reproducible.py).

For each demo model's recipe (qvi/demo.py's DEMO), trains one epoch with `python -m qvi train` twice,
side by side in one run: with the machine's own instruction set (QVI_TRAIN_ISA=native) and pinned (the
default), and prints the seconds of each (the command's wall time, its set-up included) and their ratio.
With --qemu CPU[,CPU...], also trains the pinned recipe under `qemu-x86_64 -cpu CPU` (an emulated
processor: Haswell is AVX2-only Intel, EPYC-Rome AVX2-only AMD) on --sentences of the training split and
compares the weights bit for bit with the same run on this CPU (emulation is ~100x slower: the tagger's
recipe on 70 sentences takes about 2.5 minutes).

    .venv/bin/python bench/train_isa.py                                  # the cost, ~5 minutes on two cores
    .venv/bin/python bench/train_isa.py --models ner --skip-cost --qemu Haswell,EPYC-Rome
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(REPO, "model_store")
sys.path.insert(0, ZOO)
from qvi import demo, reproducible  # noqa: E402  (no torch: both import it lazily)


def recipe(name, corpora, epochs):
    """The demo model's `qvi train` arguments, with `epochs` epochs and no test split."""
    for store_name, corpus, arch, _, extra in demo.DEMO:
        if store_name == name:
            argv = demo.train_argv(corpora, corpus, arch, "qvi", 1) + extra
            out, skip = [], 0
            for i, a in enumerate(argv):
                if skip:
                    skip -= 1
                elif a in ("--epochs", "--test"):
                    skip = 1
                else:
                    out.append(a)
            return out + ["--epochs", str(epochs)]
    raise SystemExit(f"no demo model {name!r}")


def train(argv, out, isa, prefix=()):
    env = dict(os.environ, PYTHONPATH=ZOO, QVI_TRAIN_ISA=isa)
    t0 = time.perf_counter()
    subprocess.run([*prefix, sys.executable, "-m", "qvi", "train", *argv, "--out", out], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def slice_corpus(src, dst, sentences):
    """The first `sentences` texts of a TSV or CoNLL file."""
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        if src.endswith(".tsv"):
            g.writelines(line for _, line in zip(range(sentences), f))
            return
        n = 0
        for line in f:
            g.write(line)
            n += not line.strip()
            if n >= sentences:
                return


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="sentiment,ner,topics")
    ap.add_argument("--corpora", default=os.path.join(ZOO, "data"))
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--qemu", default="", help="emulated CPUs to compare the pinned weights with, e.g. Haswell,EPYC-Rome")
    ap.add_argument("--sentences", type=int, default=70)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="train_isa_")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"{os.cpu_count()} cores ({cpu}); one epoch of each demo recipe, seed 1, two torch threads")
    for name in args.models.split(","):
        argv = recipe(name, args.corpora, 1)
        if not args.skip_cost:
            native = train(argv, os.path.join(work, f"{name}.native.ckpt"), "native")
            pinned = train(argv, os.path.join(work, f"{name}.avx2.ckpt"), "avx2")
            print(f"{name:10s} native {native:6.1f} s   pinned {pinned:6.1f} s   pinned/native {pinned / native:.2f}",
                  flush=True)
        if not args.qemu:
            continue
        small = list(argv)
        for flag in ("--train", "--dev"):
            i = small.index(flag)
            part = os.path.join(work, f"{name}{flag[1:]}-{os.path.basename(small[i + 1])}")
            slice_corpus(small[i + 1], part, args.sentences if flag == "--train" else args.sentences // 3)
            small[i + 1] = part
        here = os.path.join(work, f"{name}.small.here.ckpt")
        train(small, here, "avx2")
        mine = reproducible.weights_digest(here)[:16]
        row = [f"{name:10s} {args.sentences} sentences, pinned: here {mine}"]
        for emulated in args.qemu.split(","):
            there = os.path.join(work, f"{name}.small.{emulated}.ckpt")
            seconds = train(small, there, "avx2", prefix=("qemu-x86_64", "-cpu", emulated))
            theirs = reproducible.weights_digest(there)[:16]
            row.append(f"{emulated} {theirs} ({'same' if theirs == mine else 'DIFFERENT'}, {seconds:.0f} s)")
        print("   ".join(row), flush=True)


if __name__ == "__main__":
    main()
