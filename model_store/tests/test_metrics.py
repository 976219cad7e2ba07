"""Metrics on hand-computed cases, including ill-formed tag sequences read as conlleval reads them."""
import pytest

from qvi.metrics import accuracy, chunks, entity_prf, macro_f1


def test_accuracy_and_macro_f1():
    gold = [0, 0, 1, 1, 2]
    pred = [0, 1, 1, 1, 0]
    assert accuracy(gold, pred) == pytest.approx(0.6)
    # class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: tp0 fn1 -> 0
    assert macro_f1(gold, pred, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)


@pytest.mark.parametrize("tags,expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], {(0, 2, "PER"), (3, 4, "LOC")}),
    (["I-PER", "I-PER", "O"], {(0, 2, "PER")}),                   # I- after O starts a chunk
    (["B-PER", "I-LOC", "I-LOC"], {(0, 1, "PER"), (1, 3, "LOC")}),  # type change starts a chunk
    (["B-PER", "B-PER"], {(0, 1, "PER"), (1, 2, "PER")}),
    (["O", "I-ORG"], {(1, 2, "ORG")}),
    (["S-PER", "B-LOC", "I-LOC", "E-LOC", "S-ORG"], {(0, 1, "PER"), (1, 4, "LOC"), (4, 5, "ORG")}),
    (["E-LOC", "E-LOC"], {(0, 1, "LOC"), (1, 2, "LOC")}),
    (["O", "O"], set()),
])
def test_chunks(tags, expected):
    assert chunks(tags) == expected


def test_entity_prf():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-LOC"]]
    s = entity_prf(gold, pred)
    assert s["precision"] == pytest.approx(1 / 2)
    assert s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    assert entity_prf([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
