"""How far to trust a score: temperature scaling, calibration error, split-conformal label sets.

    python -m qvi calibrate --artifact store/sentiment/1/model.pt --dev DEV --test TEST [--write]

A probability is calibrated when, of the answers given 0.7, about 70 % are right. A trained network's
softmax usually is not (too sure of itself, or too shy). Temperature scaling (Guo et al. 2017, "On
Calibration of Modern Neural Networks") divides the model's scores by one number T > 0, fitted on held-out
data (the dev split: never the training data, never the test split it is measured on) by minimising the
negative log-likelihood; it changes no argmax, so no answer changes, only how sure it says it is.

  classifier  p = softmax(logits / T); its confidence is the top label's p.
  tagger      an entity's confidence is the mean, over its tokens, of the CRF marginal of its tags (the
              forward-backward probabilities, qvi.faithfulness.crf_marginals, as the server computes
              them) with every CRF potential (emissions, transitions, start and end) divided by T; T is
              fitted so that the entities' confidences match how often a predicted entity is exactly a
              gold one (the binary log-likelihood). A tagger without a CRF: each token's softmax.

Measured on the test split, before and after: the expected calibration error (ECE: 15 equal-width bins of
confidence, the |accuracy − confidence| of each weighted by its share of answers) and the Brier score
(the mean squared distance of the probability vector from the one-hot truth, summed over the labels; for
entities, of the confidence from 1 or 0).

Label sets with a coverage guarantee (split conformal prediction; Vovk et al. 2005, with the "least
ambiguous" score of Sadinle, Lei and Wasserman 2019): on the n dev answers, s_i = 1 − p(true label);
q = the ⌈(n+1)(1−α)⌉-th smallest s_i; then the set {y : p(y) ≥ 1 − q} of a new text holds its true label
with probability at least 1−α, provided the new text and the dev texts are exchangeable (drawn alike).
The card keeps 1 − q as `min_probability` per level (rounded down to six places, so that no label it
admitted is left out), and the coverage and mean set size the test split gets. T is fitted on the same dev
split: one parameter, which the guarantee does not account for (a stricter split would fit T and the
threshold on halves of it); the test split's measured coverage is the check. A set may be empty (no label is plausible enough), which is an honest "none of these" and keeps the
guarantee. Classifiers only: a tagger's entity is kept or dropped, which the abstention table covers.

Abstention: an answer whose calibrated confidence is below a threshold is marked abstained; the card
lists, for a few thresholds, the share abstained on the test split and the accuracy (entities: the
precision) of the rest — a risk-coverage curve.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

BINS = 15
LEVELS = (0.90, 0.95)
ABSTAIN_BELOW = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
# The temperatures searched: log-spaced, then refined around the best (the NLL of softmax(z / T) is convex
# in 1/T; a tagger's entity likelihood need not be, hence the grid first).
T_RANGE = (0.05, 20.0)


# -- the measures -----------------------------------------------------------------------------------
def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _bin_of(confidence: np.ndarray, bins: int) -> np.ndarray:
    """Bin i holds confidences in (i/bins, (i+1)/bins]; 0 goes to the first."""
    return np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)


def ece(confidence: Sequence[float], correct: Sequence[bool], bins: int = BINS) -> float:
    conf = np.asarray(confidence, dtype=np.float64)
    right = np.asarray(correct, dtype=np.float64)
    if conf.size == 0:
        return 0.0
    which = _bin_of(conf, bins)
    total = 0.0
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            total += in_bin.mean() * abs(right[in_bin].mean() - conf[in_bin].mean())
    return float(total)


def reliability(confidence: Sequence[float], correct: Sequence[bool], bins: int = BINS) -> List[List[float]]:
    """The reliability diagram's points: [bin's upper edge, mean confidence, accuracy, answers] of each
    bin that holds any answer."""
    conf = np.asarray(confidence, dtype=np.float64)
    right = np.asarray(correct, dtype=np.float64)
    which = _bin_of(conf, bins) if conf.size else np.zeros(0, dtype=int)
    out = []
    for b in range(bins):
        in_bin = which == b
        if in_bin.any():
            out.append([round((b + 1) / bins, 4), round(float(conf[in_bin].mean()), 4),
                        round(float(right[in_bin].mean()), 4), int(in_bin.sum())])
    return out


def brier(probs: np.ndarray, labels: Sequence[int]) -> float:
    """Multi-class Brier score: mean over answers of Σ_k (p_k − [k = y])²."""
    p = np.asarray(probs, dtype=np.float64)
    onehot = np.zeros_like(p)
    onehot[np.arange(len(p)), np.asarray(labels)] = 1.0
    return float(((p - onehot) ** 2).sum(axis=1).mean()) if len(p) else 0.0


def binary_brier(confidence: Sequence[float], correct: Sequence[bool]) -> float:
    c = np.asarray(confidence, dtype=np.float64)
    return float(((c - np.asarray(correct, dtype=np.float64)) ** 2).mean()) if c.size else 0.0


def min_probability(p_true: Sequence[float], level: float) -> float:
    """Split conformal's threshold for coverage `level` from the dev answers' probabilities of their true
    labels: a label joins the set when its probability is at least the value returned. With too few dev
    answers for the level (⌈(n+1)·level⌉ > n) every label joins (0)."""
    scores = np.sort(1.0 - np.asarray(p_true, dtype=np.float64))
    n = scores.size
    k = math.ceil((n + 1) * level)
    if n == 0 or k > n:
        return 0.0
    return float(1.0 - scores[k - 1])


def fit_temperature(nll: Callable[[float], float], lo: float = T_RANGE[0], hi: float = T_RANGE[1]) -> float:
    """The T in [lo, hi] that minimises nll(T): a log-spaced grid, then golden-section search between the
    best point's neighbours."""
    grid = np.exp(np.linspace(math.log(lo), math.log(hi), 41))
    values = [nll(float(t)) for t in grid]
    best = int(np.argmin(values))
    a = math.log(grid[max(best - 1, 0)])
    b = math.log(grid[min(best + 1, len(grid) - 1)])
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = nll(math.exp(c)), nll(math.exp(d))
    for _ in range(30):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = nll(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = nll(math.exp(d))
    t = math.exp((a + b) / 2)
    return t if nll(t) <= values[best] else float(grid[best])


# -- classifiers ------------------------------------------------------------------------------------
def classifier_nll(logits: np.ndarray, labels: Sequence[int], temperature: float) -> float:
    p = softmax(logits, temperature)
    return float(-np.log(np.clip(p[np.arange(len(p)), np.asarray(labels)], 1e-300, None)).mean())


def _classifier_side(probs: np.ndarray, labels: np.ndarray) -> Dict[str, object]:
    conf = probs.max(axis=1)
    right = probs.argmax(axis=1) == labels
    return {"ece": round(ece(conf, right), 4), "brier": round(brier(probs, labels), 4),
            "nll": round(float(-np.log(np.clip(probs[np.arange(len(probs)), labels], 1e-300, None)).mean()), 4),
            "accuracy": round(float(right.mean()), 4), "reliability": reliability(conf, right)}


def interval(share: float, n: int) -> List[float]:
    """The 95 % Wilson interval of a share measured on n answers: the sampling error a measured coverage
    is read with (223 test answers put ±4 points around 0.90)."""
    if n == 0:
        return [0.0, 1.0]
    z = 1.959964
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def abstention(confidence: np.ndarray, correct: np.ndarray) -> List[Dict[str, float]]:
    rows = []
    for below in ABSTAIN_BELOW:
        kept = confidence >= below
        rows.append({"below": below, "abstained": round(float(1 - kept.mean()), 4) if kept.size else 0.0,
                     "accuracy": round(float(correct[kept].mean()), 4) if kept.any() else None})
    return rows


def classifier_card(dev_logits: np.ndarray, dev_labels: Sequence[int], test_logits: np.ndarray,
                    test_labels: Sequence[int]) -> Dict[str, object]:
    """model_card.calibration of a classifier from its dev and test splits' logits."""
    dev_y, test_y = np.asarray(dev_labels), np.asarray(test_labels)
    t = fit_temperature(lambda x: classifier_nll(dev_logits, dev_y, x))
    before, after = softmax(test_logits), softmax(test_logits, t)
    dev_after = softmax(dev_logits, t)
    dev_true = dev_after[np.arange(len(dev_after)), dev_y]
    conformal = []
    for level in LEVELS:
        threshold = min_probability(dev_true, level)
        sets = after >= threshold
        covered = float(sets[np.arange(len(sets)), test_y].mean())
        conformal.append({"coverage_target": level, "min_probability": math.floor(threshold * 1e6) / 1e6,
                          "coverage": round(covered, 4), "coverage_interval": interval(covered, len(test_y)),
                          "mean_set_size": round(float(sets.sum(axis=1).mean()), 4),
                          "empty": round(float((sets.sum(axis=1) == 0).mean()), 4)})
    card = {"what": "the top label's probability", "method": "temperature", "temperature": round(t, 6),
            "dev_answers": int(len(dev_y)), "test_answers": int(len(test_y)), "bins": BINS,
            "before": _classifier_side(before, test_y), "after": _classifier_side(after, test_y),
            "conformal": conformal,
            "abstention": abstention(after.max(axis=1), after.argmax(axis=1) == test_y)}
    note = shortfall_note(conformal, float((dev_after.argmax(axis=1) == dev_y).mean()),
                          float((after.argmax(axis=1) == test_y).mean()))
    return dict(card, note=note) if note else card


def shortfall_note(conformal: List[Dict[str, object]], dev_accuracy: float, test_accuracy: float) -> str:
    """What the card says when a level's coverage on the test split falls short of its target beyond sampling
    error (its 95 % interval lies below the target): the guarantee holds for texts drawn like the calibration split,
    and the test split was not — a model more accurate on the one than on the other shows it. "" otherwise."""
    short = [c for c in conformal if c["coverage_interval"][1] < c["coverage_target"]]  # type: ignore[index,operator]
    if not short:
        return ""
    levels = ", ".join(f"{c['coverage']:.3f} for {c['coverage_target']}" for c in short)
    return (f"coverage on the test split fell short beyond sampling error ({levels}): the thresholds were fitted "
            f"on the calibration split, on which this model is right {100 * dev_accuracy:.1f} % of the time against "
            f"{100 * test_accuracy:.1f} % on the test split, so the two are not drawn alike for it, which the "
            "guarantee assumes; expect less coverage than asked for on texts like the test split")


# -- taggers --------------------------------------------------------------------------------------
class TaggerOutputs:
    """A tagger's emissions over a split, its CRF, the predicted tags and the gold entities: enough to
    give every predicted entity a confidence at any temperature."""

    def __init__(self, batches: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], crf: Optional[object],
                 tags: Sequence[str], gold: List[set]):
        self.batches = batches  # (emissions [B,T,K], mask [B,T], predicted tag ids [B,T])
        self.crf = crf
        self.tags = list(tags)
        self.gold = gold  # per text: {(start, end, type)}

    def entities(self, temperature: float) -> Tuple[np.ndarray, np.ndarray]:
        """(confidence, correct) of every predicted entity, in text order."""
        from qvi.faithfulness import crf_marginals
        from qvi.metrics import chunks
        conf: List[float] = []
        right: List[bool] = []
        text = 0
        for emissions, mask, predicted in self.batches:
            if self.crf is not None:
                scaled = SimpleNamespace(start=self.crf.start / temperature, end=self.crf.end / temperature,
                                         trans=self.crf.trans / temperature)
                marg = crf_marginals(scaled, emissions / temperature, mask)
            else:
                marg = torch.softmax(emissions.double() / temperature, dim=-1)
            for r in range(emissions.shape[0]):
                n = int(mask[r].sum())
                row = [int(x) for x in predicted[r, :n]]
                for start, end, type_ in sorted(chunks([self.tags[k] for k in row])):
                    p = float(np.mean([float(marg[r, i, row[i]]) for i in range(start, end)]))
                    conf.append(p)
                    right.append((start, end, type_) in self.gold[text])
                text += 1
        return np.asarray(conf), np.asarray(right, dtype=bool)


