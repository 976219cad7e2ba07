"""The drift reference a card records (qvi/drift.py): decile bins as the server reads them, the shares of a
hand-made split counted by hand, and the demo models' cards."""
import os

import numpy as np
import pytest

from qvi import artifact, calibration, drift
from qvi.models import ModelConfig, build_model
from qvi.tokenizer import TokenizerConfig, Vocabulary

from conftest import REPO


def test_a_value_falls_in_the_bin_of_the_edges_at_or_below_it():
    edges = drift.quantile_edges(list(range(1, 101)))
    assert len(edges) == 9 and edges[0] == pytest.approx(10.9)
    b = drift.binned([1, 10.9, 11, 100, 200], edges)
    # 1 is below every edge, 10.9 is on the first (so past it), 100 and 200 past the last
    assert b["shares"] == [0.2, 0.4, 0, 0, 0, 0, 0, 0, 0, 0.4]
    # ties merge edges: a split of two lengths has four bins (3, 5 between them, 7), not ten
    assert drift.quantile_edges([3] * 50 + [7] * 50) == [3, 5, 7]


def test_the_reference_of_a_classifier_counts_its_answers_words_and_unknown_tokens(tmp_path):
    cfg = ModelConfig("cnn_att", 12, 2, g="qvi", emb_dim=8, hidden=8, max_tokens=6)
    model = build_model(cfg).eval()
    vocab = Vocabulary(["[PAD]", "[UNK]", "good", "bad"] + [f"w{i}" for i in range(8)])
    manifest = artifact.build_manifest("m", cfg, TokenizerConfig(max_tokens=6), vocab, ["neg", "pos"], "",
                                       {"description": "toy", "calibration": {"temperature": 2.0}})
    path = artifact.export(model, manifest, vocab, str(tmp_path), 1)
    rng = np.random.default_rng(5)
    texts = []
    with open(tmp_path / "test.tsv", "w") as f:
        for i in range(40):
            words = ["good" if i % 2 else "bad"] + [f"w{rng.integers(8)}" for _ in range(i % 5)] + ["zzz"] * (i % 3)
            texts.append(words)
            f.write(f"{'pos' if i % 2 else 'neg'}\t{' '.join(words)}\n")
    ref = drift.reference(path, str(tmp_path / "test.tsv"))
    read = [w[:6] for w in texts]  # max_tokens: the tokens the model reads
    assert ref["texts"] == ref["answers"] == 40 and ref["split"] == "test.tsv"
    assert ref["unknown"] == pytest.approx(sum(w.count("zzz") for w in read) / sum(map(len, read)), abs=1e-6)
    lengths = [len(w) for w in read]
    assert ref["length"] == drift.binned(lengths, drift.quantile_edges(lengths))
    # the answers at the card's temperature, as the server scores them
    logits, _ = calibration.classifier_logits(*artifact.load(path), str(tmp_path / "test.tsv"))
    probs = calibration.softmax(logits, 2.0)
    top = probs.argmax(1)
    assert ref["labels"] == {"neg": pytest.approx((top == 0).mean(), abs=1e-6),
                             "pos": pytest.approx((top == 1).mean(), abs=1e-6)}
    assert ref["confidence"]["temperature"] == 2.0
    assert ref["below"] == {"threshold": drift.BELOW, "share": pytest.approx((probs.max(1) < drift.BELOW).mean(),
                                                                               abs=1e-6)}
    assert sum(ref["confidence"]["shares"]) == pytest.approx(1, abs=1e-5)


DEMO = os.path.join(REPO, "model_store", "store")


@pytest.mark.parametrize("name", ["sentiment", "ner", "topics"])
def test_every_demo_card_carries_its_drift_reference(name):
    card = artifact.load(os.path.join(DEMO, name, "1", "model.pt"))[1]["model_card"]
    ref = card["drift_reference"]
    assert ref["split"].endswith("test." + ("conll" if name == "ner" else "tsv"))
    assert ref["confidence"]["temperature"] == pytest.approx(card["calibration"]["temperature"], abs=1e-6)
    assert sum(ref["labels"].values()) == pytest.approx(1, abs=1e-4) and 0 < ref["unknown"] < 0.2
    assert len(ref["length"]["shares"]) == len(ref["length"]["edges"]) + 1
