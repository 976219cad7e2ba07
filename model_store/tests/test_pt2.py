"""The AOTInductor export (qvi/pt2.py) of every architecture that has one: the package answers like
the eager model and the TorchScript file at several batch sizes and lengths, padded rows included
(logits, emissions, α, β, λ and the per-layer outputs, within 1e-5); its pt2.json carries what the
server needs; the architectures that cannot be exported say so and ship TorchScript alone.

Compiling takes 20-60 s per architecture on two cores, so packages are kept in a cache folder
(QVI_PT2_CACHE, default ~/.cache/qvi/pt2-tests) keyed by weights, exporter code and torch version:
a warm run reuses them, a changed exporter compiles again. The C++ side (the server's loader, its
Viterbi, parity with TorchScript inside the server) is tested in tests/cpp/core/model/model_test.cc."""
import json
import os

import pytest
import torch

from qvi import artifact, pt2
from qvi.cli import export_checkpoint
from qvi.models import ARCHITECTURES, BASELINES, TAGGERS, ModelConfig, TransformerCRF, build_model
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_to_json

CACHE = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2-tests"))
VOCAB = 40
EXPORTABLE = [a for a in ARCHITECTURES if a not in pt2.UNEXPORTABLE]
# The tests compile with freezing forced, not the exporter's "auto" (which compiles twice, to time
# both): the tests of "auto" are the last ones here.
FREEZING = "on"


def make(arch, tmp_path, score="additive"):
    """`arch` may name a context too: "ctx_transformer:deep"; "+casing" folds case classes into the ids."""
    arch, casing = arch.split("+")[0], arch.endswith("+casing")
    arch, _, context = arch.partition(":")
    torch.manual_seed(11)
    num = 5 if arch in TAGGERS else 3
    cfg = ModelConfig(arch, VOCAB, num, g="none" if arch in BASELINES else "qvi", score=score, emb_dim=16, hidden=16, heads=2, layers=2, ffn=32,
                      max_tokens=32, context=context, case_dim=4 if casing else 0)
    model = build_model(cfg).eval()
    # Trained-looking CRF scores, so that Viterbi's choices are not all ties.
    if isinstance(model, TransformerCRF):
        with torch.no_grad():
            model.crf.trans.normal_(0, 1)
            model.crf.start.normal_(0, 1)
            model.crf.end.normal_(0, 1)
    vocab = Vocabulary(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(VOCAB - 2)])
    labels = ["O", "B-x", "I-x", "B-y", "I-y"] if arch in TAGGERS else ["a", "b", "c"]
    manifest = artifact.build_manifest("m", cfg, TokenizerConfig(max_tokens=32, casing=casing), vocab, labels, "BIO", {})
    return model, manifest, vocab


def padded_batch(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return torch.randint(2, VOCAB, (b, t), generator=g) * mask, mask


# Every exportable architecture with the default score, the MLP and scaled-dot scores once each, and
# the deep and deep-global contexts once each, with frozen weights; three without.
@pytest.mark.parametrize("arch,score,freezing", [(a, "additive", FREEZING) for a in EXPORTABLE] +
                         [("cnn_att", "mlp", FREEZING), ("transformer", "scaled_dot", FREEZING),
                          ("ctx_transformer:deep", "additive", FREEZING),
                          ("ctx_transformer_crf:deep_global", "additive", FREEZING),
                          ("cnn_transformer_crf+casing", "additive", FREEZING),
                          ("cnn_att", "additive", "off"), ("transformer", "additive", "off"),
                          ("cnn_transformer_crf", "additive", "off")])
def test_the_package_answers_like_the_eager_model_and_torchscript(arch, score, freezing, tmp_path):
    model, manifest, vocab = make(arch, tmp_path, score)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE,
                            freezing=freezing)
    assert os.path.basename(path) == "model.cpu.pt2"
    script = torch.jit.load(artifact.export(model, manifest, vocab, str(tmp_path / "store"), 1))
    compiled = pt2.load_methods(path)
    transformer = hasattr(model, "forward_without_maps")
    assert set(compiled) == ({"model", "without_maps"} if transformer else {"model"})
    with torch.no_grad():
        for b, t in [(1, 2), (3, 17), (8, 32), (2, 5)]:
            ids, mask = padded_batch(b, t, seed=b * 100 + t)
            if manifest["tokenizer"]["casing"]:
                ids = ids + VOCAB * (ids % 5) * mask  # every case class (tokenizer rule 7)
            eager = model(ids, mask)
            scripted = script(ids, mask)
            got = compiled["model"](ids, mask)
            # Taggers' packages stop at the emissions; the server decodes the tags (viterbi.cc).
            assert set(got) == set(eager) - {"tags"}
            for name, value in got.items():
                assert value.shape == eager[name].shape, name
                assert (value - eager[name]).abs().max().item() <= 1e-5, (name, b, t)
                assert (value - scripted[name]).abs().max().item() <= 1e-5, (name, b, t)
            if transformer:
                lean = compiled["without_maps"](ids, mask)
                assert set(lean) == set(got) - {"layer_attention"}
                for name, value in lean.items():
                    assert (value - eager[name]).abs().max().item() <= 1e-5, (name, b, t)


