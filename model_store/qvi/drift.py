"""The drift reference a card records: how the model's inputs and answers look on its test split, so that a
server can say when live traffic stops looking like it (docs/observability.md, "Drift").

    python -m qvi drift-reference --artifact store/sentiment/1/model.pt --test TEST [--write]

What is recorded (model_card.drift_reference), each measured as the server measures it on a live text:

  labels      a classifier's answers by their top label; a tagger's entities by their type (its share of the
              entities found). The server compares the live mix with it by the population stability index.
  length      the tokens the model reads of each text (after truncation to max_tokens), as ten bins with
              the split's deciles for edges: a text of length x falls in bin `number of edges <= x`.
  unknown     the share of those tokens that the vocabulary does not know ([UNK]); a sub-word model's: of the
              words it reads (its pre-tokenizer's pieces), the share it does not hold whole (two or more sub-words).
  confidence  the calibrated probability of each answer (the top label's; an entity's: the mean CRF
              marginal of its tags), at the card's temperature, in decile bins as `length`; and the share
              below `below.threshold`.

PSI = Σ (live_i − ref_i) · ln(live_i / ref_i) over the bins, each share floored at 1e-4. By the usual reading
below 0.1 nothing moved, 0.1-0.25 something did, above 0.25 the traffic is not the split's.

A zoo model's or a sub-word model's (fine-tuned by `qvi finetune`, or imported): the same figures, its lengths
counting the special tokens it reads.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

DECILES = tuple(i / 10 for i in range(1, 10))
BELOW = 0.9  # the confidence threshold whose share the card records (a round one: what an operator would set)


def quantile_edges(values: Sequence[float]) -> List[float]:
    """The inner edges of decile bins of `values`, ties merged (a split of short texts has fewer bins)."""
    edges = np.unique(np.quantile(np.asarray(values, dtype=float), DECILES))
    return [round(float(e), 6) for e in edges]


def binned(values: Sequence[float], edges: Sequence[float]) -> Dict[str, object]:
    """Each bin's share of `values`: bin b holds the values with exactly b edges at or below them."""
    counts = np.bincount(np.searchsorted(np.asarray(edges), np.asarray(values, dtype=float), side="right"),
                         minlength=len(edges) + 1)
    return {"edges": list(edges), "shares": [round(float(c) / max(1, len(values)), 6) for c in counts]}


def mix(names: Sequence[str], universe: Sequence[str]) -> Dict[str, float]:
    counts = {u: 0 for u in universe}
    for n in names:
        counts[n] += 1
    return {u: round(c / max(1, len(names)), 6) for u, c in counts.items()}


def _zoo(path: str, test: str, join: str):
    """A zoo model's side: (manifest, label or tag names, tokens read per text, vocabulary units and unknown ones,
    classifier logits or tagger outputs)."""
    from qvi import artifact
    from qvi import calibration as cal
    from qvi.tokenizer import UNK_ID
    module, manifest, vocab = artifact.load(path)
    encoded, names = cal._encoded(test, manifest, vocab, join)
    lengths = [len(e.ids) for e in encoded]
    unknown = sum(1 for e in encoded for i in e.ids if i % len(vocab) == UNK_ID)  # a cased id: + size x case
    if manifest["task"] == "classification":
        outputs = cal.classifier_logits(module, manifest, vocab, test, join)[0]
    else:
        outputs = cal.tagger_outputs(module, manifest, vocab, test, join)
    return manifest, names, lengths, sum(lengths), unknown, outputs


