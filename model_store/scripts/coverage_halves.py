"""Is a conformal shortfall the method's or the splits'? For a classifier artifact (the zoo's or a sub-word one):
the coverage of thresholds fitted on the dev split and measured on the test split (what the card shows), against
thresholds fitted on a random half of the test split and measured on the other half (200 seeded draws). Halves of one
split are exchangeable, so there the coverage is the level asked for on average; a dev-fitted threshold that covers
less says the dev split is not drawn like the test split for this model.

    cd model_store && ../.venv/bin/python scripts/coverage_halves.py --artifact M --dev D --test T
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from qvi import artifact, calibration  # noqa: E402


def probabilities(path: str, dev: str, test: str):
    extra = {artifact.MANIFEST: "", artifact.TOKENIZER: ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra).eval()
    manifest = json.loads(extra[artifact.MANIFEST])
    t = manifest.get("model_card", {}).get("calibration", {}).get("temperature", 1.0)
    if manifest.get("tokenizer", {}).get("level") == "subword":
        text = extra[artifact.TOKENIZER]
        text = text if isinstance(text, str) else text.decode()
        limit = int(manifest["tokenizer"]["max_tokens"])
        out = [calibration.subword_logits(module.forward_without_maps,
                                          calibration.subword_split(text, p, "classification", manifest["labels"],
                                                                    limit)) for p in (dev, test)]
    else:
        module, manifest, vocab = artifact.load(path)
        out = [calibration.classifier_logits(module, manifest, vocab, p) for p in (dev, test)]
    return [(calibration.softmax(logits, t), labels) for logits, labels in out]


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--artifact", required=True)
    a.add_argument("--dev", required=True)
    a.add_argument("--test", required=True)
    a.add_argument("--draws", type=int, default=200)
    args = a.parse_args()
    torch.set_num_threads(1)
    (pd, yd), (pt, yt) = probabilities(args.artifact, args.dev, args.test)
    print(f"accuracy: dev {(pd.argmax(1) == yd).mean():.4f}, test {(pt.argmax(1) == yt).mean():.4f}")
    rng = np.random.default_rng(0)
    for level in calibration.LEVELS:
        q = calibration.min_probability(pd[np.arange(len(yd)), yd], level)
        dev_fitted = (pt >= q)[np.arange(len(yt)), yt].mean()
        halves = []
        for _ in range(args.draws):
            order = rng.permutation(len(yt))
            fit, held = order[: len(yt) // 2], order[len(yt) // 2:]
            qh = calibration.min_probability(pt[fit, yt[fit]], level)
            halves.append((pt[held] >= qh)[np.arange(len(held)), yt[held]].mean())
        print(f"coverage {level}: dev-fitted on test {dev_fitted:.4f}; test halves {np.mean(halves):.4f} "
              f"(sd {np.std(halves):.4f} over {args.draws} draws)")


if __name__ == "__main__":
    main()
