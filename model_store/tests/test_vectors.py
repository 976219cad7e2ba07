"""Pretrained vectors (qvi.vectors) and the case feature (tokenizer rule 7) in training: the
vocabulary takes vector words the training data lacks, the embedding starts from the vectors, a
mismatched dimension is refused by name, and a cased model's ids split back into word and case."""
import numpy as np
import pytest
import torch

from qvi import artifact, vectors
from qvi.cli import evaluate_artifact, load_checkpoint, main
from qvi.models import ARCHITECTURES, BASELINES, ModelConfig, TokenEmbedding, build_model, token_embedding
from qvi.tokenizer import PAD, UNK

from test_artifact import write_corpora

WORDS = ["the", "film", "great", "awful", "paris", "unseenword", "zebra"]


def write_vectors(folder, dim=16, words=WORDS):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "words.txt").write_text("".join(w + "\n" for w in words), encoding="utf-8")
    matrix = np.arange(len(words) * dim, dtype=np.float32).reshape(len(words), dim) / 100
    np.save(folder / "vectors.npy", matrix)
    return matrix


def test_vocabulary_takes_vector_words_up_to_the_cap_and_rows_start_from_them(tmp_path):
    matrix = write_vectors(tmp_path / "v")
    v = vectors.load(str(tmp_path / "v"))
    assert vectors.extra_words(v, [PAD, UNK, "the", "film"], 6) == ["great", "awful"]
    assert vectors.extra_words(v, [PAD, UNK, "the"], 0) == ["film", "great", "awful", "paris", "unseenword", "zebra"]
    rows, found = vectors.embedding_init(v, [PAD, UNK, "film", "Paris", "nothing"], seed=1)
    assert found == 2
    assert torch.equal(rows[0], torch.zeros(16))
    assert torch.equal(rows[2], torch.from_numpy(matrix[1])) and torch.equal(rows[3], torch.from_numpy(matrix[4]))
    assert not torch.equal(rows[4], torch.zeros(16))  # random, with the vectors' spread


def test_bad_vectors_are_refused_by_name(tmp_path):
    with pytest.raises(SystemExit, match=r"vectors '.*nowhere': .*words\.txt is missing"):
        vectors.load(str(tmp_path / "nowhere"))
    write_vectors(tmp_path / "v", words=WORDS)
    (tmp_path / "v" / "words.txt").write_text("only\ntwo\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"\(7, 16\) float32 for 2 words"):
        vectors.load(str(tmp_path / "v"))
    write_vectors(tmp_path / "w")
    with pytest.raises(SystemExit, match=r"are 16-d, but the model's --emb-dim is 32: give --emb-dim 16"):
        vectors.check_dim(vectors.load(str(tmp_path / "w")), 32)


def test_cased_ids_split_into_word_and_case():
    config = ModelConfig("cnn_att", vocab_size=10, num_outputs=2, emb_dim=4, hidden=4, case_dim=3)
    emb = TokenEmbedding(config)
    ids = torch.tensor([[0, 5, 5 + 10 * 2, 1 + 10 * 4]])
    out = emb(ids)
    assert out.shape == (1, 4, 7)
    assert torch.equal(out[0, 0], torch.zeros(7))  # [PAD]: no word, no case
    assert torch.equal(out[0, 1, :4], emb.weight[5]) and torch.equal(out[0, 2, :4], emb.weight[5])
    assert torch.equal(out[0, 1, 4:], emb.cases.weight[1]) and torch.equal(out[0, 2, 4:], emb.cases.weight[3])
    assert torch.equal(out[0, 3, 4:], emb.cases.weight[5])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_architecture_scripts_with_casing(arch):
    config = ModelConfig(arch, vocab_size=10, num_outputs=3, g="none" if arch in BASELINES else "qvi", emb_dim=4,
                         hidden=8, heads=2, ffn=8, case_dim=2, boundary_ids=[3])
    model = build_model(config).eval()
    scripted = torch.jit.script(model)
    ids = torch.tensor([[2, 13, 47, 3, 0]])
    mask = ids != 0
    for k, v in model(ids, mask).items():
        assert torch.allclose(v, scripted(ids, mask)[k], atol=1e-6), k
    assert token_embedding(model).cases is not None


def test_training_with_vectors_and_casing_exports_and_scores_the_same(tmp_path, capsys):
    write_corpora(tmp_path)
    write_vectors(tmp_path / "v")
    ckpt = tmp_path / "m.ckpt"
    main(["train", "--task", "tagging", "--arch", "cnn_transformer_crf", "--epochs", "3", "--quiet", "--threads", "1",
          "--emb-dim", "16", "--hidden", "16", "--heads", "2", "--ffn", "16", "--casing", "--case-dim", "4",
          "--vectors", str(tmp_path / "v"), "--train", str(tmp_path / "train.conll"),
          "--dev", str(tmp_path / "dev.conll"), "--test", str(tmp_path / "test.conll"), "--out", str(ckpt)])
    model, c = load_checkpoint(str(ckpt))
    assert c["tokenizer"]["casing"] is True and c["config"]["case_dim"] == 4
    # Words the toy corpus never has, from the vectors; the training words come first.
    assert c["vocab"][-3:] == ["paris", "unseenword", "zebra"] and "great" not in c["vocab"][:4]
    assert c["data"]["vectors"] == {"name": str(tmp_path / "v"), "dim": 16, "words_with_vectors": 7}
    capsys.readouterr()
    main(["export", "--checkpoint", str(ckpt), "--store", str(tmp_path / "store"), "--name", "m", "--version", "1",
          "--format", "torchscript"])
    path = capsys.readouterr().out.strip()
    assert artifact.load(path)[1]["tokenizer"]["casing"] is True
    assert evaluate_artifact(path, str(tmp_path / "test.conll"), " ") == c["metrics"]["test"]
