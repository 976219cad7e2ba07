"""What β tells, measured on the demo models (issue 54 item 6; docs/serving.md, "How far to trust an
explanation"): per answer, Spearman's ρ between the QVI gate β of each token and (classifiers) its
exact contribution to the predicted label's margin, and between β and leave-one-out (the drop in
p(answer) when the token is deleted; for the tagger, the drop in the entity's mean CRF marginal, over
the tokens outside the entity); and how often the token with the highest β is among the top 3 by
contribution or by leave-one-out (against the same rate for a token drawn at random: 3/n). All from the
exported model (model.pt, what the server runs), on a seeded sample of the test split's answers.

    .venv/bin/python model_store/scripts/beta_agreement.py --answers 300 > bench/results/beta-agreement.txt
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from qvi import artifact  # noqa: E402
from qvi.faithfulness import Answer, Methods, Scorer, answers_of, load_split, spearman  # noqa: E402
from qvi.models import ModelConfig  # noqa: E402
from qvi.tokenizer import config_from_json, encode  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
DEMOS = {"sentiment": "data/sentiment/test.tsv", "topics": "data/bbc/test.tsv", "ner": "data/conll2003/test.conll"}
TOP = 3


def contribution_margin(module, answers):
    """Each answer's tokens' shares of its predicted label's margin, from the model's contribution output."""
    out = []
    for a in answers:
        ids = torch.tensor([a.ids])
        with torch.no_grad():
            c = module(ids, torch.ones_like(ids, dtype=torch.bool))["contribution"][0]  # [T, C]
        y = a.label
        out.append((c[:, y] - (c.sum(1) - c[:, y]) / max(c.size(1) - 1, 1)).numpy())
    return out


def gates(module, a):
    ids = torch.tensor([a.ids])
    with torch.no_grad():
        return module(ids, torch.ones_like(ids, dtype=torch.bool))["gates"][0].numpy()


def measure(name, answers_wanted, seed):
    path = os.path.join(ROOT, "store", name, "1", "model.pt")
    module, manifest, vocab = artifact.load(path)
    config = ModelConfig(**manifest["architecture"]["config"])
    tok = config_from_json(manifest["tokenizer"])
    examples = load_split(os.path.join(ROOT, DEMOS[name]), manifest, " ")
    encoded = [encode(e.text, tok, vocab).ids for e in examples]
    scorer = Scorer(module, config, "delete")
    answers = [a for a in answers_of(scorer, manifest, encoded) if len(a.candidates) >= 4]
    rng = np.random.default_rng(seed)
    answers = [answers[i] for i in sorted(rng.choice(len(answers), min(answers_wanted, len(answers)), replace=False))]
    loo = Methods(scorer, 1, seed).occlusion(answers)
    contrib = contribution_margin(module, answers) if config.task == "classification" else [None] * len(answers)
    rho_c, rho_l, hit_c, hit_l, chance = [], [], [], [], []
    for a, l, c in zip(answers, loo, contrib):
        cand = a.candidates
        b = gates(module, a)[cand]
        top_b = int(np.argmax(b))
        rho_l.append(spearman(b, l[cand]))
        hit_l.append(top_b in np.argsort(-l[cand], kind="stable")[:TOP])
        chance.append(min(1.0, TOP / len(cand)))
        if c is not None:
            rho_c.append(spearman(b, c[cand]))
            hit_c.append(top_b in np.argsort(-c[cand], kind="stable")[:TOP])

    def mean(x):
        x = np.array([v for v in x if v == v], dtype=float)
        return f"{x.mean():.3f}" if len(x) else "—"

    return (f"| {name} ({config.display_name()}) | {len(answers)} | {mean(rho_c)} | {mean(rho_l)} | "
            f"{mean(hit_c)} | {mean(hit_l)} | {mean(chance)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=300, help="a seeded sample of each model's test answers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"β against the token's effect, {args.answers} answers per model (seed {args.seed}), exported model.pt; "
          f"answers with at least 4 candidate tokens")
    print("")
    print(f"| model | answers | ρ(β, contribution) | ρ(β, leave-one-out) | top-β token in contribution's top {TOP} | "
          f"top-β token in leave-one-out's top {TOP} | a random token in the top {TOP} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in DEMOS:
        print(measure(name, args.answers, args.seed), flush=True)


if __name__ == "__main__":
    main()
