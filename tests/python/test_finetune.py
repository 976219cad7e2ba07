"""`python -m qvi finetune`: the pretrained MiniLM encoder (model_store/pretrained, from its hash-pinned wheel) with
QVI, fine-tuned briefly on the demo corpora (a few dozen texts, one epoch: what is tested is the machinery, not the
scores), written as artifacts, served, and answered as the model computes -- with exact per-word contributions and
β per word."""
import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import torch

from qvi_testing import REPO, ServerProcess

from qvi import artifact, calibration, pt2  # noqa: E402
from qvi.finetune import (FinetuneOptions, export, finetune, hold_out, load_finetuned,  # noqa: E402
                          measure_calibration, measure_faithfulness, pretrained_encoder, read_split)
from qvi.hf_encoders import start_from_pretrained  # noqa: E402

PRETRAINED = os.path.join(REPO, "model_store", "pretrained", "all-minilm-l6-v2")
DATA = os.path.join(REPO, "model_store", "data")
CACHE = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2-tests"))  # the zoo tests' package cache
TEXTS = ["The plot is thin but the acting is superb.", "A dull, lifeless film.", "Unbelievably charming, if overlong.",
         "Café naïve — 東京!", "x" * 300]


def tokenize(text, max_tokens=128):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(PRETRAINED, "tokenizer.json"))
    t.no_padding()
    t.enable_truncation(max_tokens)
    return t.encode(text)


def run(model, text):
    enc = tokenize(text)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        return model(ids, torch.ones_like(ids, dtype=torch.bool)), enc


