"""Training is reproducible bit for bit across x86-64 instruction sets (qvi/reproducible.py).

Each case trains small models of the demo models' three architectures (Transformer-QVI, CNN-Att-QVI,
CNN-Transformer-QVI-CRF) with `python -m qvi train`, the command the demo store is made with, on corpora
the test writes, and compares the weights of two runs bit for bit:

- on this machine (AVX-512 and AMX on the project's machines) and on an emulated AVX2-only CPU —
  `qemu-x86_64 -cpu Haswell` (Intel) and `-cpu EPYC-Rome` (AMD, which MKL treats apart) — another CPU,
  not just another setting: the weights must be equal. The control: here, with the pins off
  (QVI_TRAIN_ISA=native), the weights differ from the pinned ones, so the comparison can fail.
- natively, with an environment that asks each library for another instruction set (ATEN_CPU_CAPABILITY
  and its peers set by the caller) against this machine's own choice: the pins must override both.

Emulation is slow (qemu's AVX2 is about 100× native), so the models and corpora are tiny; the qemu cases
skip without qemu-x86_64 (Debian's qemu-user, which scripts/setup.sh installs) and when this machine
has no AVX-512 (then its own choice is AVX2 already, and nothing differs to test).
"""
import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from qvi import reproducible

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QEMU = shutil.which("qemu-x86_64")
WORDS = ("good bad film plot acting great awful boring moving smart funny dull the a of and was is very "
         "not quite story scene music slow fast").split()
ENTITIES = {"PER": ["Anna", "Bob", "Clara"], "LOC": ["Berlin", "Paris", "Oslo"], "ORG": ["Acme", "Siemens"]}
# (name, train flags): the demo models' architectures, at a size qemu trains in seconds.
SMALL = ["--emb-dim", "16", "--hidden", "16", "--heads", "2", "--ffn", "32", "--epochs", "1", "--batch-size", "8",
         "--quiet"]
CASES = [
    ("transformer", ["--task", "classification", "--arch", "transformer", "--layers", "2"]),
    ("cnn_att", ["--task", "classification", "--arch", "cnn_att"]),
    ("cnn_transformer_crf", ["--task", "tagging", "--arch", "cnn_transformer_crf", "--layers", "1", "--casing",
                             "--no-lowercase"]),
]


def has_avx512() -> bool:
    with open("/proc/cpuinfo") as f:
        return " avx512f" in f.read()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A seeded classification corpus (TSV) and a tagging corpus (CoNLL), train and dev each."""
    rng = random.Random(7)
    out = tmp_path_factory.mktemp("corpora")
    for split, n in (("train", 48), ("dev", 16)):
        with open(out / f"{split}.tsv", "w") as f:
            for _ in range(n):
                words = rng.choices(WORDS, k=rng.randint(4, 14))
                label = "positive" if words.count("good") >= words.count("bad") else "negative"
                f.write(f"{label}\t{' '.join(words)}\n")
        with open(out / f"{split}.conll", "w") as f:
            for _ in range(n):
                for _ in range(rng.randint(4, 12)):
                    if rng.random() < 0.3:
                        label = rng.choice(sorted(ENTITIES))
                        f.write(f"{rng.choice(ENTITIES[label])}\tB-{label}\n")
                    else:
                        f.write(f"{rng.choice(WORDS)}\tO\n")
                f.write("\n")
    return out


def train_argv(corpora, case, out):
    name, flags = case
    ext = "conll" if "tagging" in flags else "tsv"
    return ["train", *flags, *SMALL, "--train", str(corpora / f"train.{ext}"), "--dev", str(corpora / f"dev.{ext}"),
            "--out", str(out)]


def run(argv, env, qemu_cpu=None):
    if qemu_cpu:
        argv = [QEMU, "-cpu", qemu_cpu, *argv]
    proc = subprocess.run(argv, env=dict(env, PYTHONPATH=HERE), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def train(corpora, case, out, env) -> str:
    """Trains one case with `python -m qvi train`; the digest of its weights."""
    run([sys.executable, "-m", "qvi", *train_argv(corpora, case, out)], env)
    return reproducible.weights_digest(out)


# Every case in one process, as `python -m qvi train` would train each (pinned before torch loads, then
# qvi.cli.main): under emulation importing torch alone takes about 25 s.
TRAIN_ALL = ("import json, sys; from qvi import reproducible; reproducible.pin_this_process(['train']); "
             "from qvi.cli import main; [main(argv) for argv in json.loads(sys.argv[1])]; "
             "import torch; print('AVX-512:', torch.cpu._is_avx512_supported())")


def train_all(corpora, folder, env, qemu_cpu=None):
    """Trains every case in one process; their digests."""
    outs = [folder / f"{case[0]}.ckpt" for case in CASES]
    stdout = run([sys.executable, "-c", TRAIN_ALL,
                  json.dumps([train_argv(corpora, c, o) for c, o in zip(CASES, outs)])], env, qemu_cpu)
    # The trainer saw the CPU it was meant to: AVX-512 here, none on the emulated one.
    assert stdout.rstrip().endswith(f"AVX-512: {qemu_cpu is None}"), stdout[-500:]
    return [reproducible.weights_digest(o) for o in outs]


def clean_env(**extra):
    """This process's environment without any of the settings that choose an instruction set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR", "QVI_TRAIN_ISA")}
    env.update(extra)
    return env


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_pins_override_what_the_environment_would_choose(corpora, case, tmp_path):
    own = train(corpora, case, tmp_path / "own.ckpt", clean_env())
    avx2 = train(corpora, case, tmp_path / "avx2.ckpt",
                 clean_env(ATEN_CPU_CAPABILITY="default", ONEDNN_MAX_CPU_ISA="SSE41", MKL_CBWR="AVX512"))
    assert own == avx2
    ckpt = torch.load(tmp_path / "own.ckpt", weights_only=False)
    assert ckpt["train_options"]["isa"] == "avx2" and ckpt["train_options"]["pins"] == reproducible.PINS


@pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 (Debian's qemu-user) is not installed")
@pytest.mark.skipif(not has_avx512(), reason="this CPU has no AVX-512: its own choice is AVX2 already")
@pytest.mark.parametrize("cpu", ["Haswell", "EPYC-Rome"])
def test_an_emulated_avx2_cpu_trains_the_same_weights_as_this_one(corpora, cpu, tmp_path):
    (tmp_path / "here").mkdir()
    (tmp_path / cpu).mkdir()
    here = train_all(corpora, tmp_path / "here", clean_env())
    there = train_all(corpora, tmp_path / cpu, clean_env(), qemu_cpu=cpu)
    for (name, _), a, b in zip(CASES, here, there):
        assert a == b, f"{name}: the weights trained here and on an emulated {cpu} differ"


@pytest.mark.skipif(not has_avx512(), reason="this CPU has no AVX-512: its own choice is AVX2 already")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_without_the_pins_this_cpu_trains_other_weights(corpora, case, tmp_path):
    """The control: here the instruction set decides the weights (its own choice, AVX-512, against the
    pinned AVX2), so the comparisons above can fail — an AVX2 machine, unpinned, trains the pinned ones."""
    native = train(corpora, case, tmp_path / "native.ckpt", clean_env(QVI_TRAIN_ISA="native"))
    pinned = train(corpora, case, tmp_path / "pinned.ckpt", clean_env())
    assert native != pinned
