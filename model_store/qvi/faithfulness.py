"""python -m qvi faithfulness — how far each explanation's ranking of tokens agrees with what the
model's answer depends on (ERASER's comprehensiveness and sufficiency, DeYoung et al. 2020).

An *answer* is what is explained: a classifier's predicted label ŷ for one text, or one entity a
tagger predicted. Its score p is p(ŷ | x) for a classifier; for a tagger, the mean over the
entity's tokens of the CRF marginal probability of the tag predicted there (forward-backward over
the served emissions and transitions, so the whole CRF, not the emissions alone). An explanation
method scores the answer's *candidate* tokens (all tokens of a classifier's text; the tokens
outside the entity for a tagger, whose entity tokens always stay). For k in KS (per cent), r_k is
the top ⌈k·n/100⌉ candidates (n candidates; at least one) and

    comprehensiveness_k = p(x) − p(x ∖ r_k)       higher: the top tokens carry the answer
    sufficiency_k       = p(x) − p(r_k)           lower: the top tokens alone keep it
                                                  (r_k = r_k and, for a tagger, the entity)

each averaged over KS into an AOPC (ERASER averages over the same bins). Tokens are removed by
`removal`: "delete" takes them out and closes up the text (positions shift, neighbours meet);
"pad" puts [PAD] (the zero vector) in their place, keeping the text's length and positions. A
removed suffix of a text is, by the models' padding invariance, the same under deletion as under
masking it off as padding; `padding_check` measures that on every run.

Normalised AOPC (after Edin et al. 2024) rescales an answer's AOPC by the lowest and highest AOPC
of any ordering it was evaluated with — every method's ranking and its reverse — so that answers
and models with different ranges compare: 0 is the worst of those orderings, 1 the best. Edin et
al. search orderings with a beam; ours is the cheaper stand-in and is reported as such.

The methods (METHODS): a seeded random ranking (the floor); α, the pooling attention the server
returns; contribution (α·g), the token's exact share of the predicted label's logit margin through the
pooling, as the server's options.contributions serves it (the output is Σ α_i g(q, v_i), eq. 2/6, and
a linear layer follows, so the margin (w_ŷ − mean of the other rows)ᵀ Σ α_i g_i splits over tokens
exactly; for QVI g_i holds β_i; read from the model's `contribution` output);
for Transformers the last layer's attention and attention rollout (Abnar & Zuidema 2020), both
read through α for a classifier (the pooled vector reads position i with weight α_i) and through
the entity's rows for a tagger; gradient × input and integrated gradients from Captum on the
embedding layer (signed, summed over the embedding; IG's baseline is [PAD] everywhere); and
occlusion (leave-one-out), p(x) − p(x ∖ i) for each candidate i, computed as the server's
options.occlusion computes it (each text's n variants scored once for all its answers), the expensive
reference that the others' Spearman ρ is measured against.

`run` measures through the exported model the server loads (model.pt, TorchScript): every
probability, α, the contribution and the occlusion variants come from its forward (forward_without_maps
where it has one, as the server calls it); only the gradient methods and the attention maps use the
same weights in eager PyTorch (Captum hooks the embedding layer). Each method's cost is measured too
(`method_costs`): wall ms per text computing it one text at a time and 32 texts at a time, and the
forward passes it needs beyond the answer's own.
"""
import argparse
import json
import math
import platform
import time
import zipfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from qvi import artifact
from qvi.data import Example, read_classification, read_conll
from qvi.metrics import chunks
from qvi.models import CONTEXT_AWARE, ModelConfig, TransformerClassifier, TransformerCRF, build_model, token_embedding
from qvi.tokenizer import config_from_json, encode

KS = (1, 5, 10, 20, 50)
METHODS = ("random", "alpha", "contribution", "last_layer", "rollout", "grad_input", "integrated_gradients",
           "occlusion")
NAMES = {"random": "random", "alpha": "α", "contribution": "contribution", "last_layer": "last-layer attention",
         "rollout": "attention rollout", "grad_input": "gradient × input", "integrated_gradients": "integrated gradients",
         "occlusion": "occlusion"}
REFERENCE = "occlusion"  # the method the others' ρ is measured against
REMOVALS = ("delete", "pad")
PAD = 0


@dataclass
class Answer:
    """One explained answer: a text's label, or one predicted entity [start, end) of a text."""
    text: int
    ids: List[int]
    label: int = -1                              # classifier: ŷ
    span: Tuple[int, int] = (0, 0)               # tagger: the entity's token positions
    tags: List[int] = field(default_factory=list)  # tagger: the predicted tag ids over the span

    @property
    def candidates(self) -> List[int]:
        s, e = self.span
        return [i for i in range(len(self.ids)) if not s <= i < e]


def supported_methods(config: ModelConfig, outputs: Sequence[str]) -> List[str]:
    """The methods a model supports: attention ones only where it returns attention."""
    methods = ["random", "grad_input", "integrated_gradients", "occlusion"]
    if "attention" in outputs:
        methods.insert(1, "alpha")
    if "contribution" in outputs:
        methods.insert(2, "contribution")
    if "layer_attention" in outputs:
        methods[methods.index("grad_input"):methods.index("grad_input")] = ["last_layer", "rollout"]
    return [m for m in METHODS if m in methods]


