"""The reference tokenizer against the shared vectors, plus the invariants every text must keep."""
import json
import random
import unicodedata

import pytest

from conftest import VECTORS
from qvi import tokenizer_vectors
from qvi.tokenizer import PAD, UNK, TokenizerConfig, Vocabulary, case_class, encode, tokenize

with open(VECTORS, encoding="utf-8") as _f:
    DATA = json.load(_f)


def test_vectors_file_is_current():
    """The committed vectors are exactly what the reference tokenizer produces."""
    with open(VECTORS, encoding="utf-8") as f:
        assert f.read() == tokenizer_vectors.render()


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_matches_shared_vectors(case):
    cfg = TokenizerConfig(**case["config"])
    enc = encode(case["text"], cfg, Vocabulary(DATA["vocab"]))
    assert [[t.text, t.start, t.end, t.norm] for t in enc.tokens] == case["tokens"]
    assert enc.ids == case["ids"]
    assert enc.truncated == case["truncated"]
    assert [case_class(t.text) for t in enc.tokens] == case["case_classes"]


def test_case_classes_by_hand():
    """Rule 7, written out: none, lower, title, upper, mixed."""
    expected = {"3.14": 0, "!": 0, "北京": 0, "": 0, "said": 1, "x2": 1, "The": 2, "A": 2, "X2": 2, "ǅemal": 2,
                "Émile": 2, "EU": 3, "ΟΔΟΣ": 3, "NATO2": 3, "iPhone": 4, "McDonald": 4, "aB": 4, "ǅA": 3}
    assert {text: case_class(text) for text in expected} == expected
    vocab = Vocabulary([PAD, UNK, "paris"])
    cased = TokenizerConfig(casing=True)
    # The id folds the class in: vocabulary id + vocabulary size x class; [UNK] keeps its class too.
    assert encode("Paris paris PARIS Lyon", cased, vocab).ids == [2 + 3 * 2, 2 + 3 * 1, 2 + 3 * 3, 1 + 3 * 2]
    assert encode("Paris paris", TokenizerConfig(), vocab).ids == [2, 2]


def test_handwritten_expectations():
    word = TokenizerConfig()
    assert [t.text for t in tokenize("Hello, world!", word)] == ["Hello", ",", "world", "!"]
    fam = "👨\u200d👩\u200d👧"
    toks = tokenize(f"a {fam} b", word)
    assert [(t.text, t.start, t.end) for t in toks] == [("a", 0, 1), (fam, 2, 7), ("b", 8, 9)]
    assert [t.text for t in tokenize("北京abc", word)] == ["北", "京", "abc"]
    assert [t.norm for t in tokenize("İ ΟΔΟΣ", word)] == ["i", "οδοσ"]
    assert [t.text for t in tokenize("x\u200by", word)] == ["x", "y"]


ALPHABET = ["a", "Z", "é", "e\u0301", " ", "\t", "\n", "\u00a0", ".", "!", "北", "タ", "😀", "👍🏽", "\u200d",
            "🇫🇷", "_", "7", "\u200b", "'", "Σ", "İ"]


@pytest.mark.parametrize("level", ["word", "char"])
def test_offsets_slice_the_original_text(level):
    rng = random.Random(3)
    cfg = TokenizerConfig(level=level, lowercase=True)
    for _ in range(300):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 25)))
        toks = tokenize(text, cfg)
        last = 0
        for t in toks:
            assert t.text == text[t.start:t.end] and t.start < t.end and t.start >= last
            assert not t.text[0].isspace()
            last = t.end
        covered = set(i for t in toks for i in range(t.start, t.end))
        for i, ch in enumerate(text):
            if i not in covered:  # what no token covers is a separator
                assert ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")


def test_vocabulary_round_trip_and_errors():
    v = Vocabulary.build({"b": 2, "a": 2, "c": 5, "rare": 1}, min_count=2)
    assert v.tokens == [PAD, UNK, "c", "a", "b"]
    assert Vocabulary.from_text(v.to_text()).tokens == v.tokens
    assert v.id("zzz") == 1
    with pytest.raises(ValueError):
        Vocabulary(["x", UNK])
    with pytest.raises(ValueError):
        Vocabulary([PAD, UNK, "a", "a"])
    with pytest.raises(ValueError):
        TokenizerConfig(level="byte")
    with pytest.raises(ValueError):
        TokenizerConfig(max_tokens=0)