@pytest.mark.parametrize("arch", EXPORTABLE)
def test_pt2_json_says_what_the_server_needs(arch, tmp_path):
    model, manifest, vocab = make(arch, tmp_path)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE,
                            freezing=FREEZING)
    extra = pt2.read_extra(path)
    assert json.loads(extra["manifest.json"]) == json.loads(json.dumps(manifest))
    assert extra["vocab.txt"] == vocab.to_text()
    info = json.loads(extra[pt2.PT2_INFO])
    assert info["device"] == "cpu" and info["cpu_target"] == "x86-64-v3"
    assert info["cpu_flags"] == pt2.X86_64_V3_FLAGS and "avx512f" not in info["cpu_flags"]
    assert info["dtype"] == "float32" and info["freezing"] is True and "freezing_choice" not in info
    assert info["torch_version"] == torch.__version__.split("+")[0]
    assert (info["min_tokens"], info["max_tokens"], info["max_batch"]) == (pt2.MIN_TOKENS, 32, pt2.MAX_BATCH)
    assert "logits" in info["outputs"]["model"] or "emissions" in info["outputs"]["model"]
    if arch in TAGGERS:
        crf = info["crf"]
        assert torch.equal(torch.tensor(crf["transitions"]), model.crf.trans.detach())
        assert torch.equal(torch.tensor(crf["start"]), model.crf.start.detach())
        assert info["server_decodes"] == "tags"
    else:
        assert "crf" not in info
    assert manifest["pt2"] == {"exportable": True}


def test_a_cached_package_gets_the_new_manifest(tmp_path):
    model, manifest, vocab = make("cnn_att", tmp_path)
    first = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path / "a"), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE,
                            freezing=FREEZING)
    manifest = dict(manifest, model_card={"description": "a later export of the same weights"})
    second = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path / "b"), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE,
                            freezing=FREEZING)
    assert json.loads(pt2.read_extra(first)["manifest.json"])["model_card"] != manifest["model_card"]
    assert json.loads(pt2.read_extra(second)["manifest.json"])["model_card"] == manifest["model_card"]
    ids, mask = padded_batch(3, 9, seed=1)
    a, b = pt2.load_methods(first)["model"](ids, mask), pt2.load_methods(second)["model"](ids, mask)
    assert all(torch.equal(a[k], b[k]) for k in a)
    key = pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing=FREEZING)
    assert os.path.exists(os.path.join(CACHE, key + ".pt2"))
    with torch.no_grad():
        model.out.bias.add_(1.0)  # other weights: another key, so a new compile
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing=FREEZING) != key


def test_the_cache_key_follows_the_model_code(tmp_path, monkeypatch):
    """Same weights and manifest, but a changed forward (models.py or qvi/nn/): another key, so the
    package is compiled again rather than served stale from the cache."""
    model, manifest, _ = make("cnn_att", tmp_path)
    key = pt2.cache_key(model, manifest, "cpu", "x86-64-v3")
    code = {os.path.relpath(p, os.path.dirname(pt2.__file__)) for p in pt2._CODE}
    assert {"pt2.py", "models.py", os.path.join("nn", "self_attention.py"), os.path.join("nn", "additive.py")} <= code
    for name in ("models.py", "self_attention.py"):
        original = next(p for p in pt2._CODE if os.path.basename(p) == name)
        edited = tmp_path / name
        with open(original, "rb") as f:
            edited.write_bytes(f.read() + b"\n# a change\n")
        monkeypatch.setattr(pt2, "_CODE", [str(edited) if p == original else p for p in pt2._CODE])
        assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3") != key, name
        monkeypatch.undo()
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3") == key


