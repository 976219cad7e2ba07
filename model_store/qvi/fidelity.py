"""The fidelity gate of a reduced-precision package: does a bfloat16 .pt2 answer as its float32 model?

A CPU package compiled in bfloat16 (qvi/pt2.py, CPU_VARIANTS) is published only if, on a test split,
against the float32 eager model:

* classifiers: the labels agree on at least 99.5 % of the texts;
* taggers: entity micro F1 (against the gold tags) within 0.3 points of the float32 model's, the tags
  decoded as the server decodes them (the float32 CRF over the package's emissions);
* α and β (`attention`, `gates`): within 0.02 absolute on every real token of every text.

The measurement goes into the model card (`cpu_packages`), kept or not, so that what a served
variant costs in fidelity is visible in GetModel.
"""
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from qvi import pt2
from qvi.data import Encoded, batches
from qvi.metrics import accuracy, entity_prf
from qvi.models import ModelConfig

LIMITS = {"label_agreement": 0.995, "f1_points": 0.3, "explanations_abs": 0.02}
EXPLANATIONS = ("attention", "gates")


def _labels(model: nn.Module, out: Dict[str, torch.Tensor], mask: torch.Tensor) -> List[List[int]]:
    if "logits" in out:
        return [[int(p)] for p in out["logits"].argmax(-1)]
    crf = getattr(model, "crf", None)  # the zoo's TransformerCRF, or a fine-tuned encoder's (qvi.finetune)
    assert crf is not None, "a tagger package answers with emissions (pt2.py)"
    tags = crf.decode(out["emissions"].float(), mask)
    return [[int(t) for t in row[: int(m.sum())]] for row, m in zip(tags, mask)]


def _collect(package: str, model: nn.Module, config: ModelConfig, data: Sequence[Encoded],
             batch_size: int) -> Tuple[List[List[int]], List[List[int]], List[List[int]], Dict[str, float]]:
    """Runs the float32 model and the package over `data`: (float32 labels, package labels, gold
    labels, largest |difference| of each explanation over real tokens)."""
    run = pt2.load_methods(package)["model"]
    reference = dict(pt2.methods(model.eval()))["model"]
    tagging = config.task == "tagging"
    want: List[List[int]] = []
    got: List[List[int]] = []
    gold: List[List[int]] = []
    worst = {name: 0.0 for name in EXPLANATIONS}
    with torch.no_grad():
        for ids, mask, targets in batches(data, batch_size, tagging):
            if ids.size(1) < pt2.MIN_TOKENS:  # the package's shapes start there; padding changes nothing
                pad = pt2.MIN_TOKENS - ids.size(1)
                ids = nn.functional.pad(ids, (0, pad))
                mask = nn.functional.pad(mask, (0, pad))
            a, b = reference(ids, mask), run(ids, mask)  # type: ignore[operator]
            want += _labels(model, a, mask)
            got += _labels(model, b, mask)
            gold += [[int(t)] for t in targets] if not tagging else \
                [[int(t) for t in row[: int(m.sum())]] for row, m in zip(targets, mask)]
            for name in EXPLANATIONS:
                if name in a:
                    diff = (a[name].float() - b[name].float()).abs()[mask]
                    worst[name] = max(worst[name], float(diff.max()) if diff.numel() else 0.0)
    return want, got, gold, worst


def measure(package: str, model: nn.Module, config: ModelConfig, data: Sequence[Encoded],
            labels: Sequence[str], batch_size: int = 64) -> Dict[str, object]:
    """Runs `package` and the float32 `model` on `data` and returns what the gate looks at, with
    `passed` and, when it failed, `failed` (the limits it broke)."""
    if not data:
        raise ValueError("the fidelity gate needs a non-empty test split")
    want, got, gold, worst = _collect(package, model, config, data, batch_size)
    agreement = sum(w == g for w, g in zip(want, got)) / len(want)
    report: Dict[str, object] = {"texts": len(want), "label_agreement": round(agreement, 5),
                                 **{f"max_abs_{k}": round(v, 5) for k, v in worst.items()}, "limits": LIMITS}
    failed = []
    if config.task == "tagging":
        f1 = [100 * entity_prf([[labels[t] for t in s] for s in gold], [[labels[t] for t in s] for s in p])["f1"]
              for p in (want, got)]
        report.update({"f1_float32": round(f1[0], 3), "f1": round(f1[1], 3)})
        if abs(f1[1] - f1[0]) > LIMITS["f1_points"]:
            failed.append(f"entity F1 {f1[1]:.2f} against {f1[0]:.2f} in float32 (limit {LIMITS['f1_points']} points)")
    else:
        acc = [accuracy([g[0] for g in gold], [p[0] for p in preds]) for preds in (want, got)]
        report.update({"accuracy_float32": round(acc[0], 5), "accuracy": round(acc[1], 5)})
        if agreement < LIMITS["label_agreement"]:
            failed.append(f"labels agree on {100 * agreement:.2f} % of texts (limit {100 * LIMITS['label_agreement']} %)")
    for name, value in worst.items():
        if value > LIMITS["explanations_abs"]:
            failed.append(f"{name} differs by up to {value:.4f} (limit {LIMITS['explanations_abs']})")
    report["passed"] = not failed
    if failed:
        report["failed"] = failed
    return report
