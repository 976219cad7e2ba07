"""A corpus split as a sub-word model reads it: its tokenizer.json's ids (the `tokenizers` package, at training and
measuring time only; the server has its own reader), its targets, and for taggers each word's first sub-word and
characters; and the batches of similar lengths it is read in. Shared by fine-tuning (qvi.finetune) and calibration
(qvi.calibration)."""
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from qvi.data import Encoded, Example, spans_to_tags


class SubwordData:
    """A corpus split encoded with a tokenizer.json (`tokenizer`: its path, or with `tokenizer_text` its text):
    ids, targets (a tagger's in BIO over the sub-words; `targets` False: none, as calibration reads only the
    gold spans), and for taggers each word's first sub-word and characters."""

    def __init__(self, tokenizer: str, examples: Sequence[Example], labels: Sequence[str], tagging: bool,
                 max_tokens: int, tokenizer_text: bool = False, targets: bool = True):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_str(tokenizer) if tokenizer_text else Tokenizer.from_file(tokenizer)  # text, or its path
        tok.no_padding()
        tok.enable_truncation(max_tokens)
        index = {name: i for i, name in enumerate(labels)}
        self.examples = list(examples)
        self.items: List[Encoded] = []
        self.words: List[List[Tuple[int, int, int]]] = []  # per text: (first sub-word, start, end) of each word
        for ex, enc in zip(self.examples, tok.encode_batch([e.text for e in self.examples])):
            if tagging:
                words = _words(ex.text, enc.word_ids, enc.offsets)
                # A piece of whitespace alone (SentencePiece's "▁" before a word it does not join, as in "▁" "(")
                # is its word's first sub-word, the one the server reads: it takes its word's span, so its tag.
                ids = sorted({w for w in enc.word_ids if w is not None})  # _words' order
                word_spans = {w: (s, e) for w, (_, s, e) in zip(ids, words)}
                pieces = [_Span(*word_spans[w]) if w is not None and not ex.text[s:e].strip() else _Span(s, e)
                          for w, (s, e) in zip(enc.word_ids, enc.offsets)]
                target = [index[t] for t in spans_to_tags(pieces, ex.spans, "BIO")] if targets else []
                self.words.append(words)
            else:
                target = [index[ex.label]]
            self.items.append(Encoded(list(enc.ids), target))


@dataclass
class _Span:
    start: int
    end: int


def _words(text: str, word_ids: Sequence[Optional[int]],
           offsets: Sequence[Tuple[int, int]]) -> List[Tuple[int, int, int]]:
    """Each word's (first sub-word, start, end), its span without the whitespace a piece may carry: a SentencePiece
    (Metaspace) piece's offsets take in the space before it ("▁German" spans " German"), the word does not."""
    words: Dict[int, Tuple[int, int, int]] = {}
    for i, (w, (s, e)) in enumerate(zip(word_ids, offsets)):
        if w is None:
            continue
        first, start, end = words.get(w, (i, s, e))
        words[w] = (first, min(start, s), max(end, e))
    out = []
    for w in sorted(words):
        first, start, end = words[w]
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        out.append((first, start, end))
    return out


def batches(data: Sequence[Encoded], size: int, tagging: bool, seed: int,
             shuffle: bool) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]]:
    """Batches of similar lengths (little padding): shuffled, sorted by length within 50 batches, the batches
    shuffled. (ids, mask, targets, the rows' indices)."""
    order = list(range(len(data)))
    rng = random.Random(seed)
    if shuffle:
        rng.shuffle(order)
    span = size * 50
    order = [i for k in range(0, len(order), span) for i in sorted(order[k:k + span], key=lambda j: len(data[j].ids))]
    groups = [order[k:k + size] for k in range(0, len(order), size)]
    if shuffle:
        rng.shuffle(groups)
    out = []
    for rows in groups:
        t = max(len(data[r].ids) for r in rows)
        ids = torch.zeros(len(rows), t, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.bool)
        targets = torch.zeros(len(rows), t, dtype=torch.long) if tagging else \
            torch.tensor([data[r].target[0] for r in rows], dtype=torch.long)
        for k, r in enumerate(rows):
            n = len(data[r].ids)
            ids[k, :n] = torch.tensor(data[r].ids)
            mask[k, :n] = True
            if tagging and data[r].target:
                targets[k, :n] = torch.tensor(data[r].target)
        out.append((ids, mask, targets, rows))
    return out
