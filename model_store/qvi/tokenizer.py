"""The reference tokenizer. The C++ server implements the same rules and must produce the same
tokens, ids and offsets on the shared vectors in tests/data/tokenizer_vectors.json.

Rules (all positions are Unicode code points of the original text, half-open [start, end)):

1. Separators. White space (str.isspace) and control / format characters (categories Cc and Cf,
   e.g. U+200B) separate tokens and are dropped; each is a unit of its own and absorbs nothing.
2. Units. Any other code point starts a unit, which then absorbs what attaches to it: combining
   marks (categories Mn, Mc, Me — this includes the emoji variation selector U+FE0F), emoji
   skin-tone modifiers (U+1F3FB..U+1F3FF), ZERO WIDTH NON-JOINER (U+200C), and ZERO WIDTH JOINER
   (U+200D) together with the code point after it when that one is not a separator (so an emoji
   ZWJ sequence is one unit; a ZWJ before a separator or at the end is absorbed alone). Two
   consecutive regional indicators (U+1F1E6..U+1F1FF) form one unit (a flag).
3. Word level. A word is a maximal run of units whose base is a letter, mark or number (categories
   L*, M*, N*) or the connector punctuation Pc ('_'), except that an ideograph or kana (the CJK
   ranges in _is_cjk) is always a token of its own. Every other unit (punctuation, symbols, emoji)
   is a token of its own. There is no limit on a word's length; a word missing from the vocabulary
   maps to the unknown token.
4. Character level. Every unit that is not a separator is a token.
5. Normalised form (for vocabulary lookup only; offsets and Token.text stay original). With
   `lowercase`, each code point c is replaced by the first code point of c.lower() — the Unicode
   simple lowercase mapping (so 'İ' becomes 'i'), applied code point by code point with no
   context (a final 'Σ' becomes 'σ').
6. Ids. [PAD] = 0, [UNK] = 1, then the vocabulary in order. Texts longer than max_tokens keep the
   first max_tokens tokens and are reported as truncated.
7. Casing (with `casing`, for models that look words up lower-cased but still see their case). A
   token's case class comes from the cased letters of its original text — upper: categories Lu and
   Lt; lower: Ll; every other code point is ignored: 0 none (no cased letter: numbers, punctuation,
   CJK, emoji), 1 lower (lower letters only), 2 title (exactly one upper letter, and it is the first
   cased letter: "Paris", "A", "ǅemal"), 3 upper (two or more upper letters, no lower: "EU"),
   4 mixed (anything else: "iPhone", "McDonald"). The token's id is then the vocabulary id plus
   vocabulary size x case class, so one id still names one token and [PAD] stays 0.
"""
import json
import unicodedata
from dataclasses import dataclass, asdict
from typing import Dict, List, Sequence, Tuple

PAD = "[PAD]"
UNK = "[UNK]"
PAD_ID = 0
UNK_ID = 1

_ZWNJ = 0x200C
_ZWJ = 0x200D


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2EBEF or 0x30000 <= cp <= 0x323AF or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F or 0x3040 <= cp <= 0x309F or 0x30A0 <= cp <= 0x30FF
        or 0x31F0 <= cp <= 0x31FF or 0xFF66 <= cp <= 0xFF9D
    )


def _is_regional_indicator(cp: int) -> bool:
    return 0x1F1E6 <= cp <= 0x1F1FF


def _attaches(ch: str) -> bool:
    cp = ord(ch)
    return unicodedata.category(ch) in ("Mn", "Mc", "Me") or 0x1F3FB <= cp <= 0x1F3FF or cp == _ZWNJ


