"""How close the server's occlusion for the demo tagger is to the offline leave-one-out, with the
reference's CRF forward-backward in float32 (as model_store/qvi/faithfulness.py runs it) and in
float64: the served values come from a running qvi-server (HTTP/JSON), on the first N entities of
the card's seeded 1500-entity sample of the CoNLL-2003 test split.

    build/qvi-server --model-store model_store/store --port 18500 --http-port 18501 &
    .venv/bin/python model_store/scripts/occlusion_precision.py --http localhost:18501 --entities 100
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import served_faithfulness as sf  # noqa: E402
import qvi.faithfulness as F  # noqa: E402
from qvi import artifact  # noqa: E402
from qvi.models import ModelConfig, build_model  # noqa: E402
from qvi.tokenizer import config_from_json, encode  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http", required=True)
    p.add_argument("--entities", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)
    module, manifest, vocab = artifact.load(os.path.join(ROOT, "store", "ner", "1", "model.pt"))
    config = ModelConfig(**manifest["architecture"]["config"])
    examples = F.load_split(os.path.join(ROOT, "data", "conll2003", "test.conll"), manifest, " ")
    tok = config_from_json(manifest["tokenizer"])
    encoded = [encode(e.text, tok, vocab).ids for e in examples]
    eager = build_model(config).eval()
    eager.load_state_dict(module.state_dict())
    scorer = F.Scorer(eager, config, "delete")
    answers = F.answers_of(scorer, manifest, encoded)
    rng = np.random.default_rng(1)
    answers = [answers[i] for i in sorted(rng.choice(len(answers), 1500, replace=False))][:args.entities]
    texts = sorted({a.text for a in answers})
    results = dict(zip(texts, sf.served(args.http, "ner", True, [examples[i].text for i in texts],
                                        [len(encoded[i]) for i in texts])))
    served = sf.rankings(answers, results, True, [], manifest["tags"])["occlusion"]
    keep = [i for i, s in enumerate(served) if s is not None]
    print(f"{len(keep)} of {len(answers)} entities answered alike by the server and the exported model")
    # qvi.faithfulness computes the CRF marginals in float64, as the server does, since 2026-11-29; before,
    # its float32 reference differed from the server by more than 1e-4 on 15.9 % of the values.
    ref = F.Methods(scorer, 1, 1).occlusion(answers)
    for name in ("float64",):
        d = np.concatenate([np.abs(served[i] - ref[i]) for i in keep])
        print(f"reference in {name}: max |served - reference| {d.max():.2g}, share over 1e-4 {(d > 1e-4).mean():.3f}")


if __name__ == "__main__":
    main()
