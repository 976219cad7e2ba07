"""Seeded, deterministic training and evaluation of any architecture in qvi.models."""
import copy
import random
from dataclasses import dataclass, asdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from tqdm import tqdm

from qvi.data import Encoded, batches
from qvi.metrics import accuracy, entity_prf, macro_f1
from qvi.models import ModelConfig, build_model, token_embedding


@dataclass
class TrainOptions:
    epochs: int = 5
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    clip: float = 5.0
    seed: int = 1
    threads: int = 2
    progress: bool = True


def seed_everything(seed: int, threads: int) -> None:
    """Same seed, same thread count, same machine -> the same model, bit for bit."""
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, threads))
    torch.use_deterministic_algorithms(True)


def _loss(model: nn.Module, config: ModelConfig, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = model(ids, mask)
    if config.task == "classification":
        return nn.functional.cross_entropy(out["logits"], targets)
    return model.crf.neg_log_likelihood(out["emissions"], targets, mask)  # type: ignore[union-attr]


@torch.no_grad()
def predict(model: nn.Module, config: ModelConfig, data: Sequence[Encoded], batch_size: int = 64) -> List[List[int]]:
    """Label per text ([label]) for classifiers, tag ids per real token for taggers."""
    model.eval()
    preds: List[List[int]] = []
    for ids, mask, _ in batches(data, batch_size, tagging=config.task == "tagging"):
        out = model(ids, mask)
        if config.task == "classification":
            preds.extend([[int(p)] for p in out["logits"].argmax(-1)])
        else:
            for row, m in zip(out["tags"], mask):
                preds.append([int(t) for t in row[: int(m.sum())]])
    return preds


def evaluate(model: nn.Module, config: ModelConfig, data: Sequence[Encoded], labels: Sequence[str]) -> Dict[str, float]:
    preds = predict(model, config, data)
    if config.task == "classification":
        gold = [e.target[0] for e in data]
        pred = [p[0] for p in preds]
        return {"accuracy": accuracy(gold, pred), "macro_f1": macro_f1(gold, pred, len(labels))}
    gold_tags = [[labels[t] for t in e.target] for e in data]
    pred_tags = [[labels[t] for t in p] for p in preds]
    return entity_prf(gold_tags, pred_tags)


def main_metric(config: ModelConfig) -> str:
    return "accuracy" if config.task == "classification" else "f1"


def train(config: ModelConfig, train_data: Sequence[Encoded], dev_data: Sequence[Encoded],
          labels: Sequence[str], options: TrainOptions,
          embedding: Optional[torch.Tensor] = None) -> Tuple[nn.Module, List[Dict[str, float]]]:
    """Trains with AdamW; keeps the weights of the epoch with the best dev score. `embedding`: the
    word vectors' initial rows [vocab_size, emb_dim] (qvi.vectors), else random.
    Returns (model in eval mode, per-epoch history)."""
    seed_everything(options.seed, options.threads)
    model = build_model(config)
    if embedding is not None:
        with torch.no_grad():
            token_embedding(model).weight.copy_(embedding)
    # fused: the update's square root in torch's own vectorised kernel (IEEE, the same on every CPU); the
    # unfused AdamW takes it from MKL's vector math, whose result depends on the processor (qvi/reproducible.py).
    opt = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=options.weight_decay, fused=True)
    tagging = config.task == "tagging"
    history: List[Dict[str, float]] = []
    best_state: Optional[Dict[str, torch.Tensor]] = None
    best = -1.0
    key = main_metric(config)
    for epoch in range(1, options.epochs + 1):
        model.train()
        total, count = 0.0, 0
        steps = batches(train_data, options.batch_size, tagging, shuffle=True, seed=options.seed * 1000 + epoch)
        n_batches = (len(train_data) + options.batch_size - 1) // options.batch_size
        bar = tqdm(steps, total=n_batches, desc=f"{config.display_name()} epoch {epoch}/{options.epochs}",
                   disable=not options.progress, leave=False)
        for ids, mask, targets in bar:
            loss = _loss(model, config, ids, mask, targets)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), options.clip)
            opt.step()
            total += float(loss.detach()) * ids.size(0)
            count += ids.size(0)
            bar.set_postfix(loss=f"{total / max(count, 1):.4f}")
        scores = evaluate(model, config, dev_data, labels)
        history.append(dict(epoch=epoch, loss=total / max(count, 1), **{f"dev_{k}": v for k, v in scores.items()}))
        if scores[key] > best:
            best = scores[key]
            best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return model, history


def options_to_json(options: TrainOptions) -> Dict[str, object]:
    d = dict(asdict(options))
    d.pop("progress")
    return d
