"""Corpus formats and batching.

Classification: UTF-8 lines `label<TAB>text`; blank lines and lines starting with '#' are skipped.
Tagging: CoNLL-style columns, one token per line, the tag (BIO or BIOES) in the last column,
whitespace-separated, sentences separated by blank lines, `-DOCSTART-` lines skipped. A sentence's
text is its tokens joined by `join` (a space by default; "" for character-level corpora such as
Chinese), and its entities become code-point spans of that text. The model's own tokenizer then
re-tokenises the text and the spans are re-encoded as tags over its tokens, so a corpus need not be
tokenised the way the model tokenises.
"""
import random
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import torch

from qvi.metrics import chunks
from qvi.tokenizer import Token, TokenizerConfig, Vocabulary, encode, tokenize


@dataclass
class Example:
    text: str
    label: str = ""                                   # classification
    spans: Tuple[Tuple[int, int, str], ...] = ()      # tagging: (start, end, type) code points


def read_classification(path: str) -> List[Example]:
    out: List[Example] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            if "\t" not in line:
                raise ValueError(f"{path}:{n}: expected 'label<TAB>text'")
            label, text = line.split("\t", 1)
            out.append(Example(text=text, label=label))
    return out


def read_conll(path: str, join: str = " ") -> List[Example]:
    out: List[Example] = []
    words: List[str] = []
    tags: List[str] = []

    def flush() -> None:
        if not words:
            return
        starts, pos = [], 0
        for w in words:
            starts.append(pos)
            pos += len(w) + len(join)
        spans = tuple(sorted((starts[s], starts[e - 1] + len(words[e - 1]), t) for s, e, t in chunks(tags)))
        out.append(Example(text=join.join(words), spans=spans))
        words.clear()
        tags.clear()

    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                flush()
                continue
            if cols[0] == "-DOCSTART-":
                continue
            if len(cols) < 2:
                raise ValueError(f"{path}:{n}: expected 'token ... tag'")
            words.append(cols[0])
            tags.append(cols[-1])
    flush()
    return out


def spans_to_tags(tokens: Sequence[Token], spans: Sequence[Tuple[int, int, str]], scheme: str) -> List[str]:
    """Tags over `tokens` for entity spans given in code points; a token that overlaps a span
    belongs to it."""
    tags = ["O"] * len(tokens)
    for start, end, kind in spans:
        inside = [i for i, t in enumerate(tokens) if t.start < end and t.end > start]
        for j, i in enumerate(inside):
            if scheme == "BIOES" and len(inside) == 1:
                tags[i] = f"S-{kind}"
            elif j == 0:
                tags[i] = f"B-{kind}"
            elif scheme == "BIOES" and j == len(inside) - 1:
                tags[i] = f"E-{kind}"
            else:
                tags[i] = f"I-{kind}"
    return tags


def tag_set(entity_types: Sequence[str], scheme: str) -> List[str]:
    prefixes = "BI" if scheme == "BIO" else "BIES"
    return ["O"] + [f"{p}-{t}" for t in sorted(entity_types) for p in prefixes]


def build_vocab(examples: Sequence[Example], config: TokenizerConfig, min_count: int, max_size: int,
                extra: Callable[[Sequence[str], int], List[str]] = lambda have, size: []) -> Vocabulary:
    """The training data's tokens (most frequent first), then what `extra(tokens so far, max_size)`
    adds (pretrained vector words: qvi.vectors.extra_words)."""
    counts: Dict[str, int] = {}
    for ex in examples:
        for tok in tokenize(ex.text, config):
            counts[tok.norm] = counts.get(tok.norm, 0) + 1
    vocab = Vocabulary.build(counts, min_count=min_count, max_size=max_size)
    more = extra(vocab.tokens, max_size)
    return Vocabulary(vocab.tokens + more) if more else vocab


@dataclass
class Encoded:
    ids: List[int]
    target: List[int]   # [label] for classification, tag ids for tagging


def encode_examples(examples: Sequence[Example], config: TokenizerConfig, vocab: Vocabulary,
                    labels: Sequence[str], scheme: str = "", tagging: bool = False) -> List[Encoded]:
    index = {name: i for i, name in enumerate(labels)}
    out: List[Encoded] = []
    for ex in examples:
        enc = encode(ex.text, config, vocab)
        if tagging:
            target = [index[t] for t in spans_to_tags(enc.tokens, ex.spans, scheme)]
        else:
            target = [index[ex.label]]
        out.append(Encoded(enc.ids, target))
    return out


def batches(data: Sequence[Encoded], batch_size: int, tagging: bool, shuffle: bool = False,
            seed: int = 0) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Yields (token_ids [B,T], mask [B,T], targets): labels [B] for classification, tag ids
    [B,T] padded with -1 for tagging. Shuffling is seeded."""
    order = list(range(len(data)))
    if shuffle:
        random.Random(seed).shuffle(order)
    for i in range(0, len(order), batch_size):
        chunk = [data[j] for j in order[i:i + batch_size]]
        t = max(1, max(len(e.ids) for e in chunk))
        ids = torch.zeros(len(chunk), t, dtype=torch.long)
        mask = torch.zeros(len(chunk), t, dtype=torch.bool)
        targets = torch.full((len(chunk), t), -1, dtype=torch.long) if tagging else \
            torch.tensor([e.target[0] for e in chunk], dtype=torch.long)
        for r, e in enumerate(chunk):
            n = len(e.ids)
            ids[r, :n] = torch.tensor(e.ids, dtype=torch.long)
            mask[r, :n] = True
            if tagging:
                targets[r, :n] = torch.tensor(e.target, dtype=torch.long)
        yield ids, mask, targets