@pytest.mark.parametrize("arch", sorted(pt2.UNEXPORTABLE))
def test_what_cannot_be_exported_says_so_and_ships_torchscript(arch, tmp_path):
    cfg = ModelConfig(arch, VOCAB, 2, g="none" if arch in BASELINES else "qvi", emb_dim=8, hidden=8, boundary_ids=[3])
    vocab = Vocabulary(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(VOCAB - 2)])
    manifest = artifact.build_manifest("m", cfg, TokenizerConfig(), vocab, ["a", "b"], "", {})
    assert manifest["pt2"] == {"exportable": False, "reason": pt2.UNEXPORTABLE[arch]}
    torch.save({"config": cfg.to_json(), "vocab": vocab.tokens, "tokenizer": config_to_json(TokenizerConfig()),
                "labels": ["a", "b"], "scheme": "", "state_dict": build_model(cfg).state_dict(),
                "metrics": {}, "train_options": {"seed": 1}, "data": {}}, tmp_path / "c.ckpt")
    written = export_checkpoint(str(tmp_path / "c.ckpt"), str(tmp_path / "store"), "m", 1, {}, "both")
    assert [os.path.basename(p) for p in written] == ["model.pt"]
    with pytest.raises(SystemExit, match="cannot be exported to a .pt2"):
        export_checkpoint(str(tmp_path / "c.ckpt"), str(tmp_path / "store"), "m", 2, {}, "pt2")


# --- native CPU packages (x86-64-v4, bf16) and the fidelity gate -----------------------------------

NEEDS_BF16 = pytest.mark.skipif(
    not set(pt2.cpu_flags("x86-64-v4", "bfloat16")) <= set(pt2.required_cpu_flags("native")),
    reason="this CPU cannot run an x86-64-v4 bf16 package (needs AVX-512 and AVX512-BF16)")


def write_checkpoint(arch, tmp_path, n_texts=80):
    """A checkpoint of make()'s model and a test split; a classifier's output layer is scaled up, so
    that its labels are decided by clear margins (bf16 rounding must not flip a near tie of an
    untrained model)."""
    model, manifest, vocab = make(arch, tmp_path)
    tagging = arch in TAGGERS
    if not tagging:  # a tagger's gate compares entity F1, which a flipped near tie moves little
        with torch.no_grad():
            model.out.weight.mul_(30.0)
    cfg = ModelConfig(**manifest["architecture"]["config"])
    labels = manifest["tags"] if tagging else manifest["labels"]
    torch.save({"config": cfg.to_json(), "vocab": vocab.tokens, "tokenizer": config_to_json(TokenizerConfig(max_tokens=32)),
                "labels": labels, "scheme": "BIO", "state_dict": model.state_dict(), "metrics": {},
                "train_options": {"seed": 1}, "data": {}}, tmp_path / "c.ckpt")
    g = torch.Generator().manual_seed(5)
    lines = []
    for i in range(n_texts):
        words = [f"w{int(w)}" for w in torch.randint(0, VOCAB - 2, (int(torch.randint(1, 20, (1,), generator=g)),),
                                                     generator=g)]
        if tagging:
            lines += [f"{w}\t{'B-x' if j == 0 and i % 2 else 'O'}" for j, w in enumerate(words)] + [""]
        else:
            lines.append(f"{['a', 'b', 'c'][i % 3]}\t{' '.join(words)}")
    test = tmp_path / ("test.conll" if tagging else "test.tsv")
    test.write_text("\n".join(lines) + "\n")
    return str(tmp_path / "c.ckpt"), str(test), model


def times_with_fastest(fastest, timed):
    """A stand-in for the speed gate's measurement (pt2.time_packages) whose outcome is chosen: `fastest`
    runs 0.1 ms at one text and every package 0.5 ms at eight; the packages timed go into `timed`."""
    def fake_times(paths, vocab_size, **kwargs):
        timed.append(sorted(paths))
        return {name: {"1x24": 0.1 if name == fastest else 0.3, "8x24": 0.5} for name in paths}
    return fake_times


