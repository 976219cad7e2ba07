"""How faithful the *served* explanations are (issue 54's targets), measured through a running
qvi-server: each answer's ranking of tokens comes from the server's own answer over HTTP/JSON
(options.contributions, options.occlusion, α), and its comprehensiveness and sufficiency AOPC are
computed as `python -m qvi faithfulness` computes them (ERASER, tokens deleted), on the exported model
the server loads (model.pt). The server's answers must be the exported model's (same label, same
entities); an answer where they differ is counted and left out.

    build/qvi-server --model-store model_store/store --port 0 --http-port 18501 &
    .venv/bin/python model_store/scripts/served_faithfulness.py --http localhost:18501 --model sentiment \
        --test model_store/data/sentiment/test.tsv

Methods: "contribution" (classifiers: the predicted label's margin share), "occlusion" (the drop in
p(answer) without each token; per entity for a tagger), "alpha" (the served α; a tagger's one row per
text), "random" (seeded; the floor).
"""
import argparse
import json
import os
import sys
import time
import urllib.request

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from qvi import artifact  # noqa: E402
from qvi.faithfulness import KS, Scorer, answers_of, bootstrap_mean, curves, load_split, ordering  # noqa: E402
from qvi.models import ModelConfig  # noqa: E402
from qvi.tokenizer import config_from_json, encode  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")


def post(address, path, body):
    req = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def served(address, model, tagging, texts, lengths, budget=100000):
    """The server's answer for each text, with α, contributions (classifiers) and occlusion; requests
    of at most 16 texts whose occlusion variants (n·(n − 1) tokens each) stay within `budget`, under the
    server's --max-occlusion-tokens."""
    options = {"tokens": True, "attention": True, "occlusion": True}
    if not tagging:
        options["contributions"] = True
    verb = "tag" if tagging else "classify"
    out, start = [], 0
    while start < len(texts):
        end, used = start, 0
        while end < len(texts) and end - start < 16 and (end == start or used + lengths[end] * (lengths[end] - 1) <= budget):
            used += lengths[end] * (lengths[end] - 1)
            end += 1
        out += post(address, f"/v1/models/{model}:{verb}", {"texts": texts[start:end], "options": options})["results"]
        start = end
    return out


def rankings(answers, results, tagging, labels, tags):
    """Per method, each answer's score per token from the server's answer (None where the server's
    answer is not the exported model's)."""
    methods = {"alpha": [], "occlusion": []} if tagging else {"contribution": [], "occlusion": [], "alpha": []}
    for a in answers:
        r = results[a.text]
        n = len(a.ids)
        ok = len(r.get("tokens", [])) == n
        if ok and not tagging:
            ok = r["labels"][0]["label"] == labels[a.label]
        span = None
        if ok and tagging:
            for s in r.get("spans", []):
                if (s.get("tokenStart", 0), s["tokenEnd"]) == a.span and \
                        [tags.index(t["tag"]) for t in r["tokens"][a.span[0]:a.span[1]]] == list(a.tags):
                    span = s
            ok = span is not None
        if not ok:
            for m in methods:
                methods[m].append(None)
            continue
        alpha = np.array([t.get("attention", 0.0) for t in r["tokens"]])
        methods["alpha"].append(alpha)
        if tagging:
            methods["occlusion"].append(np.array(span["occlusion"]))
        else:
            methods["contribution"].append(np.array([t["contribution"][0] for t in r["tokens"]]))
            methods["occlusion"].append(np.array([t["occlusion"][0] for t in r["tokens"]]) if n >= 2 else None)
    return methods


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http", required=True, help="host:port of qvi-server's HTTP/JSON port")
    p.add_argument("--model", required=True, help="a demo model the server serves (its store/<model>/1)")
    p.add_argument("--test", required=True)
    p.add_argument("--max-answers", type=int, default=0, help="a seeded sample (0: every answer)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="also write the figures as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    module, manifest, vocab = artifact.load(os.path.join(ROOT, "store", args.model, "1", "model.pt"))
    config = ModelConfig(**manifest["architecture"]["config"])
    tagging = config.task == "tagging"
    examples = load_split(args.test, manifest, " ")
    tok = config_from_json(manifest["tokenizer"])
    encoded = [encode(e.text, tok, vocab).ids for e in examples]
    scorer = Scorer(module, config, "delete")
    answers = answers_of(scorer, manifest, encoded)
    rng = np.random.default_rng(args.seed)
    if args.max_answers and len(answers) > args.max_answers:
        answers = [answers[i] for i in sorted(rng.choice(len(answers), args.max_answers, replace=False))]
    texts = sorted({a.text for a in answers})
    results = dict(zip(texts, served(args.http, args.model, tagging, [examples[i].text for i in texts],
                                     [len(encoded[i]) for i in texts])))
    methods = rankings(answers, results, tagging, manifest.get("labels", []), manifest.get("tags", []))
    methods["random"] = [np.random.default_rng([args.seed, a.text, a.span[0]]).random(len(a.ids)) for a in answers]
    full = scorer.probs([(a, []) for a in answers])
    report = {"model": args.model, "split": args.test, "answers": len(answers), "removal": "delete", "ks": list(KS),
              "methods": {}}
    print(f"{args.model} ({config.display_name()}): {len(answers)} answers of {args.test}, served by {args.http}")
    print("| method (served) | answers | comprehensiveness AOPC ↑ [95% CI] | sufficiency AOPC ↓ [95% CI] |")
    print("|---|---:|---|---|")
    for m, scores in methods.items():
        keep = [i for i, s in enumerate(scores) if s is not None]
        sub = [answers[i] for i in keep]
        c, s = curves(scorer, sub, full[keep], [ordering(a, scores[i]) for a, i in zip(sub, keep)])
        clusters = np.array([a.text for a in sub])
        cm, clo, chi = bootstrap_mean(c.mean(1), clusters, rng)
        sm, slo, shi = bootstrap_mean(s.mean(1), clusters, rng)
        report["methods"][m] = {"answers": len(sub), "comprehensiveness": [cm, clo, chi], "sufficiency": [sm, slo, shi]}
        print(f"| {m} | {len(sub)} | {cm:.3f} [{clo:.3f}, {chi:.3f}] | {sm:.3f} [{slo:.3f}, {shi:.3f}] |", flush=True)
    report["seconds"] = round(time.time() - t0, 1)
    print(f"({report['seconds']} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