def entity_nll(outputs: TaggerOutputs, temperature: float) -> float:
    conf, right = outputs.entities(temperature)
    conf = np.clip(conf, 1e-12, 1 - 1e-12)
    return float(-(right * np.log(conf) + (~right) * np.log(1 - conf)).mean()) if conf.size else 0.0


def _tagger_side(conf: np.ndarray, right: np.ndarray) -> Dict[str, object]:
    return {"ece": round(ece(conf, right), 4), "brier": round(binary_brier(conf, right), 4),
            "precision": round(float(right.mean()), 4) if right.size else None,
            "reliability": reliability(conf, right)}


def tagger_card(dev: TaggerOutputs, test: TaggerOutputs) -> Dict[str, object]:
    """model_card.calibration of a tagger: its entities' confidences."""
    t = fit_temperature(lambda x: entity_nll(dev, x))
    before, after = test.entities(1.0), test.entities(t)
    return {"what": "an entity's probability: the mean CRF marginal of its tags", "method": "temperature",
            "temperature": round(t, 6), "dev_answers": int(dev.entities(1.0)[0].size),
            "test_answers": int(before[0].size), "bins": BINS, "before": _tagger_side(*before),
            "after": _tagger_side(*after), "abstention": abstention(*after)}


# -- an artifact's outputs over a split -------------------------------------------------------------
def _encoded(path: str, manifest: Dict[str, object], vocab, join: str):
    from qvi.data import encode_examples
    from qvi.tokenizer import config_from_json
    from qvi.workflow import read_corpus
    task = str(manifest["task"])
    labels = manifest["labels"] if task == "classification" else manifest["tags"]
    tok = config_from_json(manifest["tokenizer"])  # type: ignore[arg-type]
    return encode_examples(read_corpus(path, task, join), tok, vocab, labels,  # type: ignore[arg-type]
                           str(manifest.get("tag_scheme", "")), task == "tagging"), labels