@NEEDS_BF16
def test_native_variants_are_written_beside_the_portable_package_and_the_card_records_the_gate(tmp_path,
                                                                                              monkeypatch):
    ckpt, test, model = write_checkpoint("transformer", tmp_path)
    timed = []
    monkeypatch.setattr(pt2, "time_packages", times_with_fastest("x86-64-v4-bf16", timed))
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=["x86-64-v4-bf16", "x86-64-v4"], fidelity_test=test)
    assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2", "model.cpu.x86-64-v4-bf16.pt2",
                                                      "model.cpu.x86-64-v4.pt2"]
    bf16 = json.loads(pt2.read_extra(written[2])[pt2.PT2_INFO])
    assert (bf16["dtype"], bf16["cpu_target"]) == ("bfloat16", "x86-64-v4")
    assert set(pt2.X86_64_V4_FLAGS) | {"avx512_bf16"} == set(bf16["cpu_flags"])
    v4 = json.loads(pt2.read_extra(written[3])[pt2.PT2_INFO])
    assert (v4["dtype"], v4["cpu_flags"]) == ("float32", pt2.X86_64_V4_FLAGS)
    # The card travels in every file of the version, the gate's figures in it.
    cards = [json.loads(pt2.read_extra(p)["manifest.json"])["model_card"] for p in written[1:]]
    assert cards[0] == cards[1] == cards[2]
    gate = cards[0]["cpu_packages"]["x86-64-v4-bf16"]
    assert gate["kept"] is True and gate["fidelity_test"] == "test.tsv"
    assert timed == [["base", "x86-64-v4", "x86-64-v4-bf16"]] and gate["speed"]["fastest"] == "x86-64-v4-bf16"
    f = gate["fidelity"]
    assert f["passed"] is True and f["texts"] == 80 and f["label_agreement"] >= 0.995
    assert 0 < f["max_abs_attention"] <= 0.02 and 0 < f["max_abs_gates"] <= 0.02  # bf16 rounds: never exact
    assert cards[0]["cpu_packages"]["x86-64-v4"] == {"cpu_target": "x86-64-v4", "dtype": "float32", "kept": True}
    # The bf16 package answers in float32, near the float32 model.
    ids, mask = padded_batch(4, 20, seed=3)
    got = pt2.load_methods(written[2])["model"](ids, mask)
    want = model(ids, mask)
    assert all(v.dtype == torch.float32 for v in got.values())
    assert (got["attention"] - want["attention"]).abs().max().item() < 0.02


@NEEDS_BF16
@pytest.mark.parametrize("fastest", ["x86-64-v4", "base"])
def test_a_bf16_variant_slower_than_a_float32_package_is_not_written_and_the_card_says_which(tmp_path, monkeypatch,
                                                                                            fastest):
    """The server's "auto" loads bf16 before x86-64-v4 and the base package: a bf16 package that passes
    its fidelity gate but runs no faster than either on the exporting CPU would slow the version down."""
    ckpt, test, _ = write_checkpoint("transformer", tmp_path)
    timed = []
    monkeypatch.setattr(pt2, "time_packages", times_with_fastest(fastest, timed))
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=["x86-64-v4-bf16", "x86-64-v4"], fidelity_test=test)
    assert timed == [["base", "x86-64-v4", "x86-64-v4-bf16"]]
    want = ["model.pt", "model.cpu.pt2", "model.cpu.x86-64-v4.pt2"]
    assert [os.path.basename(p) for p in written] == want
    card = json.loads(pt2.read_extra(written[1])["manifest.json"])["model_card"]["cpu_packages"]
    gate = card["x86-64-v4-bf16"]
    assert gate["fidelity"]["passed"] is True and gate["kept"] is False
    assert gate["not_kept"] == f"slower on this CPU than {'model.cpu.pt2' if fastest == 'base' else fastest}"
    assert gate["speed"]["fastest"] == fastest and gate["speed"]["ms"]["x86-64-v4-bf16"] == {"1x24": 0.3, "8x24": 0.5}
    assert card["x86-64-v4"]["kept"] is True


