"""CRF decoding and likelihood against brute-force enumeration on tiny cases."""
import itertools

import pytest
import torch

from qvi.nn import CRF


@torch.no_grad()
def path_score(crf: CRF, e: torch.Tensor, path) -> float:
    s = crf.start[path[0]] + e[0, path[0]]
    for t in range(1, len(path)):
        s = s + crf.trans[path[t - 1], path[t]] + e[t, path[t]]
    return float(s + crf.end[path[-1]])


def make_crf(k: int) -> CRF:
    crf = CRF(k).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


@pytest.mark.parametrize("k,t", [(2, 1), (3, 4), (4, 5), (5, 3)])
def test_viterbi_equals_brute_force(k, t):
    crf = make_crf(k)
    lengths = [t, max(1, t - 2), 1, 0]
    e = torch.randn(len(lengths), t, k, dtype=torch.float64)
    mask = torch.zeros(len(lengths), t, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    tags = torch.jit.script(crf).decode(e, mask)
    for i, n in enumerate(lengths):
        assert torch.all(tags[i, n:] == -1)
        if n == 0:
            continue
        best = max(itertools.product(range(k), repeat=n), key=lambda p: path_score(crf, e[i], p))
        assert tags[i, :n].tolist() == list(best)


def test_nll_equals_brute_force():
    k, t = 3, 4
    crf = make_crf(k)
    e = torch.randn(2, t, k, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    gold = torch.tensor([[0, 2, 1, 1], [2, 0, -1, -1]])
    expected = []
    for i, n in enumerate([4, 2]):
        log_z = torch.logsumexp(torch.tensor([path_score(crf, e[i], p) for p in itertools.product(range(k), repeat=n)], dtype=torch.float64), 0)
        expected.append(float(log_z) - path_score(crf, e[i], gold[i, :n].tolist()))
    nll = crf.neg_log_likelihood(e, gold, mask)
    assert abs(float(nll.detach()) - sum(expected) / 2) < 1e-9