def classifier_logits(module, manifest: Dict[str, object], vocab, path: str, join: str = " "):
    from qvi.data import batches
    data, _ = _encoded(path, manifest, vocab, join)
    logits, labels = [], []
    with torch.no_grad():
        for ids, mask, targets in batches(data, 64, tagging=False):
            logits.append(module(ids, mask)["logits"].double().numpy())
            labels.extend(int(t) for t in targets)
    return np.concatenate(logits), np.asarray(labels)


def tagger_outputs(module, manifest: Dict[str, object], vocab, path: str, join: str = " ") -> TaggerOutputs:
    from qvi.data import batches
    from qvi.metrics import chunks
    data, tags = _encoded(path, manifest, vocab, join)
    out, gold = [], []
    with torch.no_grad():
        for ids, mask, targets in batches(data, 64, tagging=True):
            result = module(ids, mask)
            out.append((result["emissions"].detach().double(), mask, result["tags"]))
            for r in range(ids.shape[0]):
                n = int(mask[r].sum())
                gold.append(chunks([tags[int(k)] for k in targets[r, :n]]))
    return TaggerOutputs(out, crf_scores(getattr(module, "crf", None)), tags, gold)  # type: ignore[arg-type]


def crf_scores(crf: Optional[object]) -> Optional[SimpleNamespace]:
    """A model's CRF potentials (start, end, transitions) in float64, as the server's CrfMarginals; None: no CRF."""
    if crf is None:
        return None
    return SimpleNamespace(**{k: getattr(crf, k).detach().double() for k in ("start", "end", "trans")})