@NEEDS_BF16
def test_with_the_speed_gate_off_a_bf16_variant_that_passes_its_fidelity_gate_is_written_untimed(tmp_path,
                                                                                                 monkeypatch):
    ckpt, test, _ = write_checkpoint("transformer", tmp_path)

    def never(*args, **kwargs):
        raise AssertionError("the speed gate is off: nothing is timed")

    monkeypatch.setattr(pt2, "time_packages", never)
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=["x86-64-v4-bf16"], fidelity_test=test, speed_gate=False)
    assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2", "model.cpu.x86-64-v4-bf16.pt2"]
    gate = json.loads(pt2.read_extra(written[1])["manifest.json"])["model_card"]["cpu_packages"]["x86-64-v4-bf16"]
    assert gate["kept"] is True and gate["fidelity"]["passed"] is True
    assert gate["speed"] == "not gated (--cpu-speed-gate off)"


@pytest.mark.parametrize("ms, kept, why", [
    # {package: ms at one text (eight texts: 1.0 ms for all)}, what stays, why each other reduced one went
    ({"base": 0.5, "x86-64-v4": 0.4, "x86-64-v4-bf16": 0.3, "x86-64-v4-int8": 0.2},
     ["x86-64-v4-bf16", "x86-64-v4-int8", "x86-64-v4"], {}),
    ({"base": 0.5, "x86-64-v4": 0.4, "x86-64-v4-bf16": 0.2, "x86-64-v4-int8": 0.3},
     ["x86-64-v4-bf16", "x86-64-v4"], {"x86-64-v4-int8": "slower on this CPU than x86-64-v4-bf16"}),
    ({"base": 0.5, "x86-64-v4": 0.3, "x86-64-v4-bf16": 0.4, "x86-64-v4-int8": 0.2},
     ["x86-64-v4-int8", "x86-64-v4"], {"x86-64-v4-bf16": "slower on this CPU than x86-64-v4"}),
    ({"base": 0.2, "x86-64-v4": 0.3, "x86-64-v4-bf16": 0.3, "x86-64-v4-int8": 0.2},  # a tie keeps the float32
     ["x86-64-v4"], {"x86-64-v4-bf16": "slower on this CPU than model.cpu.pt2",
                     "x86-64-v4-int8": "slower on this CPU than model.cpu.pt2"}),
])
def test_the_speed_gate_keeps_a_reduced_package_only_if_it_beats_every_package_auto_would_load_after_it(
        monkeypatch, ms, kept, why):
    from qvi import workflow
    monkeypatch.setattr(pt2, "write_cached", lambda *args, **kwargs: "unused")
    monkeypatch.setattr(pt2, "time_packages",
                        lambda paths, vocab_size, **kw: {n: {"1x24": ms[n], "8x24": 1.0} for n in paths})
    variants = ["x86-64-v4-bf16", "x86-64-v4-int8", "x86-64-v4"]
    reports = {v: {"kept": True} for v in variants}
    workflow.keep_if_faster(None, {}, "[PAD]\n[UNK]\na\n", 3, "cache", "x86-64-v3", "auto", variants, reports)
    assert variants == kept
    for v in ("x86-64-v4-bf16", "x86-64-v4-int8"):
        assert reports[v]["kept"] is (v in kept) and reports[v].get("not_kept") == why.get(v)
        assert reports[v]["speed"]["fastest"] == min(ms, key=lambda n: ms[n])
    assert "speed" not in reports["x86-64-v4"]  # float32: never gated


@NEEDS_BF16
def test_a_bf16_variant_that_fails_the_gate_is_not_written_and_the_card_says_why(tmp_path, monkeypatch):
    from qvi import fidelity
    ckpt, test, _ = write_checkpoint("transformer", tmp_path)
    monkeypatch.setitem(fidelity.LIMITS, "explanations_abs", 1e-7)  # bf16 cannot meet it
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=["x86-64-v4-bf16"], fidelity_test=test)
    assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2"]
    assert not os.path.exists(tmp_path / "store" / "m" / "1" / "model.cpu.x86-64-v4-bf16.pt2")
    gate = json.loads(pt2.read_extra(written[1])["manifest.json"])["model_card"]["cpu_packages"]["x86-64-v4-bf16"]
    assert gate["kept"] is False and gate["fidelity"]["passed"] is False
    assert any("attention differs by up to" in r and "limit 1e-07" in r for r in gate["fidelity"]["failed"])


