"""How `qvi finetune` reads a tagging corpus through a pretrained tokenizer (qvi.finetune.SubwordData): each word's
span and first sub-word, and the sub-words' training tags -- for a SentencePiece (Metaspace) tokenizer too, whose
pieces' offsets take in the space before them."""
from tokenizers import Tokenizer, models, pre_tokenizers

from qvi.data import Example, tag_set
from qvi.finetune import SubwordData

LABELS = tag_set(["LOC", "ORG", "PER"], "BIO")


def metaspace_tokenizer(path):
    """A small Unigram tokenizer with XLM-R's pre-tokenizer: "▁" joins the word after it where the vocabulary has
    the pair, and stands alone before "(" (which it does not have joined)."""
    vocab = [("<unk>", 0.0), ("▁", -2.0), ("▁EU", -1.0), ("▁German", -1.0), ("▁visits", -1.0), ("(", -1.0),
             ("Bonn", -1.0), (")", -1.0), ("▁Ang", -1.0), ("ela", -1.0)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.save(str(path))
    return str(path)


def test_words_are_spanned_without_the_space_a_piece_carries_and_a_lone_space_piece_takes_its_words_tag(tmp_path):
    text = "EU German visits (Bonn) Angela"
    spans = [(0, 2, "ORG"), (17, 23, "LOC"), (24, 30, "PER")]  # "EU", "(Bonn)", "Angela"
    assert [text[s:e] for s, e, _ in spans] == ["EU", "(Bonn)", "Angela"]
    data = SubwordData(metaspace_tokenizer(tmp_path / "tokenizer.json"), [Example(text, spans=spans)], LABELS,
                       tagging=True, max_tokens=64)
    enc = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text)
    assert enc.tokens == ["▁EU", "▁German", "▁visits", "▁", "(", "Bonn", ")", "▁Ang", "ela"]
    assert enc.offsets[1] == (2, 9), "the piece takes in the space before it"
    # every word's span is the word alone, as the corpus' spans and the server's answers are
    assert [text[s:e] for _, s, e in data.words[0]] == ["EU", "German", "visits", "(Bonn)", "Angela"]
    assert [first for first, _, _ in data.words[0]] == [0, 1, 2, 3, 7]
    tags = [LABELS[t] for t in data.items[0].target]
    # "▁" alone is "(Bonn)"'s first sub-word, the one the server reads: B-LOC, not O
    assert tags == ["B-ORG", "O", "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC", "B-PER", "I-PER"]