# -- a sub-word model (fine-tuned by the zoo, or imported): its tokenizer.json, its answers per word as served -----
Forward = Callable[[torch.Tensor, torch.Tensor], Dict[str, torch.Tensor]]


def subword_split(tokenizer_json: str, split, task: str, labels: Sequence[str], max_tokens: int,
                  join: str = " "):
    """A split (its file, or its examples) encoded for a sub-word model (qvi.subword_data.SubwordData) from its
    tokenizer.json's text, truncated at `max_tokens` as the server truncates (the manifest's tokenizer.max_tokens)."""
    from qvi.data import read_classification, read_conll
    from qvi.subword_data import SubwordData
    tagging = task == "tagging"
    path = split if isinstance(split, str) else "the held-out slice"
    examples = split if not isinstance(split, str) else read_conll(path, join) if tagging else read_classification(path)
    found = {t for e in examples for _, _, t in e.spans} if tagging else {e.label for e in examples}
    known = {t.split("-", 1)[-1] for t in labels} if tagging else set(labels)
    if found - known:
        raise ValueError(f"{path}: {'entity types' if tagging else 'labels'} {sorted(found - known)} are not the "
                         f"model's ({', '.join(sorted(known - {'O'}))})")
    return SubwordData(tokenizer_json, examples, labels, tagging, max_tokens, tokenizer_text=True, targets=False)


