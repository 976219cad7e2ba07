"""Native CPU packages through the server (model_store/README.md, "Native CPU packages"): a version
holding a bf16 package beside model.cpu.pt2 serves from it on a CPU with AVX512-BF16, GetModel and the
log say so, and its answers stay within the fidelity gate's limits of the float32 package's, which a
pin (`--cpu-package base`, or serving.json's "cpu_package") still serves; the log says how each package was
compiled (weights frozen or not, as the exporter timed faster). The exporter's side (the variants, the gate,
the card) is tested in model_store/tests/test_pt2.py; the order of preference in
tests/cpp/core/model/model_test.cc.

The bf16 package is compiled here from the demo sentiment model (30-60 s on two cores), kept in the
package cache the zoo's tests use (QVI_PT2_CACHE), so a warm run reuses it."""
import json
import os
import shutil
import sys

import pytest
import torch

from qvi_testing import REPO, STORE, ServerProcess
from qvi import artifact, pt2
from qvi.models import ModelConfig, build_model
from qvi.tokenizer import config_from_json, encode

CACHE = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2-tests"))
BF16 = pt2.variant_file("x86-64-v4-bf16")

pytestmark = pytest.mark.skipif(
    not set(pt2.cpu_flags("x86-64-v4", "bfloat16")) <= set(pt2.required_cpu_flags("native")),
    reason="this CPU cannot run an x86-64-v4 bf16 package (needs AVX-512 and AVX512-BF16)")


def sentiment_copy(work):
    """A copy of the demo store's sentiment version under `work`/store, and its float32 model (for
    compiling packages into the copy): (version folder, model, manifest, vocabulary)."""
    version = os.path.join(work, "store", "sentiment", "1")
    shutil.copytree(os.path.join(STORE, "sentiment", "1"), version)
    module, manifest, vocab = artifact.load(os.path.join(version, "model.pt"))
    model = build_model(ModelConfig(**manifest["architecture"]["config"])).eval()
    model.load_state_dict(module.state_dict())
    return version, model, manifest, vocab


@pytest.fixture(scope="module")
def packages_server(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("qvi_cpu_packages"))
    store = os.path.join(work, "store")
    torch.set_num_threads(1)
    version, model, manifest, vocab = sentiment_copy(work)
    pt2.write_cached(model, manifest, vocab.to_text(), version, "cpu", "x86-64-v4", CACHE, "bfloat16", BF16)
    os.makedirs(os.path.join(work, "pinned"))
    servers = {"auto": ServerProcess(store, work), "pinned": ServerProcess(store, os.path.join(work, "pinned"),
                                                                             "--cpu-package", "base")}
    yield servers
    for proc in servers.values():
        proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def metadata(proc, api, name):
    pb, pb_grpc = api
    info = pb_grpc.InferenceStub(proc.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name)), timeout=30)
    return info.model.versions[0].metadata


def test_the_bf16_package_serves_by_default_and_a_pin_serves_float32(packages_server, api):
    md = metadata(packages_server["auto"], api, "sentiment")
    assert (md.format, md.file, md.precision, md.format_note) == ("pt2", BF16, "bfloat16", "")
    pinned = metadata(packages_server["pinned"], api, "sentiment")
    assert (pinned.format, pinned.file, pinned.precision, pinned.format_note) == ("pt2", "model.cpu.pt2", "float32", "")
    assert "model sentiment@1 READY: " in packages_server["auto"].log()
    version = os.path.join(packages_server["auto"].work, "store", "sentiment", "1")  # both serve this store
    assert f"from {BF16} (pt2, bfloat16, {compile_note(os.path.join(version, BF16))})" in packages_server["auto"].log()
    assert (f"from model.cpu.pt2 (pt2, float32, {compile_note(os.path.join(version, 'model.cpu.pt2'))})"
            in packages_server["pinned"].log())