@NEEDS_BF16
def test_the_gate_of_a_tagger_scores_entities_as_the_server_decodes_them(tmp_path):
    """A tagger's package stops at the emissions; the gate decodes them with the float32 CRF, as the
    server does, and its float32 F1 is the zoo's own evaluation of the eager model."""
    from qvi import fidelity
    from qvi.data import encode_examples, read_conll
    from qvi.train import evaluate
    ckpt, test, model = write_checkpoint("cnn_transformer_crf", tmp_path)
    _, manifest, vocab = make("cnn_transformer_crf", tmp_path)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", "x86-64-v4", CACHE, "bfloat16",
                            pt2.variant_file("x86-64-v4-bf16"), FREEZING)
    cfg = ModelConfig(**manifest["architecture"]["config"])
    data = encode_examples(read_conll(test), TokenizerConfig(max_tokens=32), vocab, manifest["tags"], "BIO", True)
    report = fidelity.measure(path, model, cfg, data, manifest["tags"])
    assert report["f1_float32"] == round(100 * evaluate(model, cfg, data, manifest["tags"])["f1"], 3)
    assert report["passed"] is (abs(report["f1"] - report["f1_float32"]) <= 0.3 and report["max_abs_attention"] <= 0.02
                                and report["max_abs_gates"] <= 0.02)
    assert report["texts"] == len(data) and 0 <= report["label_agreement"] <= 1


@NEEDS_BF16
def test_a_bf16_variant_without_a_test_split_is_refused_before_any_compile(tmp_path):
    ckpt, _, _ = write_checkpoint("transformer", tmp_path, n_texts=3)
    with pytest.raises(SystemExit, match="the x86-64-v4-bf16 package needs --fidelity-test"):
        export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", cpu_variants=["x86-64-v4-bf16"])
    assert not os.path.exists(tmp_path / "store")


NEEDS_INT8 = pytest.mark.skipif(
    not set(pt2.cpu_flags("x86-64-v4", "int8")) <= set(pt2.required_cpu_flags("native")),
    reason="this CPU cannot run an x86-64-v4 int8 package (needs AVX-512 and AVX512-VNNI)")
INT8 = "x86-64-v4-int8"


def wrapper_code(package):
    """The C++ that AOTInductor generated for a package's methods (what the server runs)."""
    from torch.export.pt2_archive._package import PT2ArchiveReader
    with PT2ArchiveReader(package) as reader:
        return "".join(reader.read_string(n) for n in reader.get_file_names() if n.endswith("wrapper.cpp"))