def subword_logits(forward: Forward, data) -> Tuple[np.ndarray, np.ndarray]:
    from qvi.subword_data import batches
    rows: Dict[int, np.ndarray] = {}
    with torch.no_grad():
        for ids, mask, _, index in batches(data.items, 64, False, 0, shuffle=False):
            logits = forward(ids, mask)["logits"].double().numpy()
            rows.update(zip(index, logits))
    return np.stack([rows[i] for i in range(len(rows))]), np.asarray([e.target[0] for e in data.items])


def subword_tagger_outputs(forward: Forward, data, tags: Sequence[str], crf: Optional[object]) -> TaggerOutputs:
    """As the server answers a sub-word tagger: each word's first sub-word's emissions and tag, the CRF over the
    words; gold entities as spans of words (an entity that is not whole words cannot be found, and is left out)."""
    from qvi.subword_data import batches
    words: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for ids, mask, _, index in batches(data.items, 64, True, 0, shuffle=False):
            out = forward(ids, mask)
            for k, r in enumerate(index):
                first = torch.tensor([f for f, _, _ in data.words[r]], dtype=torch.long)
                words[r] = (out["emissions"][k].index_select(0, first).double(), out["tags"][k].index_select(0, first))
    padded = []
    for b in range(0, len(words), 64):
        group = [words[r] for r in range(b, min(b + 64, len(words)))]
        n = max([1] + [len(p) for _, p in group])
        emissions = torch.zeros(len(group), n, len(tags), dtype=torch.double)
        mask = torch.zeros(len(group), n, dtype=torch.bool)
        predicted = torch.zeros(len(group), n, dtype=torch.long)
        for k, (e, p) in enumerate(group):
            emissions[k, :len(p)], mask[k, :len(p)], predicted[k, :len(p)] = e, True, p
        padded.append((emissions, mask, predicted))
    gold = []
    for i, ex in enumerate(data.examples):
        starts = {s: j for j, (_, s, _) in enumerate(data.words[i])}
        ends = {e: j + 1 for j, (_, _, e) in enumerate(data.words[i])}
        gold.append({(starts[s], ends[e], t) for s, e, t in ex.spans if s in starts and e in ends})
    return TaggerOutputs(padded, crf, tags, gold)