def compile_note(package):
    """What the server's log says of how `package` was compiled, from its pt2.json: the exporter
    timed it with and without frozen weights and kept the faster (model_store/qvi/pt2.py)."""
    info = json.loads(pt2.read_extra(package)[pt2.PT2_INFO])
    assert info["freezing_choice"]["kept"] == ("frozen" if info["freezing"] else "unfrozen")
    return ("frozen weights" if info["freezing"] else "weights not frozen") + " (the faster on the compiling CPU)"


def test_bf16_answers_stay_within_the_fidelity_gates_limits_of_float32(packages_server, api):
    pb, pb_grpc = api
    with open(os.path.join(REPO, "model_store", "data", "sentiment", "test.tsv"), encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in f][:64]
    answers = {}
    for name, proc in packages_server.items():
        req = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                                 options=pb.OutputOptions(top_k=2, attention=True, gates=True))
        answers[name] = pb_grpc.InferenceStub(proc.channel).Classify(req, timeout=60).results
    agree = 0
    for bf16, f32 in zip(answers["auto"], answers["pinned"]):
        assert [(t.text, t.start, t.end) for t in bf16.tokens] == [(t.text, t.start, t.end) for t in f32.tokens]
        agree += bf16.labels[0].label == f32.labels[0].label
        scores = {ls.label: ls.score for ls in f32.labels}
        for ls in bf16.labels:
            assert abs(ls.score - scores[ls.label]) < 0.02
        for a, b in zip(bf16.tokens, f32.tokens):
            assert abs(a.attention - b.attention) <= 0.02 and abs(a.gate - b.gate) <= 0.02
    # The gate's 99.5 % over 64 texts allows no flip; the demo model's test split measured 99.92 %.
    assert agree >= 63, agree


def test_a_package_this_cpu_cannot_run_is_passed_over_with_the_reason(tmp_path, api):
    """A bf16 package whose pt2.json asks for a CPU feature no machine has: model.cpu.pt2 serves,
    and GetModel's format_note names the file and the feature."""
    work = str(tmp_path)
    version, model, manifest, vocab = sentiment_copy(work)
    path = pt2.write_cached(model, manifest, vocab.to_text(), version, "cpu", "x86-64-v4", CACHE, "bfloat16", BF16)
    extra = pt2.read_extra(path)
    info = json.loads(extra[pt2.PT2_INFO])
    info["cpu_flags"] = info["cpu_flags"] + ["avx1024_imaginary"]
    pt2.repackage(path, path + ".new", dict(extra, **{pt2.PT2_INFO: json.dumps(info)}))
    os.replace(path + ".new", path)
    proc = ServerProcess(os.path.join(work, "store"), work)
    try:
        md = metadata(proc, api, "sentiment")
        assert (md.file, md.precision) == ("model.cpu.pt2", "float32")
        assert f"{BF16} not used" in md.format_note and "avx1024_imaginary" in md.format_note, md.format_note
    finally:
        proc.stop()


INT8 = pt2.variant_file("x86-64-v4-int8")


@pytest.mark.skipif(not set(pt2.cpu_flags("x86-64-v4", "int8")) <= set(pt2.required_cpu_flags("native")),
                    reason="this CPU cannot run an x86-64-v4 int8 package (needs AVX-512 and AVX512-VNNI)")