def _is_separator(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf")


def _is_word_char(ch: str) -> bool:
    cat = unicodedata.category(ch)
    return cat[0] in ("L", "M", "N") or cat == "Pc"


def units(text: str) -> List[Tuple[int, int]]:
    """Rules 1-2: (start, end) code-point spans of the units of `text`."""
    out: List[Tuple[int, int]] = []
    n = len(text)
    i = 0
    while i < n:
        start = i
        base = ord(text[i])
        i += 1
        if _is_separator(text[start]):
            out.append((start, i))
            continue
        if _is_regional_indicator(base) and i < n and _is_regional_indicator(ord(text[i])):
            i += 1
        while i < n:
            cp = ord(text[i])
            if _attaches(text[i]):
                i += 1
            elif cp == _ZWJ:
                i += 2 if i + 1 < n and not _is_separator(text[i + 1]) else 1
            else:
                break
        out.append((start, min(i, n)))
    return out


@dataclass(frozen=True)
class Token:
    text: str    # exactly the original text[start:end]
    start: int   # code points, inclusive
    end: int     # code points, exclusive
    norm: str    # normalised form used for the vocabulary


@dataclass(frozen=True)
class TokenizerConfig:
    level: str = "word"          # "word" or "char"
    lowercase: bool = True
    max_tokens: int = 128
    casing: bool = False         # rule 7: the case class folded into each id

    def __post_init__(self) -> None:
        if self.level not in ("word", "char"):
            raise ValueError(f"tokenizer level must be 'word' or 'char', got {self.level!r}")
        if self.max_tokens < 1:
            raise ValueError(f"tokenizer max_tokens must be >= 1, got {self.max_tokens}")


def normalise(s: str, lowercase: bool) -> str:
    """Rule 5."""
    if not lowercase:
        return s
    return "".join(c.lower()[0] for c in s)


CASE_CLASSES = 5  # rule 7: none, lower, title, upper, mixed


def case_class(text: str) -> int:
    """Rule 7."""
    upper = lower = 0
    first_upper = False
    for c in text:
        cat = unicodedata.category(c)
        if cat in ("Lu", "Lt"):
            if upper == 0 and lower == 0:
                first_upper = True
            upper += 1
        elif cat == "Ll":
            lower += 1
    if upper == 0:
        return 1 if lower else 0
    if upper == 1 and first_upper:
        return 2
    return 3 if lower == 0 else 4


def tokenize(text: str, config: TokenizerConfig) -> List[Token]:
    spans: List[Tuple[int, int]] = []
    word_start = -1
    word_end = -1
    for start, end in units(text):
        base = text[start]
        if _is_separator(base):
            kind = "sep"
        elif config.level == "char":
            kind = "single"
        elif _is_word_char(base) and not _is_cjk(ord(base)):
            kind = "word"
        else:
            kind = "single"
        if kind == "word":
            if word_start < 0:
                word_start = start
            word_end = end
            continue
        if word_start >= 0:
            spans.append((word_start, word_end))
            word_start = -1
        if kind == "single":
            spans.append((start, end))
    if word_start >= 0:
        spans.append((word_start, word_end))
    return [Token(text[s:e], s, e, normalise(text[s:e], config.lowercase)) for s, e in spans]


class Vocabulary:
    """Token strings <-> ids. Ids 0 and 1 are [PAD] and [UNK]. Stored one token per line."""

    def __init__(self, tokens: Sequence[str]):
        if list(tokens[:2]) != [PAD, UNK]:
            raise ValueError("a vocabulary starts with [PAD], [UNK]")
        self.tokens = list(tokens)
        self.index: Dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise ValueError("a vocabulary may not repeat a token")

    @classmethod
    def build(cls, counts: Dict[str, int], min_count: int = 1, max_size: int = 0) -> "Vocabulary":
        items = sorted(((c, t) for t, c in counts.items() if c >= min_count and t not in (PAD, UNK)),
                       key=lambda ct: (-ct[0], ct[1]))
        if max_size > 0:
            items = items[: max_size - 2]
        return cls([PAD, UNK] + [t for _, t in items])

    def __len__(self) -> int:
        return len(self.tokens)

    def id(self, norm: str) -> int:
        return self.index.get(norm, UNK_ID)

    def to_text(self) -> str:
        for t in self.tokens:
            if "\n" in t or "\r" in t:
                raise ValueError(f"vocabulary token {t!r} holds a line break")
        return "\n".join(self.tokens) + "\n"

    @classmethod
    def from_text(cls, text: str) -> "Vocabulary":
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return cls(lines)


@dataclass
class Encoding:
    ids: List[int]
    tokens: List[Token]
    truncated: bool


def encode(text: str, config: TokenizerConfig, vocab: Vocabulary) -> Encoding:
    toks = tokenize(text, config)
    truncated = len(toks) > config.max_tokens
    toks = toks[: config.max_tokens]
    if config.casing:
        return Encoding([vocab.id(t.norm) + len(vocab) * case_class(t.text) for t in toks], toks, truncated)
    return Encoding([vocab.id(t.norm) for t in toks], toks, truncated)


def config_to_json(config: TokenizerConfig) -> Dict[str, object]:
    d: Dict[str, object] = dict(asdict(config))
    d.update({"pad_token": PAD, "unk_token": UNK, "pad_id": PAD_ID, "unk_id": UNK_ID})
    return d


def config_from_json(d: Dict[str, object]) -> TokenizerConfig:
    return TokenizerConfig(level=str(d["level"]), lowercase=bool(d["lowercase"]), max_tokens=int(d["max_tokens"]),  # type: ignore[arg-type]
                           casing=bool(d.get("casing", False)))


if __name__ == "__main__":  # pragma: no cover - a quick look at a text's tokens
    import sys
    cfg = TokenizerConfig(level=sys.argv[2] if len(sys.argv) > 2 else "word")
    print(json.dumps([asdict(t) for t in tokenize(sys.argv[1], cfg)], ensure_ascii=False, indent=1))
