"""Training that gives the same weights, bit for bit, on every x86-64 CPU the project supports.

Same seed and same thread count give the same model on one machine (qvi.train.seed_everything), but not
across machines: torch's CPU kernels pick their code by the processor's instruction set at run time, and
a wider vector (AVX-512 against AVX2), an AMX tile or another GEMM blocking adds the same numbers in
another order. The last bit of one step's gradient then differs, and after a few thousand steps so do the
model's answers (the demo tagger labelled "Google" ORG on one Intel Xeon and LOC on another machine).

Three libraries choose by instruction set, each reading the environment when it is first used:
  ATen (torch's own vectorised kernels: element-wise ops, reductions, softmax) — ATEN_CPU_CAPABILITY=avx2;
  oneDNN (convolutions) — ONEDNN_MAX_CPU_ISA=AVX2;
  MKL (torch's GEMM, and the vector math ATen hands it for large tensors: exp, log, tanh, erf, sqrt) —
  MKL_CBWR=COMPATIBLE,STRICT, MKL's "conditional numerical reproducibility" on its one code branch that
  it honours on AMD processors too (asked for its AVX2 branch, MKL answers it only on Intel's and picks its
  own on AMD's), STRICT so that a result does not depend on how a view's data happens to be aligned.
That branch's square root is approximate (rsqrtps, whose tables differ between processors), so the
optimiser takes its square root from its fused kernel instead (AdamW(fused=True) in qvi.train: ATen's
vectorised sqrt, IEEE-exact). The thread count is pinned by the trainer (TrainOptions.threads, 2 by
default, whatever the machine's core count).

Measured (model_store/README.md, "Reproducible training"): the same weights, bit for bit, on this
project's Intel Xeon (AVX-512, AMX) and under qemu-x86_64 emulating an AVX2-only Intel Haswell and an AMD
EPYC-Rome — the demo tagger's recipe on a slice of CoNLL-2003, and three architectures in
tests/test_reproducible.py; an epoch of the demo recipes costs 1.15-1.5 times the machine's own
choice.

The pins must be in the environment before torch loads, and they hold for the whole process. They are for
training only: the packages the exporter compiles for the server (qvi.pt2) are compiled for the
machine's best instruction set, which Inductor also reads from ATEN_CPU_CAPABILITY. So `python -m qvi
train` pins itself before importing torch (qvi/__main__.py), and `python -m qvi demo` trains each model in
such a child process and exports it in its own, unpinned one.

QVI_TRAIN_ISA=native leaves the machine's own choice (faster on an AVX-512 machine, but a model no other
kind of CPU reproduces).
"""
import os
import sys
from typing import Dict, Sequence

PINS: Dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
}
# The commands that train in their own process, and so pin it.
TRAINING_COMMANDS = ("train", "results")
SWITCH = "QVI_TRAIN_ISA"


def pin_this_process(argv: Sequence[str]) -> None:
    """Pins this process when it is about to train (argv[0] is a training command), unless
    QVI_TRAIN_ISA=native; must run before torch is imported."""
    if not argv or argv[0] not in TRAINING_COMMANDS:
        return
    if "torch" in sys.modules:
        raise RuntimeError("qvi.reproducible: torch is loaded already; the pins would not take effect")
    isa = os.environ.get(SWITCH, "avx2")
    if isa not in ("avx2", "native"):
        raise SystemExit(f"{SWITCH}={isa!r}: expected avx2 (the default, reproducible) or native")
    if isa == "avx2":
        os.environ.update(PINS)


def recipe() -> Dict[str, object]:
    """What a checkpoint records of how it was trained (beside its TrainOptions)."""
    native = os.environ.get(SWITCH) == "native"
    return {"isa": "native" if native else "avx2",
            "pins": {} if native else {k: os.environ.get(k, "") for k in PINS}}


def weights_digest(checkpoint: str) -> str:
    """The SHA-256 of a checkpoint's weights, name by name in sorted order: what "the same model, bit for
    bit" compares (tests/test_reproducible.py, bench/train_isa.py)."""
    import hashlib

    import torch
    state = torch.load(checkpoint, weights_only=False)["state_dict"]
    sha = hashlib.sha256()
    for key in sorted(state):
        sha.update(key.encode())
        sha.update(state[key].contiguous().numpy().tobytes())
    return sha.hexdigest()