def _subword(path: str, test: str, join: str):
    """A sub-word model's side, as _zoo's: its units are the words it reads (its pre-tokenizer's pieces), the unknown
    ones those it does not hold whole (two or more sub-words), as the server counts them."""
    from tokenizers import Tokenizer
    from qvi import artifact
    from qvi import calibration as cal
    extra = {artifact.MANIFEST: "", artifact.TOKENIZER: ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra).eval()
    manifest = json.loads(extra[artifact.MANIFEST])
    text = extra[artifact.TOKENIZER]
    tokenizer_json = text if isinstance(text, str) else text.decode()
    task = str(manifest["task"])
    names = manifest["labels"] if task == "classification" else manifest["tags"]
    max_tokens = int(manifest["tokenizer"]["max_tokens"])
    data = cal.subword_split(tokenizer_json, test, task, names, max_tokens, join)
    tok = Tokenizer.from_str(tokenizer_json)
    tok.no_padding()
    tok.enable_truncation(max_tokens)
    units = unknown = 0
    for enc in tok.encode_batch([e.text for e in data.examples]):
        pieces: Dict[int, int] = {}
        for w in enc.word_ids:
            if w is not None:
                pieces[w] = pieces.get(w, 0) + 1
        units += len(pieces)
        unknown += sum(1 for n in pieces.values() if n > 1)
    forward = module.forward_without_maps
    if task == "classification":
        outputs = cal.subword_logits(forward, data)[0]
    else:
        outputs = cal.subword_tagger_outputs(forward, data, names, cal.crf_scores(getattr(module, "crf", None)))
    return manifest, names, [len(item.ids) for item in data.items], units, unknown, outputs


def reference(artifact_path: str, test: str, join: str = " ", root: Optional[str] = None,
              temperature: Optional[float] = None) -> Dict[str, object]:
    """model_card.drift_reference of an exported model.pt (the zoo's, or a sub-word model's) over its test split
    (`root`: the folder the split is named from on the card), its confidences at `temperature` (None: its card's
    calibration's, else 1)."""
    from qvi import calibration as cal
    from qvi.metrics import chunks
    extra = {"manifest.json": ""}
    torch.jit.load(artifact_path, map_location="cpu", _extra_files=extra)
    subword = json.loads(extra["manifest.json"]).get("tokenizer", {}).get("level") == "subword"
    manifest, names, lengths, units, unknown, outputs = (_subword if subword else _zoo)(artifact_path, test, join)
    if temperature is None:
        card = manifest.get("model_card", {})
        temperature = float(card.get("calibration", {}).get("temperature", 1.0))  # type: ignore[union-attr]
    if manifest["task"] == "classification":
        probs = cal.softmax(outputs, temperature)
        confidence = probs.max(axis=1)
        labels = mix([names[int(k)] for k in probs.argmax(axis=1)], names)
    else:
        confidence = outputs.entities(temperature)[0]
        types = [t for _, mask, predicted in outputs.batches for r in range(predicted.shape[0])
                 for _, _, t in sorted(chunks([names[int(k)] for k in predicted[r, :int(mask[r].sum())]]))]
        labels = mix(types, list(manifest["entity_types"]))  # type: ignore[arg-type]
    name = os.path.relpath(os.path.abspath(test), root) if root else os.path.basename(test)
    return {"split": name, "texts": len(lengths), "answers": int(confidence.size), "labels": labels,
            "length": binned(lengths, quantile_edges(lengths)),
            "unknown": round(unknown / max(1, units), 6), "unknown_of": "words" if subword else "tokens",
            "confidence": dict(binned(confidence, quantile_edges(confidence)), temperature=round(temperature, 6)),
            "below": {"threshold": BELOW, "share": round(float((confidence < BELOW).mean()), 6)}}


def cmd_drift_reference(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    ref = reference(args.artifact, args.test, args.conll_join)
    print(json.dumps(ref, indent=1, ensure_ascii=False))
    if args.write:
        from qvi import artifact
        print(artifact.update_card(args.artifact, {"drift_reference": ref}))


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("drift-reference", help="record on a model's card how its inputs and answers look on its "
                                               "test split (the server's drift gauges compare live traffic with it)")
    p.add_argument("--artifact", required=True, help="an exported model.pt (the zoo's, or a sub-word model's)")
    p.add_argument("--test", required=True, help="the test split it was measured on")
    p.add_argument("--conll-join", default=" ", help="how a CoNLL sentence's words are joined into its text")
    p.add_argument("--write", action="store_true", help="put it on the artifact's card (model.pt rewritten)")
    p.set_defaults(func=cmd_drift_reference)