def subword_card(forward: Forward, manifest: Dict[str, object], tokenizer_json: str, dev, test: str,
                 crf: Optional[object], join: str = " ") -> Dict[str, object]:
    """model_card.calibration of a sub-word model (`forward(ids, mask)`: its outputs) from the split it is fitted on
    (`dev`: a file, or examples such as a slice held out of training) and its test split."""
    task = str(manifest["task"])
    labels = manifest["labels"] if task == "classification" else manifest["tags"]
    max_tokens = int(manifest["tokenizer"]["max_tokens"])  # type: ignore[index]
    splits = [subword_split(tokenizer_json, p, task, labels, max_tokens, join)  # type: ignore[arg-type]
              for p in (dev, test)]
    if task == "classification":
        return classifier_card(*subword_logits(forward, splits[0]), *subword_logits(forward, splits[1]))
    return tagger_card(*(subword_tagger_outputs(forward, d, labels, crf_scores(crf)) for d in splits))  # type: ignore[arg-type]


def split_names(dev: str, test: str, root: Optional[str]) -> Dict[str, str]:
    """The card's fitted_on and measured_on: the splits' paths from `root` (else their file names)."""
    name = (lambda p: os.path.relpath(os.path.abspath(p), root)) if root else os.path.basename
    return {"fitted_on": name(dev), "measured_on": name(test)}


def calibrate(artifact_path: str, dev: str, test: str, join: str = " ", root: Optional[str] = None) -> Dict[str, object]:
    """The calibration card of an exported model.pt (the zoo's, or a sub-word model's) from its dev and test
    splits (`root`: the folder the splits are named from on the card)."""
    from qvi import artifact
    torch.manual_seed(0)
    extra = {artifact.MANIFEST: "", artifact.TOKENIZER: ""}
    module = torch.jit.load(artifact_path, map_location="cpu", _extra_files=extra)
    manifest = json.loads(extra[artifact.MANIFEST])
    if manifest.get("tokenizer", {}).get("level") == "subword":
        module.eval()
        text = extra[artifact.TOKENIZER]
        card = subword_card(module.forward_without_maps, manifest, text if isinstance(text, str) else text.decode(),
                            dev, test, getattr(module, "crf", None), join)
    else:
        module, manifest, vocab = artifact.load(artifact_path)
        if manifest["task"] == "classification":
            card = classifier_card(*classifier_logits(module, manifest, vocab, dev, join),
                                   *classifier_logits(module, manifest, vocab, test, join))
        else:
            card = tagger_card(tagger_outputs(module, manifest, vocab, dev, join),
                               tagger_outputs(module, manifest, vocab, test, join))
    return {**split_names(dev, test, root), **card}


def cmd_calibrate(args: argparse.Namespace) -> None:
    card = calibrate(args.artifact, args.dev, args.test, args.conll_join)
    shown = {k: v for k, v in card.items()}
    for side in ("before", "after"):
        shown[side] = {k: v for k, v in card[side].items() if k != "reliability"}  # type: ignore[union-attr]
    print(json.dumps(shown, indent=1, ensure_ascii=False))
    if args.write:
        from qvi import artifact
        print(artifact.update_card(args.artifact, {"calibration": card}))


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("calibrate", help="fit a temperature on the dev split, measure ECE, Brier, conformal "
                                         "coverage and abstention on the test split")
    p.add_argument("--artifact", required=True, help="an exported model.pt")
    p.add_argument("--dev", required=True, help="the split the temperature and thresholds are fitted on")
    p.add_argument("--test", required=True, help="the split they are measured on")
    p.add_argument("--conll-join", default=" ")
    p.add_argument("--write", action="store_true", help="put the figures on the artifact's card (model.pt "
                                                        "rewritten atomically; its packages keep their old card)")
    p.set_defaults(func=cmd_calibrate)
