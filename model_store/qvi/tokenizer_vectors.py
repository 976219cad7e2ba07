"""Writes tests/data/tokenizer_vectors.json: the cases the Python and C++ tokenizers must agree on.

    python -m qvi.tokenizer_vectors --write ../tests/data/tokenizer_vectors.json

Each case: a text, the tokenizer settings, and the expected tokens (text, start, end, norm — offsets
in code points), ids over the file's small vocabulary, and whether max_tokens truncated the text.
The file is the contract; tests/test_tokenizer.py checks the Python tokenizer against it and the
C++ tests read the same file. Regenerate it only when the rules in qvi/tokenizer.py change on purpose.
"""
import argparse
import json
import sys
import unicodedata
from typing import Dict, List

from qvi.tokenizer import PAD, UNK, TokenizerConfig, Vocabulary, case_class, encode

VOCAB = [PAD, UNK, "hello", ",", "world", "!", "the", "quick", "北", "京", "café", ".", "istanbul", "οδοσ",
         "👨\u200d👩\u200d👧\u200d👦", "🇯🇵", "'", "t", "don", "_", "snake_case_name", "3", "14", "?"]

CASES: List[Dict[str, object]] = [
    {"name": "empty", "text": ""},
    {"name": "whitespace only", "text": " \t\n\u00a0\u2003\r\n "},
    {"name": "basic punctuation", "text": "Hello, world!"},
    {"name": "lowercasing", "text": "The QUICK brown fox."},
    {"name": "no lowercasing", "text": "The QUICK brown fox.", "lowercase": False},
    {"name": "cjk ideographs", "text": "北京欢迎你！"},
    {"name": "cjk mixed with latin", "text": "我爱NLP和机器学习2026年"},
    {"name": "japanese kana", "text": "東京タワーへ行きました"},
    {"name": "hangul words", "text": "안녕하세요 세계"},
    {"name": "precomposed accents", "text": "Café naïve résumé Ångström"},
    {"name": "combining marks", "text": "cafe\u0301 nai\u0308ve"},
    {"name": "emoji and variation selector", "text": "I ❤️ NLP 😀😀!"},
    {"name": "emoji zwj family", "text": "👨\u200d👩\u200d👧\u200d👦 family"},
    {"name": "emoji skin tone", "text": "👍🏽ok 👋🏿"},
    {"name": "flags", "text": "🇯🇵🇺🇸 and 🇫🇷"},
    {"name": "punctuation runs", "text": "Wait... what?!?! --- (yes)"},
    {"name": "url", "text": "see https://example.com/path?q=1&x=y#frag now"},
    {"name": "email and handle", "text": "mail bob@example.org or @bob_99 #nlp"},
    {"name": "numbers", "text": "3.14 1,000,000 -42 2026-11-21 50% ½ ²"},
    {"name": "long word", "text": "x" * 300 + " Pneumonoultramicroscopicsilicovolcanoconiosis"},
    {"name": "tabs newlines nbsp", "text": "one\ttwo\nthree\u00a0four\u2003five\r\nsix\u3000七"},
    {"name": "zero width and controls", "text": "zero\u200bwidth a\u0000b c\u0007d soft\u00adhyphen"},
    {"name": "special lowercase", "text": "İstanbul ΟΔΟΣ STRAẞE ǅemal"},
    {"name": "apostrophes", "text": "don't rock'n'roll O’Brien"},
    {"name": "connector punctuation", "text": "snake_case_name __init__"},
    {"name": "truncation", "text": "the quick brown fox jumps", "max_tokens": 3},
    {"name": "char level", "text": "Hi 北京! 👨\u200d👩\u200d👧", "level": "char"},
    {"name": "char level marks", "text": "e\u0301a 3.14", "level": "char"},
    {"name": "char level truncation", "text": "abcdef", "level": "char", "max_tokens": 4},
    {"name": "astral letters", "text": "𝒜𝒷𝒸 𐐀𐐨"},
    {"name": "lone combining mark", "text": "\u0301abc \u0301"},
    {"name": "trailing zwj", "text": "a\u200d"},
    {"name": "zwj before separator", "text": "a\u200d b \u200d. c\u200d\u200d😀"},
    {"name": "casing", "text": "The EU said iPhone McDonald A i 3.14 ǅemal ΟΔΟΣ İstanbul 北京 O'Neil x2 X2 É", "casing": True},
    {"name": "casing without lowercasing", "text": "The QUICK Fox", "lowercase": False, "casing": True},
    {"name": "casing at char level", "text": "Ab1", "level": "char", "casing": True},
]


def build() -> Dict[str, object]:
    vocab = Vocabulary(VOCAB)
    cases = []
    for case in CASES:
        cfg = TokenizerConfig(level=str(case.get("level", "word")), lowercase=bool(case.get("lowercase", True)),
                              max_tokens=int(case.get("max_tokens", 128)),  # type: ignore[arg-type]
                              casing=bool(case.get("casing", False)))
        text = str(case["text"])
        enc = encode(text, cfg, vocab)
        cases.append({
            "name": case["name"], "text": text,
            "config": {"level": cfg.level, "lowercase": cfg.lowercase, "max_tokens": cfg.max_tokens,
                       "casing": cfg.casing},
            "tokens": [[t.text, t.start, t.end, t.norm] for t in enc.tokens],
            "case_classes": [case_class(t.text) for t in enc.tokens],
            "ids": enc.ids, "truncated": enc.truncated,
        })
    return {"unicode_version": unicodedata.unidata_version, "vocab": VOCAB, "cases": cases,
            "about": "token = [text, start, end, norm]; offsets count code points, half-open; case_classes: "
                     "rule 7 of each token, whether or not the case's config folds it into the ids; "
                     "written by python -m qvi.tokenizer_vectors"}


def render() -> str:
    return json.dumps(build(), ensure_ascii=False, indent=1) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", help="file to write (default: standard output)")
    args = ap.parse_args()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(render())
    else:
        sys.stdout.write(render())
