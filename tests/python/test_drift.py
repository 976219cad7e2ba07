"""Drift gauges (server/core/serving/drift.h; docs/observability.md, "Drift"): the demo models' cards record
their test split (model_store/qvi/drift.py), and the server compares its last --drift-window-texts callers'
texts with it. Texts of the model's own test split read as no drift, and the server's figures are the ones
computed here offline over the same texts; texts of another corpus move the gauges: BBC articles sent to the
sentiment classifier, tweets sent to the CoNLL tagger."""
import os

import numpy as np
import pytest

from qvi import artifact, drift
from qvi_testing import REPO, STORE, ServerProcess, metrics_of, post_json

DATA = os.path.join(REPO, "model_store", "data")
WINDOW = 300


def tsv_rows(path, n):
    with open(path) as f:
        return [line.rstrip("\n").split("\t", 1) for line in f][:n]


def conll_sentences(path, n):
    sentences, words = [], []
    with open(path) as f:
        for line in f:
            if line.strip():
                words.append(line.split()[0])
            elif words:
                sentences.append(" ".join(words))
                words = []
    if words:
        sentences.append(" ".join(words))
    sentences = [s for s in sentences if not s.startswith("-DOCSTART-")]
    # A seeded draw: the split's documents run in order (a test split opens with sports results).
    return [sentences[i] for i in sorted(np.random.default_rng(7).choice(len(sentences), n, replace=False))]


def psi(live, reference):
    live, reference = (np.maximum(np.asarray(x, dtype=float), 1e-4) for x in (live, reference))
    return float(((live - reference) * np.log(live / reference)).sum())


def send(server, model, method, texts):
    for i in range(0, len(texts), 50):
        answer = post_json(server.http_address, f"/v1/models/{model}:{method}", {"texts": texts[i:i + 50]})
        assert len(answer["results"]) == len(texts[i:i + 50])


def gauges(server, model):
    samples = metrics_of(server.metrics_address)
    out = {}
    for series, value in samples.items():
        name, _, labels = series.partition("{")
        if name.startswith("qvi_drift_") and f'model="{model}"' in labels and 'version="1"' in labels:
            key = next((p.split("=")[1].strip('"}') for p in labels.split(",") if p.split("=")[0] in
                        ("feature", "side", "what")), "")
            out[f"{name}:{key}"] = value
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = ServerProcess(STORE, str(tmp_path_factory.mktemp("drift")), "--drift-window-texts", str(WINDOW))
    yield proc
    proc.stop()


def test_the_models_own_test_split_reads_as_no_drift_and_as_computed_offline(server, tmp_path):
    rows = tsv_rows(os.path.join(DATA, "sentiment", "test.tsv"), WINDOW)
    send(server, "sentiment", "classify", [text for _, text in rows])
    g = gauges(server, "sentiment")
    assert g["qvi_drift_window:texts"] == g["qvi_drift_window:answers"] == WINDOW
    for feature in ("label", "length", "confidence"):
        assert g[f"qvi_drift_psi:{feature}"] < 0.1, (feature, g)
    # The same texts through the exporter's own measure, at the card's temperature.
    card = artifact.load(os.path.join(STORE, "sentiment", "1", "model.pt"))[1]["model_card"]["drift_reference"]
    split = tmp_path / "window.tsv"
    split.write_text("".join(f"{label}\t{text}\n" for label, text in rows))
    offline = drift.reference(os.path.join(STORE, "sentiment", "1", "model.pt"), str(split),
                              temperature=card["confidence"]["temperature"])
    assert g["qvi_drift_unknown_share:live"] == pytest.approx(offline["unknown"], abs=1e-5)
    assert g["qvi_drift_unknown_share:reference"] == pytest.approx(card["unknown"], abs=1e-9)
    assert g["qvi_drift_low_confidence_share:live"] == pytest.approx(offline["below"]["share"], abs=1e-5)
    assert g["qvi_drift_low_confidence_share:reference"] == pytest.approx(card["below"]["share"], abs=1e-9)
    labels = sorted(card["labels"])
    assert g["qvi_drift_psi:label"] == pytest.approx(
        psi([offline["labels"][k] for k in labels], [card["labels"][k] for k in labels]), abs=1e-4)


def test_another_corpus_moves_the_gauges(server):
    send(server, "sentiment", "classify", [text for _, text in tsv_rows(os.path.join(DATA, "bbc", "test.tsv"),
                                                                         WINDOW)])
    g = gauges(server, "sentiment")
    assert g["qvi_drift_window:texts"] == WINDOW  # the BBC texts alone now
    # Articles of hundreds of words against critics' one-line snippets: every text in the top length bin.
    assert g["qvi_drift_psi:length"] > 1, g
    # News is not what a film critic writes: more words the vocabulary lacks, answers less sure of themselves.
    assert g["qvi_drift_unknown_share:live"] > g["qvi_drift_unknown_share:reference"], g
    assert g["qvi_drift_psi:confidence"] > 0.25, g

    send(server, "ner", "tag", conll_sentences(os.path.join(DATA, "conll2003", "test.conll"), WINDOW))
    news = gauges(server, "ner")
    assert news["qvi_drift_psi:length"] < 0.1 and news["qvi_drift_psi:label"] < 0.1, news
    send(server, "ner", "tag", conll_sentences(os.path.join(DATA, "wnut16", "train.conll"), WINDOW))
    tweets = gauges(server, "ner")
    assert tweets["qvi_drift_unknown_share:live"] > 1.5 * tweets["qvi_drift_unknown_share:reference"]
    assert max(tweets[f"qvi_drift_psi:{f}"] for f in ("label", "length", "confidence")) > 0.25, tweets