def test_an_int8_package_is_served_first_and_answers_near_float32(tmp_path, api):
    """The int8 package of the demo sentiment model (which its fidelity gate would not keep: β moves by
    up to 0.031, docs/performance.md) put into a version by hand: "auto" serves it before the others,
    GetModel and the log say so, and its answers are those of its float32 model up to int8's rounding."""
    pb, pb_grpc = api
    work = str(tmp_path)
    version, model, manifest, vocab = sentiment_copy(work)
    pt2.write_cached(model, manifest, vocab.to_text(), version, "cpu", "x86-64-v4", CACHE, "int8", INT8)
    with open(os.path.join(REPO, "model_store", "data", "sentiment", "test.tsv"), encoding="utf-8") as f:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in f][:32]
    proc = ServerProcess(os.path.join(work, "store"), work)
    try:
        md = metadata(proc, api, "sentiment")
        assert (md.format, md.file, md.precision) == ("pt2", INT8, "int8")
        assert f"from {INT8} (pt2, int8, frozen weights" in proc.log()
        req = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                                 options=pb.OutputOptions(top_k=2, attention=True, gates=True))
        got = pb_grpc.InferenceStub(proc.channel).Classify(req, timeout=60).results
    finally:
        proc.stop()
    tok = config_from_json(manifest["tokenizer"])
    agree = 0
    with torch.no_grad():
        for r, text in zip(got, texts):
            row = encode(text, tok, vocab).ids
            assert len(row) == len(r.tokens)
            want = model(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.bool))
            probs = torch.softmax(want["logits"][0], -1)
            agree += r.labels[0].label == manifest["labels"][int(probs.argmax())]
            gates = want["gates"][0].tolist()
            assert max(abs(t.gate - g) for t, g in zip(r.tokens, gates)) < 0.05
    assert agree >= 31, agree


def test_the_benchmark_harness_measures_every_package_a_version_kept(tmp_path):
    """bench/cpu_packages.py (bench/run.py's native-packages section): qvi-bench-model measures the
    TorchScript file and each package the version holds, each row named by its package, and the section
    shows a package the version lacks as "-" and each gate's outcome from the card."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import cpu_packages

    work = str(tmp_path)
    version, model, manifest, vocab = sentiment_copy(work)
    pt2.write_cached(model, manifest, vocab.to_text(), version, "cpu", "x86-64-v4", CACHE, "bfloat16", BF16)
    variants = ["x86-64-v4", "x86-64-v4-bf16", "x86-64-v4-int8"]
    runs = cpu_packages.measure(work, os.path.join(work, "store"), "sentiment", variants, lambda _: None,
                                os.path.join(REPO, "build"), plan=((20,), "1,8", 0.2))
    assert [r["words"] for r in runs] == [20]
    measured = {(s["batch_size"], s["package"]) for s in runs[0]["steps"]}
    assert measured == {(b, p) for b in (1, 8) for p in ("TorchScript", "base", "x86-64-v4-bf16")}, measured
    assert all(s["texts_per_s"] > 0 for s in runs[0]["steps"])
    fidelity = {"label_agreement": 0.9992, "max_abs_attention": 0.0017, "max_abs_gates": 0.0042, "passed": True}
    gates = {"x86-64-v4": {"dtype": "float32", "kept": True},
             "x86-64-v4-bf16": {"dtype": "bfloat16", "kept": True, "fidelity": fidelity},
             "x86-64-v4-int8": {"dtype": "int8", "kept": False, "fidelity": dict(fidelity, passed=True),
                                "speed": {"ms": {"base": {"1x24": 0.3, "8x24": 1.2},
                                                 "x86-64-v4-int8": {"1x24": 0.5, "8x24": 1.4}}, "fastest": "base"},
                                "not_kept": "slower on this CPU than model.cpu.pt2"}}
    text = cpu_packages.markdown({"variants": variants, "cpu": "a CPU", "models": {
        "sentiment": {"gates": gates, "runs": runs}}}, "the command")
    rows = [line for line in text.splitlines() if line.startswith("| sentiment | 20 | ")]
    assert len(rows) == 2, text
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[3]) > 0 and float(cells[4]) > 0 and float(cells[6]) > 0, row  # TorchScript, base, bf16
        assert cells[5] == "-" and cells[7] == "-", row  # x86-64-v4 and int8 not in this version
    assert "| sentiment | x86-64-v4-bf16 | yes | labels agree 99.92 %" in text
    assert ("| sentiment | x86-64-v4-int8 | no | labels agree 99.92 %, max Δα 0.0017, max Δβ 0.0042 | "
            "base 0.30 / 1.20; x86-64-v4-int8 0.50 / 1.40 ms (fastest: base) | slower on this CPU than "
            "model.cpu.pt2 |") in text
    assert "| sentiment | x86-64-v4 |" not in text  # float32: no gate to show
