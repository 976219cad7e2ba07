"""Does a temperature per entity type pay for a tagger (issue 77)? Fits one T on the dev split, then one T per entity
type (each type's entities' binary log-likelihood, the CRF marginals at that type's T), and prints the test split's
ECE and Brier of every entity's confidence both ways, and per type. Zoo taggers (model.pt with vocab.txt).

    cd model_store && ../.venv/bin/python scripts/per_type_temperature.py [store/ner/1/model.pt]
"""
import os
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from qvi import artifact, calibration as C  # noqa: E402
from qvi.faithfulness import crf_marginals  # noqa: E402
from qvi.metrics import chunks  # noqa: E402

torch.set_num_threads(1)
module, manifest, vocab = artifact.load(sys.argv[1] if len(sys.argv) > 1 else "store/ner/1/model.pt")
dev = C.tagger_outputs(module, manifest, vocab, "data/conll2003/dev.conll")
test = C.tagger_outputs(module, manifest, vocab, "data/conll2003/test.conll")


def typed(o, T):
    conf, right, types = [], [], []
    text = 0
    for em, mask, pred in o.batches:
        s = SimpleNamespace(start=o.crf.start / T, end=o.crf.end / T, trans=o.crf.trans / T)
        marg = crf_marginals(s, em / T, mask)
        for r in range(em.shape[0]):
            n = int(mask[r].sum())
            row = [int(x) for x in pred[r, :n]]
            for a, b, t in sorted(chunks([o.tags[k] for k in row])):
                conf.append(float(np.mean([float(marg[r, i, row[i]]) for i in range(a, b)])))
                right.append((a, b, t) in o.gold[text])
                types.append(t)
            text += 1
    return np.array(conf), np.array(right), np.array(types)


t0 = time.time()
T1 = C.fit_temperature(lambda x: C.entity_nll(dev, x))
c1, r1, ty = typed(test, T1)
print("one T", round(T1, 3), "test ECE", round(C.ece(c1, r1), 4), "brier", round(C.binary_brier(c1, r1), 4), f"({time.time()-t0:.0f} s)")
per = {}
for t in sorted(str(x) for x in set(ty)):
    def nll(x, t=t):
        c, r, k = typed(dev, x)
        c, r = np.clip(c[k == t], 1e-12, 1 - 1e-12), r[k == t]
        return float(-(r * np.log(c) + (~r) * np.log(1 - c)).mean())
    per[t] = C.fit_temperature(nll)
conf, right = np.zeros(len(c1)), r1
for t, T in per.items():
    c, r, k = typed(test, T)
    conf[k == t] = c[k == t]
print("per type", {k: round(v, 3) for k, v in per.items()}, "test ECE", round(C.ece(conf, right), 4), "brier", round(C.binary_brier(conf, right), 4), f"({time.time()-t0:.0f} s)")
for t in sorted(per):
    m = ty == t
    print(t, int(m.sum()), "ECE one T", round(C.ece(c1[m], r1[m]), 4), "per-type T", round(C.ece(conf[m], right[m]), 4))