@NEEDS_INT8
@pytest.mark.parametrize("fastest", [INT8, "base"])
def test_an_int8_variant_runs_every_linear_in_int8_and_is_kept_only_where_it_is_the_fastest(tmp_path, monkeypatch,
                                                                                          fastest):
    ckpt, test, model = write_checkpoint("transformer", tmp_path)
    timed = []
    monkeypatch.setattr(pt2, "time_packages", times_with_fastest(fastest, timed))
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=[INT8], fidelity_test=test)
    assert timed == [["base", INT8]]
    card = json.loads(pt2.read_extra(written[1])["manifest.json"])["model_card"]["cpu_packages"][INT8]
    assert card["fidelity"]["passed"] is True and card["fidelity"]["texts"] == 80
    assert 0 < card["fidelity"]["max_abs_gates"] <= 0.02  # int8 rounds: never exact
    assert card["speed"]["fastest"] == fastest and card["speed"]["ms"][INT8]["8x24"] == 0.5
    if fastest == "base":
        assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2"]
        assert card["kept"] is False and card["not_kept"] == "slower on this CPU than model.cpu.pt2"
        return
    assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2", "model.cpu.x86-64-v4-int8.pt2"]
    assert card["kept"] is True
    info = json.loads(pt2.read_extra(written[2])[pt2.PT2_INFO])
    assert (info["dtype"], info["cpu_target"], info["freezing"]) == ("int8", "x86-64-v4", True)
    assert set(info["cpu_flags"]) == set(pt2.X86_64_V4_FLAGS) | {"avx512_vnni"}
    # Every Linear layer of both methods is one oneDNN int8 product (6 per method: 2 layers of
    # Q, K, V, O and the feed-forward's two; the QVI pooling's and the output's); the one float32
    # product left per method is the contribution output's (the pooled values times the output
    # layer's weight, [B,T,D] x [D,C]), kept in float so that the tokens' shares stay exact.
    code = wrapper_code(written[2])
    linears = sum(1 for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert code.count("aoti_torch_cpu__qlinear_pointwise") == 2 * linears
    floats = {f: code.count(f) for f in ("cpu__linear_pointwise", "cpu__mkl_linear", "cpu_addmm", "cpu_mm_out")}
    assert floats == {"cpu__linear_pointwise": 2, "cpu__mkl_linear": 0, "cpu_addmm": 0, "cpu_mm_out": 0}, floats
    ids, mask = padded_batch(4, 20, seed=3)
    got = pt2.load_methods(written[2])["model"](ids, mask)
    want = model(ids, mask)
    assert all(v.dtype == torch.float32 for v in got.values())
    assert 0 < (got["gates"] - want["gates"]).abs().max().item() < 0.02


@NEEDS_INT8
def test_an_int8_variant_that_does_not_compile_is_left_out_and_the_card_says_why(tmp_path, monkeypatch):
    ckpt, test, _ = write_checkpoint("transformer", tmp_path, n_texts=3)

    def fails(*args, **kwargs):  # as torchao's lowering fails on the CNN-Att model (workflow._variant)
        raise TypeError("torch.Size() takes an iterable of 'int' (item 0 is 'Node')")

    monkeypatch.setattr(pt2, "quantize_int8", fails)
    key = pt2.cache_key  # the int8 package of the test above may be in the cache: compile this one anew

    def int8_uncached(model, manifest, device, cpu_target, dtype="float32", freezing="auto"):
        return key(model, manifest, device, cpu_target, dtype, freezing) + ("-uncached" if dtype == "int8" else "")

    monkeypatch.setattr(pt2, "cache_key", int8_uncached)
    written = export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "both", pt2_cache=CACHE, freezing=FREEZING,
                                cpu_variants=[INT8], fidelity_test=test)
    assert [os.path.basename(p) for p in written] == ["model.pt", "model.cpu.pt2"]
    card = json.loads(pt2.read_extra(written[1])["manifest.json"])["model_card"]["cpu_packages"][INT8]
    assert card == {"cpu_target": "x86-64-v4", "dtype": "int8", "kept": False,
                    "not_kept": "did not compile or pass the package check: TypeError: torch.Size() takes an "
                                "iterable of 'int' (item 0 is 'Node')"}


def test_int8_quantizing_that_finds_no_linear_layer_fails_loudly(tmp_path, monkeypatch):
    """torch 2.11's non-strict export records no `source_fn_stack`, so the quantizer would annotate
    nothing and the "int8" package would be float32 throughout: the exporter refuses that."""
    model, _, _ = make("transformer", tmp_path)
    entry = dict(pt2.methods(model))["model"]
    export = torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: export(*a, **dict(k, strict=False)))
    b = torch.export.Dim("batch", min=1, max=8)
    t = torch.export.Dim("tokens", min=2, max=32)
    with pytest.raises(RuntimeError, match=r"int8: the quantizer annotated 0 of \d+ Linear layers"):
        pt2.quantize_int8(entry, padded_batch(2, 8, seed=1), ({0: b, 1: t}, {0: b, 1: t}))


def test_variants_need_cpu_packages_and_known_names(tmp_path):
    ckpt, _, _ = write_checkpoint("transformer", tmp_path, n_texts=3)
    with pytest.raises(SystemExit, match="--cpu-variants needs CPU packages"):
        export_checkpoint(ckpt, str(tmp_path / "store"), "m", 1, {}, "torchscript", cpu_variants=["x86-64-v4"])
    assert not os.path.exists(tmp_path / "store")
    with pytest.raises(ValueError, match="must be one of"):
        pt2.variant_file("avx9")
    model, manifest, _ = make("transformer", tmp_path)
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v4", "bfloat16") != pt2.cache_key(model, manifest, "cpu",
                                                                                            "x86-64-v4")


