"""Evaluation metrics: accuracy and macro-F1 for classifiers; entity-level micro precision,
recall and F1 for taggers with the chunk definition of the CoNLL shared tasks' conlleval script."""
from typing import Dict, List, Sequence, Set, Tuple


def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    if not gold:
        return 0.0
    return sum(int(g == p) for g, p in zip(gold, pred)) / len(gold)


def macro_f1(gold: Sequence[int], pred: Sequence[int], num_classes: int) -> float:
    """Unweighted mean over classes of per-class F1 (a class with no gold and no predicted
    example counts as F1 = 0, as scikit-learn does by default)."""
    f1s: List[float] = []
    for c in range(num_classes):
        tp = sum(1 for g, p in zip(gold, pred) if g == c and p == c)
        fp = sum(1 for g, p in zip(gold, pred) if g != c and p == c)
        fn = sum(1 for g, p in zip(gold, pred) if g == c and p != c)
        denom = 2 * tp + fp + fn
        f1s.append(2 * tp / denom if denom else 0.0)
    return sum(f1s) / num_classes if num_classes else 0.0


def _split(tag: str) -> Tuple[str, str]:
    if tag in ("O", "") or "-" not in tag:
        return ("O", "") if tag in ("O", "") else (tag, "")
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # conlleval's endOfChunk, extended with BIOES's S and E
    if prev_tag in ("E", "S"):
        return True
    if prev_tag == "B" and tag in ("B", "S", "O"):
        return True
    if prev_tag == "I" and tag in ("B", "S", "O"):
        return True
    if prev_tag not in ("O", "") and prev_type != type_:
        return True
    return False


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # conlleval's startOfChunk, extended with BIOES's S and E
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O", "") and tag in ("I", "E"):
        return True
    if tag not in ("O", "") and prev_type != type_:
        return True
    return False


def chunks(tags: Sequence[str]) -> Set[Tuple[int, int, str]]:
    """Entity chunks (start, end exclusive, type) of one tag sequence, as conlleval reads them:
    an I- after O or after another type starts a new chunk (BIO and BIOES)."""
    out: Set[Tuple[int, int, str]] = set()
    prev_tag, prev_type = "O", ""
    start = -1
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, type_ = _split(tag)
        if start >= 0 and _end_of_chunk(prev_tag, prefix, prev_type, type_):
            out.add((start, i, prev_type))
            start = -1
        if _start_of_chunk(prev_tag, prefix, prev_type, type_) and prefix != "O":
            start = i
        prev_tag, prev_type = prefix, type_
    return out


def entity_prf(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict[str, float]:
    """Micro precision / recall / F1 over exact chunk matches, summed over all sentences."""
    correct = found_gold = found_pred = 0
    for g, p in zip(gold, pred):
        gc, pc = chunks(g), chunks(p)
        correct += len(gc & pc)
        found_gold += len(gc)
        found_pred += len(pc)
    precision = correct / found_pred if found_pred else 0.0
    recall = correct / found_gold if found_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