class Scorer:
    """p of answers, whole or with tokens removed, in batches; and the model's per-token views.
    `served`: the exported model (TorchScript) the server loads; forward passes without attention
    maps and without gradients go through it, the others through the eager `model` (same weights)."""

    def __init__(self, model: nn.Module, config: ModelConfig, removal: str, batch_tokens: int = 8192,
                 served: Optional[torch.jit.ScriptModule] = None):
        if removal not in REMOVALS:
            raise ValueError(f"removal must be one of {REMOVALS}, got {removal!r}")
        self.model = model.eval()
        self.served = served
        self.config = config
        self.tagging = config.task == "tagging"
        self.removal = removal
        self.batch_tokens = batch_tokens

    # -- forward passes ---------------------------------------------------------------------------
    def _outputs(self, ids: torch.Tensor, mask: torch.Tensor, maps: bool, eager: bool = False) -> Dict[str, torch.Tensor]:
        if self.served is not None and not maps and not eager:
            s = self.served
            return s.forward_without_maps(ids, mask) if hasattr(s, "forward_without_maps") else s(ids, mask)
        m = self.model
        if isinstance(m, TransformerCRF):
            return m._run(ids, mask, "maps" if maps else "received", decode=False)
        if isinstance(m, TransformerClassifier) and not maps:
            return m.forward_without_maps(ids, mask)
        return m(ids, mask)

    def score(self, ids: torch.Tensor, mask: torch.Tensor, label: torch.Tensor, span: torch.Tensor,
              tags: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """p [B] of each row's answer: label [B] (classifier); span [B,T] bool and tags [B,T]
        (tagger: the entity's positions and their predicted tags). Differentiable when `eager`."""
        table = self.table(ids, mask, eager)
        if not self.tagging:
            return table.gather(1, label.unsqueeze(1)).squeeze(1)
        picked = table.gather(2, tags.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        s = span.to(picked.dtype)
        return (picked * s).sum(1) / s.sum(1).clamp(min=1.0)

    def table(self, ids: torch.Tensor, mask: torch.Tensor, eager: bool = False) -> torch.Tensor:
        """What answers are scored from: p(label) [B,C] of a classifier, the CRF marginals [B,T,K]
        (float64, as the server computes them) of a tagger."""
        out = self._outputs(ids, mask, maps=False, eager=eager)
        if not self.tagging:
            return torch.softmax(out["logits"], dim=-1)
        crf = getattr(self.model if eager or self.served is None else self.served, "crf", None)
        if crf is None:  # a tagger without a CRF (an imported one): each token's softmax, as the server reads it
            return torch.softmax(out["emissions"].double(), dim=-1)
        return crf_marginals(crf, out["emissions"], mask)

    def variant(self, a: Answer, removed: Sequence[int]) -> Tuple[List[int], Tuple[int, int]]:
        """The answer's ids with `removed` positions taken out (delete) or set to [PAD] (pad), and
        where its entity then lies."""
        if self.removal == "pad":
            gone = set(removed)
            return [PAD if i in gone else t for i, t in enumerate(a.ids)], a.span
        gone = set(removed)
        ids = [t for i, t in enumerate(a.ids) if i not in gone]
        before = sum(1 for i in gone if i < a.span[0])
        return ids, (a.span[0] - before, a.span[1] - before)

    @torch.no_grad()
    def tables(self, rows: Sequence[List[int]]) -> List[np.ndarray]:
        """`table` of each row of ids (right-padded into batches of at most batch_tokens), as numpy:
        [C] per classifier row, [n, K] per tagger row of n tokens."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        out: List[np.ndarray] = [np.zeros(0)] * len(rows)
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * max(1, len(rows[order[end]])) <= self.batch_tokens:
                end += 1
            picked = order[start:end]
            t = max(1, max(len(rows[i]) for i in picked))
            ids = torch.zeros(len(picked), t, dtype=torch.long)
            mask = torch.zeros(len(picked), t, dtype=torch.bool)
            for r, i in enumerate(picked):
                ids[r, :len(rows[i])] = torch.tensor(rows[i], dtype=torch.long)
                mask[r, :len(rows[i])] = True
            table = self.table(ids, mask).numpy()
            for r, i in enumerate(picked):
                out[i] = table[r] if not self.tagging else table[r, :len(rows[i])]
            start = end
        return out

    def read(self, table: np.ndarray, a: Answer, span: Tuple[int, int]) -> float:
        """p of answer `a` from its row's table, its entity at `span` there (a tagger)."""
        if not self.tagging:
            return float(table[a.label])
        s, e = span
        return float(np.mean([table[s + j, tag] for j, tag in enumerate(a.tags)])) if e > s else 0.0

    @torch.no_grad()
    def probs(self, items: Sequence[Tuple[Answer, Sequence[int]]], masked_suffix: bool = False) -> np.ndarray:
        """p of each (answer, removed positions); masked_suffix: the removed positions are a suffix
        turned into padding (mask off) instead (the padding check)."""
        rows = []
        for a, removed in items:
            if masked_suffix:
                gone = set(removed)
                ids = [PAD if i in gone else t for i, t in enumerate(a.ids)]
                rows.append((ids, len(a.ids) - len(gone), a.span, a))
            else:
                ids, span = self.variant(a, removed)
                rows.append((ids, len(ids), span, a))
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        out = np.zeros(len(rows))
        start = 0
        while start < len(order):
            t = max(1, len(rows[order[start]][0]))
            end = start + 1
            while end < len(order) and (end - start + 1) * max(1, len(rows[order[end]][0])) <= self.batch_tokens:
                end += 1
            chunk = [rows[i] for i in order[start:end]]
            out[order[start:end]] = self.score(*self._tensors(chunk)).numpy()
            start = end
        return out

    def _tensors(self, chunk: Sequence[Tuple[List[int], int, Tuple[int, int], Answer]]) -> Tuple[torch.Tensor, ...]:
        t = max(1, max(len(r[0]) for r in chunk))
        b = len(chunk)
        ids = torch.zeros(b, t, dtype=torch.long)
        mask = torch.zeros(b, t, dtype=torch.bool)
        label = torch.zeros(b, dtype=torch.long)
        span = torch.zeros(b, t, dtype=torch.bool)
        tags = torch.zeros(b, t, dtype=torch.long)
        for r, (row_ids, real, (s, e), a) in enumerate(chunk):
            ids[r, :len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
            mask[r, :real] = True
            label[r] = max(a.label, 0)
            if self.tagging:
                span[r, s:e] = True
                tags[r, s:e] = torch.tensor(a.tags, dtype=torch.long)
        return ids, mask, label, span, tags

    def batch(self, answers: Sequence[Answer]) -> Tuple[torch.Tensor, ...]:
        return self._tensors([(a.ids, len(a.ids), a.span, a) for a in answers])


def crf_marginals(crf: nn.Module, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """p(y_t = k | x) [B,T,K] under the CRF (forward-backward in log space, float64 like the server's
    CrfMarginals: float32 loses up to ~1e-4 of a marginal over a long text); 0 on padding. Rows'
    real tokens are a prefix (right padding), as the CRF's decode assumes."""
    emissions = emissions.double()
    b, t, k = emissions.shape
    if t == 0:
        return emissions
    start, end, trans = crf.start.double(), crf.end.double(), crf.trans.double()  # type: ignore[union-attr]
    fwd = [start.unsqueeze(0) + emissions[:, 0]]
    for i in range(1, t):
        nxt = torch.logsumexp(fwd[-1].unsqueeze(2) + trans.unsqueeze(0), dim=1) + emissions[:, i]
        fwd.append(torch.where(mask[:, i].unsqueeze(1), nxt, fwd[-1]))
    lengths = mask.long().sum(1)
    bwd: List[torch.Tensor] = [torch.zeros(b, k, dtype=emissions.dtype)] * t
    last = end.unsqueeze(0).expand(b, k)
    bwd[t - 1] = last
    for i in range(t - 2, -1, -1):
        prev = torch.logsumexp(trans.unsqueeze(0) + (emissions[:, i + 1] + bwd[i + 1]).unsqueeze(1), dim=2)
        # a row whose last real token is i takes the end scores; beyond its length nothing is read
        bwd[i] = torch.where((i + 1 < lengths).unsqueeze(1), prev, last)
    alpha = torch.stack(fwd, 1)
    beta = torch.stack(bwd, 1)
    log_z = torch.logsumexp(alpha.gather(1, (lengths - 1).clamp(min=0).view(b, 1, 1).expand(b, 1, k)).squeeze(1)
                            + end.unsqueeze(0), dim=1)
    marg = torch.exp(alpha + beta - log_z.view(b, 1, 1))
    return marg * mask.unsqueeze(-1).to(marg.dtype)


# -- the methods: each returns one score per token of each answer ([B,T], higher = more important) ---
def _rows_of(answers: Sequence[Answer], weights: torch.Tensor, tagging: bool) -> torch.Tensor:
    """The query weights [B,T] through which a map is read: α for a classifier, the entity's
    positions (uniform) for a tagger."""
    if not tagging:
        return weights
    w = torch.zeros_like(weights)
    for r, a in enumerate(answers):
        w[r, a.span[0]:a.span[1]] = 1.0 / (a.span[1] - a.span[0])
    return w


def _rollout(maps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema's rollout [B,T,T]: Â_l = ½ mean_h A_l + ½ I, rows renormalised, multiplied
    from the first layer up."""
    b, n_layers, _, t, _ = maps.shape
    eye = torch.eye(t).unsqueeze(0)
    roll = eye.expand(b, t, t)
    for layer in range(n_layers):
        a = 0.5 * maps[:, layer].mean(1) + 0.5 * eye
        a = a * mask.unsqueeze(1).to(a.dtype) + eye * (~mask).unsqueeze(1).to(a.dtype)
        a = a / a.sum(-1, keepdim=True).clamp(min=1e-12)
        roll = torch.bmm(a, roll)
    return roll


class Methods:
    """Computes the rankings of METHODS for a batch of answers."""

    def __init__(self, scorer: Scorer, ig_steps: int, seed: int):
        self.s = scorer
        self.ig_steps = ig_steps
        self.seed = seed

    def run(self, name: str, answers: Sequence[Answer]) -> List[np.ndarray]:
        """Per answer, a score per token (length len(ids)); only candidates' scores are read."""
        if name == "random":
            return [np.random.default_rng([self.seed, a.text, a.span[0]]).random(len(a.ids)) for a in answers]
        if name == "occlusion":
            return self.occlusion(answers)
        ids, mask, label, span, tags = self.s.batch(answers)
        if name in ("grad_input", "integrated_gradients"):
            scores = self.gradients(name, ids, mask, label, span, tags)
        else:
            scores = self.attention(name, answers, ids, mask, label)
        return [scores[r, :len(a.ids)].detach().numpy() for r, a in enumerate(answers)]

    @torch.no_grad()
    def attention(self, name: str, answers: Sequence[Answer], ids: torch.Tensor, mask: torch.Tensor,
                  label: torch.Tensor) -> torch.Tensor:
        tagging = self.s.tagging
        if name == "contribution":
            return self.contribution(ids, mask, label)
        out = self.s._outputs(ids, mask, maps=name != "alpha" or tagging)
        if name == "alpha" and not tagging:
            return out["attention"]
        maps = out["layer_attention"]  # [B,L,H,T,T]
        reader = _rows_of(answers, out["attention"], tagging).unsqueeze(1)  # [B,1,T]
        if name == "alpha":      # tagger: the attention the entity's tokens pay, over layers and heads
            view = maps.mean(dim=(1, 2))
        elif name == "last_layer":
            view = maps[:, -1].mean(1)
        else:
            view = _rollout(maps, mask)
        return torch.bmm(reader, view).squeeze(1)

    def contribution(self, ids: torch.Tensor, mask: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """The token's share of ŷ's logit margin over the mean of the other labels, from the model's
        `contribution` output [B,T,C] (α_i W_out g(q, v_i)), as the server's options.contributions
        returns it: contribution[:, i, ŷ] − mean of contribution[:, i, c ≠ ŷ]."""
        share = self.s._outputs(ids, mask, maps=False)["contribution"]
        c = share.size(2)
        own = share.gather(2, label.view(-1, 1, 1).expand(-1, share.size(1), 1)).squeeze(2)  # [B,T]
        return own - (share.sum(2) - own) / max(c - 1, 1)

    def gradients(self, name: str, ids: torch.Tensor, mask: torch.Tensor, label: torch.Tensor, span: torch.Tensor,
                  tags: torch.Tensor) -> torch.Tensor:
        from captum.attr import LayerGradientXActivation, LayerIntegratedGradients
        layer = token_embedding(self.s.model)
        forward = lambda i, m, lab, sp, tg: self.s.score(i, m, lab, sp, tg, eager=True)  # noqa: E731
        extra = (mask, label, span, tags)
        with torch.enable_grad():
            if name == "grad_input":
                attr = LayerGradientXActivation(forward, layer).attribute(ids, additional_forward_args=extra)
            else:
                attr = LayerIntegratedGradients(forward, layer).attribute(
                    ids, baselines=torch.full_like(ids, PAD), additional_forward_args=extra, n_steps=self.ig_steps,
                    internal_batch_size=max(1, ids.size(0)))
        return attr.sum(-1) * mask.to(attr.dtype)

    def occlusion(self, answers: Sequence[Answer]) -> List[np.ndarray]:
        """p(x) − p(x ∖ i) for each candidate i of each answer, as the server's occlusion lane
        computes it: each text once and then once without each of its n tokens (a text of one token
        has no variants and scores 0), every answer of the text read from those same passes."""
        texts: Dict[int, List[int]] = {}
        for r, a in enumerate(answers):
            texts.setdefault(a.text, []).append(r)
        rows: List[List[int]] = []
        first: Dict[int, int] = {}
        for text, members in texts.items():
            ids = answers[members[0]].ids
            first[text] = len(rows)
            rows.append(list(ids))
            if len(ids) >= 2:
                rows.extend(self.s.variant(Answer(text, ids), [i])[0] for i in range(len(ids)))
        tables = self.s.tables(rows)
        out = []
        for a in answers:
            at = first[a.text]
            scores = np.zeros(len(a.ids))
            if len(a.ids) >= 2:
                full = self.s.read(tables[at], a, a.span)
                for i in a.candidates:
                    shift = 1 if self.s.removal == "delete" and i < a.span[0] else 0
                    scores[i] = full - self.s.read(tables[at + 1 + i], a, (a.span[0] - shift, a.span[1] - shift))
            out.append(scores)
        return out


def ordering(a: Answer, scores: np.ndarray) -> List[int]:
    """Candidates from most to least important; ties keep text order."""
    cand = a.candidates
    return [cand[j] for j in np.argsort(-scores[cand], kind="stable")]


def top_count(k: int, n: int) -> int:
    return min(n, max(1, math.ceil(k * n / 100)))


def curves(scorer: Scorer, answers: Sequence[Answer], full: np.ndarray,
           orders: Sequence[List[int]]) -> Tuple[np.ndarray, np.ndarray]:
    """Comprehensiveness and sufficiency [answers, KS] of one ordering per answer."""
    items = []
    for a, order in zip(answers, orders):
        cand = set(order)
        for k in KS:
            top = order[:top_count(k, len(order))]
            items.append((a, top))
            items.append((a, sorted(cand - set(top))))
    p = scorer.probs(items).reshape(len(answers), len(KS), 2)
    return full[:, None] - p[:, :, 0], full[:, None] - p[:, :, 1]


# -- statistics -------------------------------------------------------------------------------------
def bootstrap_mean(values: np.ndarray, clusters: np.ndarray, rng: np.random.Generator,
                   rounds: int = 1000) -> Tuple[float, float, float]:
    """Mean and 95 % percentile interval, resampling texts (clusters) with replacement."""
    ids, inv = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inv, weights=values, minlength=len(ids))
    counts = np.bincount(inv, minlength=len(ids)).astype(float)
    draws = rng.multinomial(len(ids), np.full(len(ids), 1.0 / len(ids)), size=rounds)
    means = (draws @ sums) / np.maximum(draws @ counts, 1.0)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired_vs(values: np.ndarray, base: np.ndarray, clusters: np.ndarray,
              rng: np.random.Generator) -> Dict[str, float]:
    """The mean difference with its bootstrap interval, and Wilcoxon's signed-rank p over texts
    (answers of one text averaged first, so the test's units are independent)."""
    from scipy.stats import wilcoxon
    d = values - base
    mean, lo, hi = bootstrap_mean(d, clusters, rng)
    _, inv = np.unique(clusters, return_inverse=True)
    per_text = np.bincount(inv, weights=d) / np.bincount(inv)
    p = float(wilcoxon(per_text).pvalue) if np.any(per_text != 0) and len(per_text) > 1 else 1.0
    return {"diff": mean, "ci": [lo, hi], "wilcoxon_p": p}


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr
    if len(x) < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).statistic)


# -- the evaluation ---------------------------------------------------------------------------------
@dataclass
class Options:
    methods: Sequence[str] = ()
    removal: str = "delete"
    seed: int = 1
    ig_steps: int = 20
    max_answers: int = 0          # 0: every answer of the split
    loo_answers: int = 0          # occlusion (and ρ) on the first N answers in a seeded order; 0: all
    chunk: int = 32
    progress: bool = True
    cost_texts: int = 32          # the costs: measured on this many texts' answers (0: not measured)


Extra = Dict[str, Callable[[Sequence[Answer]], List[np.ndarray]]]


def answers_of(scorer: Scorer, manifest: Dict[str, object], encoded: Sequence[List[int]]) -> List[Answer]:
    """The answers the model gives on the split: one per text (classifier) or per entity (tagger)."""
    out: List[Answer] = []
    batch = 64
    with torch.no_grad():
        for start in range(0, len(encoded), batch):
            rows = [Answer(start + j, ids) for j, ids in enumerate(encoded[start:start + batch]) if ids]
            if not rows:
                continue
            ids, mask, *_ = scorer.batch(rows)
            if not scorer.tagging:
                for a, y in zip(rows, scorer.model(ids, mask)["logits"].argmax(-1).tolist()):
                    a.label = int(y)
                    out.append(a)
                continue
            tags = scorer.model(ids, mask)["tags"]
            names = manifest["tags"]
            for a, row in zip(rows, tags.tolist()):
                seq = row[:len(a.ids)]
                for s, e, _ in sorted(chunks([names[t] for t in seq])):  # type: ignore[index]
                    if e - s < len(a.ids):  # an entity that is the whole text has nothing around it
                        out.append(Answer(a.text, a.ids, span=(s, e), tags=seq[s:e]))
    return out


@dataclass
class Tally:
    """Per method, what each answer measured: its comprehensiveness and sufficiency curves [KS] (and
    those of the reversed ordering, for the normalisation's bounds), and ρ with leave-one-out; each
    keyed by the answer's position in the evaluated list."""
    comp: Dict[str, List[Tuple[int, np.ndarray]]]
    suff: Dict[str, List[Tuple[int, np.ndarray]]]
    rcomp: Dict[str, List[Tuple[int, np.ndarray]]]
    rsuff: Dict[str, List[Tuple[int, np.ndarray]]]
    rho: Dict[str, List[Tuple[int, float]]]

    @classmethod
    def of(cls, methods: Sequence[str]) -> "Tally":
        empty = lambda: {m: [] for m in methods}  # noqa: E731
        return cls(empty(), empty(), empty(), empty(), {m: [] for m in methods if m != REFERENCE})


def _rank_chunk(engine: Methods, methods: Sequence[str], extra: Optional[Extra], chunk: Sequence[Answer],
                in_loo: Sequence[bool], seconds: Dict[str, float]) -> Dict[str, List[Optional[np.ndarray]]]:
    """Every method's token scores for each answer of the chunk (None where the reference skips it)."""
    scores: Dict[str, List[Optional[np.ndarray]]] = {}
    for m in methods:
        t = time.time()
        if m == REFERENCE:
            picked = [j for j, keep in enumerate(in_loo) if keep]
            row: List[Optional[np.ndarray]] = [None] * len(chunk)
            for j, s in zip(picked, engine.run(m, [chunk[j] for j in picked])):
                row[j] = s
            scores[m] = row
        elif extra and m in extra:
            scores[m] = list(extra[m](chunk))
        else:
            scores[m] = list(engine.run(m, chunk))
        seconds[m] += time.time() - t
    return scores


def _measure_chunk(scorer: Scorer, chunk: Sequence[Answer], start: int,
                   scores: Dict[str, List[Optional[np.ndarray]]], tally: Tally) -> None:
    """Each method's curves (and its reverse's) and ρ with leave-one-out, for the chunk's answers."""
    full = scorer.probs([(a, []) for a in chunk])
    loo = scores.get(REFERENCE, [None] * len(chunk))
    for m, per_answer in scores.items():
        rows = [j for j in range(len(chunk)) if per_answer[j] is not None]
        sub = [chunk[j] for j in rows]
        orders = [ordering(chunk[j], per_answer[j]) for j in rows]  # type: ignore[arg-type]
        c, s = curves(scorer, sub, full[rows], orders)
        rc, rs = curves(scorer, sub, full[rows], [o[::-1] for o in orders])
        for j, ci, si, rci, rsi in zip(rows, c, s, rc, rs):
            tally.comp[m].append((start + j, ci))
            tally.suff[m].append((start + j, si))
            tally.rcomp[m].append((start + j, rci))
            tally.rsuff[m].append((start + j, rsi))
        if m in tally.rho:
            for j in rows:
                ref = loo[j]
                if ref is not None:
                    cand = chunk[j].candidates
                    tally.rho[m].append((start + j, spearman(per_answer[j][cand], ref[cand])))  # type: ignore[index]


def evaluate(model: nn.Module, config: ModelConfig, manifest: Dict[str, object], encoded: Sequence[List[int]],
             options: Options, extra: Optional[Extra] = None,
             served: Optional[torch.jit.ScriptModule] = None) -> Dict[str, object]:
    """Runs every method over the answers the model gives on `encoded` and returns the report;
    `served`, the exported model, answers wherever the server would (Scorer)."""
    t0 = time.time()
    scorer = Scorer(model, config, options.removal, served=served)
    methods = list(options.methods) + list(extra or {})
    answers = answers_of(scorer, manifest, encoded)
    rng = np.random.default_rng(options.seed)
    if options.max_answers and len(answers) > options.max_answers:
        keep = sorted(rng.choice(len(answers), options.max_answers, replace=False))
        answers = [answers[i] for i in keep]
    loo_n = len(answers) if not options.loo_answers else min(options.loo_answers, len(answers))
    loo_set = set(rng.permutation(len(answers))[:loo_n].tolist())
    engine = Methods(scorer, options.ig_steps, options.seed)
    seconds = {m: 0.0 for m in methods}
    tally = Tally.of(methods)
    for start in tqdm(range(0, len(answers), options.chunk), desc="faithfulness", disable=not options.progress):
        chunk = answers[start:start + options.chunk]
        in_loo = [start + j in loo_set for j in range(len(chunk))]
        _measure_chunk(scorer, chunk, start, _rank_chunk(engine, methods, extra, chunk, in_loo, seconds), tally)
    report = summarise(answers, methods, tally, options, rng)
    if options.cost_texts:
        for m, cost in method_costs(engine, methods, extra, answers, options.cost_texts).items():
            if m in report["methods"]:  # type: ignore[operator]
                report["methods"][m]["cost"] = cost  # type: ignore[index]
        report["cost_machine"] = machine()
    report["padding_check"] = padding_check(scorer, answers[:64])
    report["seconds"] = {"total": round(time.time() - t0, 1), **{m: round(v, 1) for m, v in seconds.items()}}
    return report


# -- the cost -----------------------------------------------------------------------------------------
def machine() -> str:
    """Where costs were measured: the architecture, the processor and torch's thread count."""
    name = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{platform.machine()}{', ' + name if name else ''}, {torch.get_num_threads()} torch threads"


def extra_forwards(method: str, texts: Sequence[Sequence[Answer]], ig_steps: int) -> float:
    """Forward passes per text beyond the answer's own: each gradient method's passes also run
    backwards, once per answer; occlusion runs each text again without each of its n ≥ 2 tokens."""
    per_text = {"grad_input": lambda g: len(g), "integrated_gradients": lambda g: ig_steps * len(g),
                "occlusion": lambda g: len(g[0].ids) if len(g[0].ids) >= 2 else 0}.get(method, lambda g: 0)
    return float(np.mean([per_text(g) for g in texts]))


def method_costs(engine: "Methods", methods: Sequence[str], extra: Optional[Extra], answers: Sequence[Answer],
                 n_texts: int) -> Dict[str, Dict[str, float]]:
    """Each method's cost on the first `n_texts` texts that have answers: wall ms per text computing
    its token scores for every answer of one text at a time, and of 32 texts at a time (each timed
    after a first, untimed round of the same calls: TorchScript specialises its graph on the first
    calls of each shape), and its extra forwards per text."""
    texts: Dict[int, List[Answer]] = {}
    for a in answers:
        if a.text in texts or len(texts) < n_texts:
            texts.setdefault(a.text, []).append(a)
    groups = list(texts.values())
    if not groups:
        return {}
    out = {}
    for m in methods:
        compute = extra[m] if extra and m in extra else (lambda batch, m=m: engine.run(m, batch))
        alone = batched = 0.0
        for _ in range(2):  # the second round is the one kept
            t = time.perf_counter()
            for g in groups:
                compute(g)
            alone = (time.perf_counter() - t) / len(groups)
            t = time.perf_counter()
            for start in range(0, len(groups), 32):
                compute([a for g in groups[start:start + 32] for a in g])
            batched = (time.perf_counter() - t) / len(groups)
        out[m] = {"ms_per_text_batch_1": round(alone * 1e3, 3), "ms_per_text_batch_32": round(batched * 1e3, 3),
                  "extra_forwards_per_text": round(extra_forwards(m, groups, engine.ig_steps), 2)}
    return out


Bounds = Tuple[Dict[int, float], Dict[int, float]]


def _bounds(methods: Sequence[str], tables: Sequence[Dict[str, List[Tuple[int, np.ndarray]]]]) -> Bounds:
    """Per answer, the lowest and highest AOPC over every ordering evaluated for it."""
    lo: Dict[int, float] = {}
    hi: Dict[int, float] = {}
    for m in methods:
        for table in tables:
            for i, curve in table[m]:
                v = float(curve.mean())
                lo[i] = min(lo.get(i, v), v)
                hi[i] = max(hi.get(i, v), v)
    return lo, hi


def _normalised(values: Sequence[Tuple[int, np.ndarray]], bounds: Bounds, lower_better: bool) -> np.ndarray:
    lo, hi = bounds
    out = []
    for i, curve in values:
        span = hi[i] - lo[i]
        x = 0.5 if span <= 1e-12 else (float(curve.mean()) - lo[i]) / span
        out.append(1.0 - x if lower_better else x)
    return np.array(out)


def _method_entry(m: str, tally: Tally, clusters_all: np.ndarray, bounds: Tuple[Bounds, Bounds],
                  base_c: Dict[int, float], rng: np.random.Generator) -> Dict[str, object]:
    idx = np.array([i for i, _ in tally.comp[m]])
    cl = clusters_all[idx]
    c = np.stack([v for _, v in tally.comp[m]])
    s = np.stack([v for _, v in tally.suff[m]])
    entry: Dict[str, object] = {"name": NAMES.get(m, m), "answers": int(len(idx)), "texts": int(len(set(cl)))}
    for key, curve in (("comprehensiveness", c), ("sufficiency", s)):
        mean, lo, hi = bootstrap_mean(curve.mean(1), cl, rng)
        entry[key] = {"aopc": mean, "ci": [lo, hi], "by_k": {str(k): float(curve[:, j].mean()) for j, k in enumerate(KS)}}
    for key, values in (("normalised_comprehensiveness", _normalised(tally.comp[m], bounds[0], False)),
                        ("normalised_sufficiency", _normalised(tally.suff[m], bounds[1], True))):
        mean, lo, hi = bootstrap_mean(values, cl, rng)
        entry[key] = {"aopc": mean, "ci": [lo, hi]}
    if tally.rho.get(m):
        r = np.array([v for _, v in tally.rho[m]])
        rcl = clusters_all[np.array([i for i, _ in tally.rho[m]])]
        ok = ~np.isnan(r)
        if ok.any():
            mean, lo, hi = bootstrap_mean(r[ok], rcl[ok], rng)
            entry["loo_spearman"] = {"mean": mean, "ci": [lo, hi], "answers": int(ok.sum())}
    both = [k for k, i in enumerate(idx) if int(i) in base_c] if m != "random" else []
    if both:
        base = np.array([base_c[int(idx[k])] for k in both])
        entry["vs_random"] = paired_vs(c.mean(1)[both], base, cl[both], rng)
    return entry


def summarise(answers: Sequence[Answer], methods: Sequence[str], tally: Tally, options: Options,
              rng: np.random.Generator) -> Dict[str, object]:
    """Per method: AOPCs with intervals, normalised AOPCs, ρ with leave-one-out, and the paired
    difference from random."""
    clusters_all = np.array([a.text for a in answers])
    bounds = (_bounds(methods, (tally.comp, tally.rcomp)), _bounds(methods, (tally.suff, tally.rsuff)))
    base_c = {i: float(c.mean()) for i, c in tally.comp.get("random", [])}
    out = {m: _method_entry(m, tally, clusters_all, bounds, base_c, rng) for m in methods if tally.comp[m]}
    return {"methods": out, "answers": len(answers), "texts": len(set(clusters_all.tolist())),
            "ks": list(KS), "removal": options.removal, "seed": options.seed, "ig_steps": options.ig_steps,
            "normalised": "per answer, between the lowest and highest AOPC of the orderings evaluated for it "
                          "(each method's and its reverse)"}


def padding_check(scorer: Scorer, answers: Sequence[Answer]) -> Dict[str, object]:
    """Deleting a text's last ⌈20 %⌉ candidates must equal masking them off as padding."""
    items = []
    for a in answers:
        n = len(a.ids)
        tail = [i for i in range(n - top_count(20, n), n) if i in set(a.candidates)]
        if tail and tail[-1] == n - 1 and tail == list(range(tail[0], n)):
            items.append((a, tail))
    if not items:
        return {"answers": 0}
    saved = scorer.removal
    scorer.removal = "delete"
    try:
        deleted = scorer.probs(items)
    finally:
        scorer.removal = saved
    masked = scorer.probs(items, masked_suffix=True)
    return {"answers": len(items), "max_abs_diff": float(np.abs(deleted - masked).max())}


# -- the command ----------------------------------------------------------------------------------
def load_split(path: str, manifest: Dict[str, object], join: str) -> List[Example]:
    """The split's examples; refused if it has labels (or entity types) the model does not know."""
    task = manifest["task"]
    examples = read_classification(path) if task == "classification" else read_conll(path, join=join)
    if task == "classification":
        known = set(manifest["labels"])  # type: ignore[arg-type]
        unknown = sorted({e.label for e in examples} - known)
        what = "labels"
    else:
        known = set(manifest["entity_types"])  # type: ignore[arg-type]
        unknown = sorted({s[2] for e in examples for s in e.spans} - known)
        what = "entity types"
    if unknown:
        raise SystemExit(f"{path}: {what} the model {manifest['name']} does not know: {', '.join(unknown)} "
                         f"(it knows {', '.join(sorted(known))})")
    return examples


def check_methods(asked: Sequence[str], supported: Sequence[str], config: ModelConfig) -> List[str]:
    if not asked:
        if "alpha" not in supported:
            raise SystemExit(f"{config.display_name()} returns no attention, so there is no α to measure; "
                             f"name the methods it supports with --methods: {' '.join(supported)}")
        return list(supported)
    missing = [m for m in asked if m not in supported]
    if missing:
        raise SystemExit(f"{config.display_name()} does not support {', '.join(missing)}; "
                         f"it supports: {' '.join(supported)}")
    return list(asked)


def _manifest_of(artifact_path: str) -> Dict[str, object]:
    """The manifest inside a model.pt (a zip: <archive>/extra/manifest.json), read without loading the model."""
    with zipfile.ZipFile(artifact_path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/extra/manifest.json")]
        return json.loads(z.read(name))


def run_subwords(artifact_path: str, split: str, options: Options, join: str) -> Dict[str, object]:
    """run() for an imported sub-word model, measured word by word (qvi.hf_faithfulness)."""
    from qvi import hf_faithfulness
    examples = load_split(split, _manifest_of(artifact_path), join)
    model, config, manifest, encoded = hf_faithfulness.word_level(artifact_path, [e.text for e in examples])
    outputs = manifest["outputs"]
    supported = [m for m in hf_faithfulness.METHODS if m == "random" or m == "occlusion" or
                 ("layer_attention" in outputs and m in ("alpha", "last_layer", "rollout")) or  # type: ignore
                 (m == "contribution" and "contribution" in outputs)]  # type: ignore[operator]
    options.methods = check_methods(options.methods, supported, config)  # type: ignore[arg-type]
    report = evaluate(model, config, manifest, encoded, options)  # type: ignore[arg-type]
    report.update({"model": manifest["name"], "architecture": config.display_name(), "split": split,
                   "task": config.task, "torch_threads": torch.get_num_threads(), "unit": "word",
                   "target": "p(predicted label)" if config.task == "classification"
                   else "mean softmax probability of the predicted entity's tags (its first sub-words')",
                   "seed_of_model": None})
    return report


def run(artifact_path: str, split: str, options: Options, join: str = " ") -> Dict[str, object]:
    if _manifest_of(artifact_path).get("tokenizer", {}).get("level") == "subword":  # type: ignore[union-attr]
        return run_subwords(artifact_path, split, options, join)
    module, manifest, vocab = artifact.load(artifact_path)
    config = ModelConfig(**manifest["architecture"]["config"])  # type: ignore[index]
    model = build_model(config).eval()
    model.load_state_dict(module.state_dict())
    options.methods = check_methods(options.methods, supported_methods(config, list(manifest["outputs"])),  # type: ignore
                                    config)
    tok = config_from_json(manifest["tokenizer"])  # type: ignore[arg-type]
    encoded = [encode(e.text, tok, vocab).ids for e in load_split(split, manifest, join)]
    report = evaluate(model, config, manifest, encoded, options, served=module)
    card = manifest.get("model_card") or {}
    report.update({"model": manifest["name"], "architecture": config.display_name(), "split": split,
                   "task": config.task, "torch_threads": torch.get_num_threads(),
                   "target": "p(predicted label)" if config.task == "classification"
                   else "mean CRF marginal of the predicted entity's tags",
                   "seed_of_model": card.get("seed") if isinstance(card, dict) else None})
    return report


def card_summary(report: Dict[str, object]) -> Dict[str, object]:
    """What a model card keeps of a report (the server's GetModel reads it: Faithfulness in
    proto/qvi/serving/v1/inference.proto): per method, in METHODS order, each figure as
    {mean, low, high}."""
    def est(mean: float, ci: Sequence[float]) -> Dict[str, float]:
        return {"mean": round(float(mean), 4), "low": round(float(ci[0]), 4), "high": round(float(ci[1]), 4)}

    methods = []
    for m, e in report["methods"].items():  # type: ignore[union-attr]
        keep: Dict[str, object] = {"method": m, "name": e["name"]}
        for k in ("comprehensiveness", "sufficiency", "normalised_comprehensiveness"):
            keep[k] = est(e[k]["aopc"], e[k]["ci"])
        if "loo_spearman" in e:
            keep["loo_spearman"] = est(e["loo_spearman"]["mean"], e["loo_spearman"]["ci"])
        if "vs_random" in e:
            keep["vs_random"] = dict(est(e["vs_random"]["diff"], e["vs_random"]["ci"]),
                                     p=float(f"{e['vs_random']['wilcoxon_p']:.3g}"))
        if "cost" in e:
            keep["cost"] = e["cost"]
        methods.append(keep)
    out = {"split": report["split"], "answers": report["answers"], "texts": report["texts"], "ks": report["ks"],
           "removal": report["removal"], "target": report["target"], "methods": methods}
    if "cost_machine" in report:
        out["cost_machine"] = report["cost_machine"]
    return out


def cmd_faithfulness(args: argparse.Namespace) -> None:
    torch.set_num_threads(max(1, args.threads))
    options = Options(methods=args.methods, removal=args.removal, seed=args.seed, ig_steps=args.ig_steps,
                      max_answers=args.max_answers, loo_answers=args.loo_answers, progress=not args.quiet,
                      cost_texts=args.cost_texts)
    report = run(args.artifact, args.test, options, args.conll_join)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(markdown(report))


def _p(p: float) -> str:
    return f"{p:.1g}" if p > 0 else "< 1e-300"  # below the smallest double Wilcoxon's normal tail reaches


def markdown(report: Dict[str, object]) -> str:
    lines = [f"{report.get('model', '')} ({report.get('architecture', '')}), {report['answers']} answers in "
             f"{report['texts']} texts, removal {report['removal']}",
             "",
             "| method | comprehensiveness AOPC ↑ [95% CI] | sufficiency AOPC ↓ | normalised comp. ↑ | "
             "ρ with leave-one-out | Δ comp. vs random (p) |",
             "|---|---|---|---|---|---|"]
    for m, e in report["methods"].items():  # type: ignore[union-attr]
        c, s, n = e["comprehensiveness"], e["sufficiency"], e["normalised_comprehensiveness"]
        rho = f"{e['loo_spearman']['mean']:.2f}" if "loo_spearman" in e else "—"
        vs = f"{e['vs_random']['diff']:+.3f} ({_p(e['vs_random']['wilcoxon_p'])})" if "vs_random" in e else "—"
        lines.append(f"| {e['name']} | {c['aopc']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}] | {s['aopc']:.3f} | "
                     f"{n['aopc']:.2f} | {rho} | {vs} |")
    return "\n".join(lines)


def side_by_side(reports: Sequence[Dict[str, object]]) -> str:
    """Comprehensiveness AOPC [95 % CI] and normalised comprehensiveness of each method, one column
    per report (e.g. a QVI model and its twin without QVI on the same split)."""
    head = " | ".join(f"{r.get('architecture', r.get('model', ''))}" for r in reports)
    lines = [f"| method | {head} |", "|---|" + "---|" * len(reports)]
    methods: List[str] = []
    for r in reports:
        methods += [m for m in r["methods"] if m not in methods]  # type: ignore[union-attr]
    for m in methods:
        cells = []
        for r in reports:
            e = r["methods"].get(m)  # type: ignore[union-attr]
            if e is None:
                cells.append("—")
                continue
            c, n = e["comprehensiveness"], e["normalised_comprehensiveness"]
            cells.append(f"{c['aopc']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}]; {n['aopc']:.2f}")
        lines.append(f"| {NAMES.get(m, m)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_table(args: argparse.Namespace) -> None:
    reports = []
    for path in args.reports:
        with open(path) as f:
            reports.append(json.load(f))
    if args.side_by_side:
        print(side_by_side(reports))
        return
    print("\n\n".join(markdown(r) for r in reports))


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("faithfulness", help="how faithful α, β and their peers are on a test split (ERASER)")
    p.add_argument("--artifact", required=True, help="an exported model.pt")
    p.add_argument("--test", required=True, help="the split: TSV for classifiers, CoNLL for taggers")
    p.add_argument("--out", required=True, help="the JSON report to write")
    p.add_argument("--methods", nargs="*", default=[], choices=METHODS,
                   help="default: every method the model supports")
    p.add_argument("--removal", choices=REMOVALS, default="delete",
                   help="delete the removed tokens (the text closes up) or put [PAD] in their place")
    p.add_argument("--seed", type=int, default=1, help="random ranking, subsamples and bootstrap")
    p.add_argument("--ig-steps", type=int, default=20, help="integrated gradients' Riemann steps")
    p.add_argument("--max-answers", type=int, default=0, help="a seeded subsample of the answers (0: all)")
    p.add_argument("--loo-answers", type=int, default=0,
                   help="occlusion, the leave-one-out reference (and ρ), on this many answers of a seeded "
                        "subsample (0: all)")
    p.add_argument("--cost-texts", type=int, default=32,
                   help="measure each method's cost on this many texts' answers (0: not measured)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--conll-join", default=" ")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_faithfulness)
    p = sub.add_parser("faithfulness-table", help="print faithfulness reports as markdown tables")
    p.add_argument("reports", nargs="+")
    p.add_argument("--side-by-side", action="store_true",
                   help="one column per report: comprehensiveness AOPC [CI]; normalised")
    p.set_defaults(func=cmd_table)