def head_of_split(path, out, texts):
    """The first `texts` texts of a split (a CoNLL file's sentences, a TSV's lines), written to `out`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if path.endswith(".tsv"):
        kept = lines[:texts]
    else:
        kept, n = [], 0
        for line in lines:
            n += not line.strip() and bool(kept) and bool(kept[-1].strip())  # a blank line ends a sentence
            kept.append(line)
            if n == texts:
                break
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(kept) + "\n")
    return out


SPLITS = {"sentiment": ("sentiment", "{}.tsv"), "ner": ("conll2003", "{}.conll")}
LONG_SENTENCE = [("Angela", "B-PER"), ("Merkel", "I-PER"), ("flew", "O"), ("to", "O"), ("Paris", "B-LOC")] + \
    [(f"meeting{i}", "O") for i in range(40)] + [("Berlin", "B-LOC"), ("Siemens", "B-ORG")] * 12


@pytest.fixture(scope="module")
def served():
    """A QVI classifier (QVI pooling, QVI in the top layer) and a CRF tagger, fine-tuned on 96 texts, their cards'
    faithfulness figures measured on 6 answers, calibrated (`qvi calibrate --write`'s path) on 60 dev texts and
    measured on 60 test texts, served."""
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="qvi_finetune_")
    store = os.path.join(work, "store")
    models = {}
    for name, task, options in (
            ("sentiment-tiny", "sentiment", FinetuneOptions(pooling="qvi", qvi_layers=1, epochs=1, limit=96, threads=1,
                                                             held_out=0.25)),
            ("ner-tiny", "ner", FinetuneOptions(epochs=1, limit=96, threads=1, max_tokens=64))):
        model, c, labels, report = finetune(task, DATA, PRETRAINED, options, log=lambda *_: None)
        # The card's faithfulness figures as `qvi demo-pretrained` measures them, on 6 answers of the test split
        figures = measure_faithfulness(export(model, c, labels, report, PRETRAINED, store, name, 1), task, DATA, 6)
        path = export(model, c, labels, report, PRETRAINED, store, name, 1, faithfulness=figures)
        folder, pattern = SPLITS[task]
        dev, test = (head_of_split(os.path.join(DATA, folder, pattern.format(s)),
                                   os.path.join(work, f"{name}.{pattern.format(s)}"), 60) for s in ("dev", "test"))
        if task == "ner":  # and a sentence longer than the tagger reads (64 sub-words): words past it go unanswered
            with open(dev, "a", encoding="utf-8") as f:
                f.write("\n".join(f"{w} {t}" for w, t in LONG_SENTENCE) + "\n\n")
        card = calibration.calibrate(path, dev, test)
        artifact.update_card(path, {"calibration": card})
        models[name] = (model, labels, report, card, dev)
    proc = ServerProcess(store, work)
    yield proc, models
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_qvi_in_the_encoder_starts_from_the_pretrained_function_exactly():
    torch.manual_seed(0)
    plain, _ = pretrained_encoder(PRETRAINED, "classification", ["neg", "pos"], FinetuneOptions(pooling="attention"))
    qvi, c = pretrained_encoder(PRETRAINED, "classification", ["neg", "pos"],
                                FinetuneOptions(pooling="attention", qvi_layers=3))
    qvi.load_state_dict(plain.state_dict(), strict=False)  # the same head; W and u_h stay 0
    start_from_pretrained(qvi)
    plain.eval()
    qvi.eval()
    a, _ = run(plain, TEXTS[0])
    b, _ = run(qvi, TEXTS[0])
    assert torch.equal(a["logits"], b["logits"]), "G = ½·2V = V: the pretrained layers' function"
    assert b["layer_gates"][0, :3].eq(1).all() and b["layer_gates"][0, 3:].eq(0.5).all()
    with torch.no_grad():
        qvi.layers[5].u_qvi.normal_()
        qvi.layers[5].w_qvi.normal_()
    moved, _ = run(qvi, TEXTS[0])
    assert not torch.allclose(moved["logits"], a["logits"]), "the QVI path is live once its parameters move"
    assert not moved["layer_gates"][0, 5].eq(0.5).all()


def test_the_classifier_answers_as_the_model_computes_with_exact_word_contributions(api, served):
    pb, pbg = api
    proc, models = served
    model, labels, report = models["sentiment-tiny"][:3]
    # 96 texts, a quarter of them held out for calibration (held_out=0.25)
    assert report["train_examples"] == 72 and set(report["test"]) == {"accuracy", "macro_f1"}
    stub = pbg.InferenceStub(proc.channel)
    answer = stub.Classify(pb.ClassifyRequest(
        model=pb.ModelSpec(name="sentiment-tiny"), texts=TEXTS,
        options=pb.OutputOptions(top_k=2, attention=True, gates=True, contributions=True, raw_scores=True)), timeout=120)
    for text, result in zip(TEXTS, answer.results):
        out, enc = run(model, text)
        want = torch.softmax(out["logits"][0], -1).numpy()
        got = {s.label: s.score for s in result.labels}
        assert np.allclose([got[label] for label in labels], want, atol=1e-4), text
        words = sorted({w for w in enc.word_ids if w is not None})
        assert len(result.tokens) == len(words)
        alpha = out["attention"][0].numpy()
        beta = out["gates"][0].numpy()
        for token, w in zip(result.tokens, words):
            positions = [p for p, x in enumerate(enc.word_ids) if x == w]
            assert token.text == text[token.start:token.end]
            assert token.attention == pytest.approx(float(alpha[positions].sum()), abs=1e-5), "α sums per word"
            assert token.gate == pytest.approx(float(beta[positions].mean()), abs=1e-5), "β averages per word"
        for k, score in enumerate(result.labels):
            # Σ words' shares + the part no word carries (the bias, [CLS] and [SEP]) = the label's margin, exactly
            total = sum(t.contribution[k] for t in result.tokens) + score.contribution_rest
            assert total == pytest.approx(score.margin, abs=1e-4), text


def test_the_crf_tagger_tags_each_word_as_its_first_subwords_viterbi_tag(api, served):
    pb, pbg = api
    proc, models = served
    model, labels, report = models["ner-tiny"][:3]
    assert set(report["test"]) == {"precision", "recall", "f1"}
    stub = pbg.InferenceStub(proc.channel)
    texts = ["EU rejects German call to boycott British lamb .", "Peter Blackburn in BRUSSELS 1996-08-22"] + TEXTS
    answer = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner-tiny"), texts=texts), timeout=120)
    for text, result in zip(texts, answer.results):
        out, enc = tokenize(text, 64), None
        ids = torch.tensor([out.ids])
        with torch.no_grad():
            tags = model(ids, torch.ones_like(ids, dtype=torch.bool))["tags"][0].tolist()
        first = {}
        for p, w in enumerate(out.word_ids):
            if w is not None and w not in first:
                first[w] = p
        assert [t.tag for t in result.tokens] == [labels[tags[first[w]]] for w in sorted(first)], text
        for span in result.spans:
            assert span.text == text[span.start:span.end]


def test_the_cards_carry_the_faithfulness_of_the_explanations_word_by_word(api, served):
    """`qvi demo-pretrained`'s card figures (qvi.faithfulness word by word), served typed by GetModel: the
    classifier's α, exact contributions and occlusion, the tagger's occlusion, each against the random floor."""
    pb, pbg = api
    proc, _ = served
    stub = pbg.InferenceStub(proc.channel)
    for name, split, want in (("sentiment-tiny", "data/sentiment/test.tsv",
                               {"random", "alpha", "contribution", "last_layer", "rollout", "occlusion"}),
                              ("ner-tiny", "data/conll2003/test.conll", {"random", "occlusion"})):
        md = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name))).model.versions[0].metadata
        f = md.faithfulness
        assert f.measured and (f.split, f.answers) == (split, 6), (name, f)
        got = {m.method: m for m in f.methods}
        assert want <= set(got), (name, sorted(got))
        for method, m in got.items():
            assert 0 <= m.normalised_comprehensiveness.low <= m.normalised_comprehensiveness.high, (name, method)
            assert m.cost.ms_per_text_batch_1 > 0, (name, method)
        assert not got["random"].HasField("vs_random") and got["occlusion"].HasField("vs_random"), name


def test_a_sub_word_models_card_carries_its_calibration_and_every_score_served_is_calibrated(api, served):
    """`qvi calibrate` on a sub-word artifact (its tokenizer.json kept): the classifier's answers are softmax(logits /
    T), the raw softmax on request; the tagger's entity scores are the confidences its calibration measured (the
    mean CRF marginal over the words' first sub-words, at T), so the card's ECE is of the numbers served."""
    pb, pbg = api
    proc, models = served
    stub = pbg.InferenceStub(proc.channel)
    for name in ("sentiment-tiny", "ner-tiny"):
        card = models[name][3]
        assert card_of(os.path.join(proc.work, "store", name, "1", "model.pt"))["calibration"] == card, name
        assert 0.05 <= card["temperature"] <= 20 and card["fitted_on"] == os.path.basename(models[name][4]), name
        for side in ("before", "after"):
            assert 0 <= card[side]["ece"] <= 1 and card[side]["reliability"], (name, side)
        served_card = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name))).model.versions[0].metadata
        assert json.loads(served_card.model_card_json)["calibration"]["temperature"] == card["temperature"], name

    model, labels, _, card, dev = models["sentiment-tiny"]
    assert [c["coverage_target"] for c in card["conformal"]] == [0.9, 0.95]
    texts = [e.text for e in calibration.subword_split(tokenizer_text(), dev, "classification", labels, 128).examples][:8]
    t = card["temperature"]
    for raw in (False, True):
        options = pb.OutputOptions(top_k=len(labels), raw_scores=raw)
        answer = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment-tiny"), texts=texts,
                                                  options=options), timeout=120)
        for text, result in zip(texts, answer.results):
            out, _ = run(model, text)
            want = torch.softmax(out["logits"][0].double() / (1.0 if raw else t), -1)
            assert {s.label: s.score for s in result.labels} == pytest.approx(
                {labels[k]: float(want[k]) for k in range(len(labels))}, abs=2e-4), (raw, text)

    model, tags, _, card, dev = models["ner-tiny"]
    data = calibration.subword_split(tokenizer_text(), dev, "tagging", tags, 64)
    outputs = calibration.subword_tagger_outputs(lambda ids, mask: model._run(ids, mask, False), data, tags,
                                                 calibration.crf_scores(model.crf))
    measured = outputs.entities(card["temperature"])[0]
    answer = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner-tiny"), texts=[e.text for e in data.examples]),
                      timeout=120)
    scores = [s.score for r in answer.results for s in r.spans]
    assert len(scores) == len(measured) > 0
    assert scores == pytest.approx(list(measured), abs=2e-4)


def test_a_slice_held_out_of_training_is_what_the_calibration_is_fitted_on(served):
    """`held_out`: a seeded share of the training split is left out of training, and `qvi demo-pretrained`'s
    calibration is fitted on that slice (drawn again from the card's options), not on the dev split."""
    examples = read_split("sentiment", os.path.join(DATA, "sentiment", "train.tsv"))[:200]
    kept, held = hold_out(examples, 0.1, 7)
    assert len(held) == 20 and len(kept) == 180 and sorted(map(id, kept + held)) == sorted(map(id, examples))
    assert [e.text for e in hold_out(examples, 0.1, 7)[1]] == [e.text for e in held]
    assert [e.text for e in hold_out(examples, 0.1, 8)[1]] != [e.text for e in held]
    assert hold_out(examples, 0.0, 7) == (examples, [])

    proc, models = served
    report = models["sentiment-tiny"][2]
    assert (report["train_examples"], report["held_out_examples"]) == (72, 24)
    model, manifest, text = load_finetuned(os.path.join(proc.work, "store", "sentiment-tiny", "1", "model.pt"))
    card = measure_calibration(model, (manifest, text), "sentiment", DATA)
    assert card["fitted_on"].endswith("train.tsv, the 25 % held out of training (seed 1)"), card["fitted_on"]
    assert card["dev_answers"] == 24 and card["test_answers"] == 1276
    assert models["ner-tiny"][2].get("held_out_examples") is None


def tokenizer_text():
    """The tokenizer.json the tiny models were fine-tuned with (their artifacts carry it)."""
    with open(os.path.join(PRETRAINED, "tokenizer.json"), encoding="utf-8") as f:
        return f.read()


def card_of(model_pt):
    return load_finetuned(model_pt)[1]["model_card"]


NEEDS_BF16 = pytest.mark.skipif(
    not set(pt2.cpu_flags("x86-64-v4", "bfloat16")) <= set(pt2.required_cpu_flags("native")),
    reason="this CPU cannot run an x86-64-v4 bf16 package (needs AVX-512 and AVX512-BF16)")


@NEEDS_BF16
def test_a_bf16_package_of_a_fine_tuned_encoder_is_kept_only_through_its_fidelity_gate(api, served, monkeypatch):
    """`qvi finetune-packages`: the bf16 package is compiled from model.pt, measured against the float32 model on
    the test split (here its first 48 texts), and the card says so either way; a package that fails its gate is
    not written (and one written before is removed), one that passes is written and is what the server serves."""
    from qvi import fidelity
    from qvi.finetune_packages import add_variants
    pb, pbg = api
    proc, models = served
    model, labels, report = models["sentiment-tiny"][:3]
    work = tempfile.mkdtemp(prefix="qvi_finetune_packages_")
    store = os.path.join(work, "store")
    shutil.copytree(os.path.join(proc.work, "store", "sentiment-tiny", "1"), os.path.join(store, "sentiment-tiny", "1"))
    model_pt = os.path.join(store, "sentiment-tiny", "1", "model.pt")
    bf16 = os.path.join(store, "sentiment-tiny", "1", pt2.variant_file("x86-64-v4-bf16"))
    variant = "x86-64-v4-bf16"
    monkeypatch.setitem(fidelity.LIMITS, "explanations_abs", 1e-7)  # bf16 cannot meet it
    reports = add_variants(model_pt, [variant], DATA, CACHE, speed_gate=False, log=lambda *_: None, test_limit=48)
    gate = reports[variant]["fidelity"]
    assert reports[variant]["kept"] is False and gate["passed"] is False and gate["texts"] == 48
    assert any("differs by up to" in why and "limit 1e-07" in why for why in gate["failed"]), gate
    assert not os.path.exists(bf16)
    assert card_of(model_pt)["cpu_packages"][variant]["fidelity"]["passed"] is False

    monkeypatch.setitem(fidelity.LIMITS, "explanations_abs", 0.02)
    monkeypatch.setitem(fidelity.LIMITS, "label_agreement", 0.9)  # a one-epoch model's margins are thin
    reports = add_variants(model_pt, [variant], DATA, CACHE, speed_gate=False, log=lambda *_: None, test_limit=48)
    gate = reports[variant]["fidelity"]
    assert reports[variant]["kept"] is True and gate["passed"] is True, gate
    assert gate["label_agreement"] >= 0.9 and gate["max_abs_attention"] <= 0.02 and gate["max_abs_gates"] <= 0.02
    assert reports[variant]["speed"] == "not gated (--no-speed-gate)"
    assert os.path.exists(bf16) and card_of(model_pt)["cpu_packages"][variant]["kept"] is True
    server = ServerProcess(store, work)
    try:
        stub = pbg.InferenceStub(server.channel)
        info = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment-tiny")), timeout=60)
        md = info.model.versions[0].metadata
        assert (md.format, md.file, md.precision) == ("pt2", pt2.variant_file(variant), "bfloat16")
        answer = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment-tiny"), texts=TEXTS[:3],
                                                  options=pb.OutputOptions(top_k=2, attention=True, raw_scores=True)), timeout=120)
        for text, result in zip(TEXTS, answer.results):
            out, _ = run(model, text)
            want = torch.softmax(out["logits"][0], -1).numpy()
            got = {s.label: s.score for s in result.labels}
            assert np.allclose([got[label] for label in labels], want, atol=0.02), text
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