def test_freezing_is_kept_where_it_is_faster_by_the_geometric_mean_of_the_shapes():
    # The two machines of docs/performance.md: Intel (unfrozen 1.57x at batch 1, 1.09x at 8) and
    # AMD (about 0.02 ms slower frozen at batch 1, 1.4x faster at 8).
    assert not pt2.choose_freezing({"frozen": {"1x24": 0.46, "8x24": 1.20}, "unfrozen": {"1x24": 0.30, "8x24": 1.10}})
    assert pt2.choose_freezing({"frozen": {"1x24": 0.27, "8x24": 0.80}, "unfrozen": {"1x24": 0.25, "8x24": 1.12}})
    assert pt2.choose_freezing({"frozen": {"1x24": 1.0, "8x24": 2.0}, "unfrozen": {"1x24": 2.0, "8x24": 1.0}})  # tie


@pytest.mark.parametrize("faster", ["frozen", "unfrozen"])
def test_auto_freezing_writes_the_package_timed_faster_and_says_what_it_measured(faster, tmp_path, monkeypatch):
    """Both packages are compiled; which one is written follows the timing (faked here, so that each
    outcome is seen), and pt2.json records the times, the choice and the CPU. Not cached: each run
    compiles both."""
    model, manifest, vocab = make("cnn_att", tmp_path)
    timed = []

    def fake_times(paths, vocab_size, seconds=pt2.FREEZING_SECONDS, rounds=5):
        timed.append(sorted(paths))
        for path in paths.values():  # each candidate is a complete package that loads and runs
            assert set(pt2.load_methods(path)) == {"model"}
        slow, fast = {"1x24": 0.5, "8x24": 2.0}, {"1x24": 0.3, "8x24": 1.5}
        return {name: fast if name == faster else slow for name in paths}

    monkeypatch.setattr(pt2, "time_packages", fake_times)
    path = pt2.write_package(model, manifest, vocab.to_text(), str(tmp_path / "v"), "cpu", pt2.DEFAULT_CPU_TARGET)
    assert timed == [["frozen", "unfrozen"]]
    info = json.loads(pt2.read_extra(path)[pt2.PT2_INFO])
    assert info["freezing"] is (faster == "frozen")
    choice = info["freezing_choice"]
    assert choice["kept"] == faster and choice["cpu"] == pt2.cpu_model() and choice["torch_threads"] == 1
    assert choice["ms"][faster] == {"1x24": 0.3, "8x24": 1.5}
    assert sorted(os.listdir(tmp_path / "v")) == ["model.cpu.pt2"]  # the candidates are gone


def test_auto_freezing_times_both_packages_for_real_and_keeps_the_faster(tmp_path):
    model, manifest, vocab = make("transformer", tmp_path)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE)
    info = json.loads(pt2.read_extra(path)[pt2.PT2_INFO])
    ms = info["freezing_choice"]["ms"]
    assert set(ms) == {"frozen", "unfrozen"}
    assert all(set(v) == {f"{b}x{t}" for b, t in pt2.FREEZING_SHAPES} and min(v.values()) > 0 for v in ms.values())
    assert info["freezing"] is pt2.choose_freezing(ms)
    assert info["freezing_choice"]["kept"] == ("frozen" if info["freezing"] else "unfrozen")


def test_forced_freezing_is_recorded_and_each_mode_has_its_own_cache_key(tmp_path, monkeypatch):
    model, manifest, vocab = make("cnn_att", tmp_path)
    keys = {mode: pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing=mode) for mode in pt2.FREEZING}
    assert len(set(keys.values())) == 3
    # "auto" was timed on this CPU: another CPU compiles and times again.
    monkeypatch.setattr(pt2, "cpu_model", lambda: "Another CPU")
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing="auto") != keys["auto"]
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing="off") == keys["off"]
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE,
                            freezing="off")
    info = json.loads(pt2.read_extra(path)[pt2.PT2_INFO])
    assert info["freezing"] is False and "freezing_choice" not in info
    with pytest.raises(ValueError, match="freezing must be one of"):
        pt2.cache_key(model, manifest, "cpu", "x86-64-v3", freezing="sometimes")
