"""Masking helpers shared by the layers.

Padding must never leak: a text's outputs may not depend on what it is batched with. Every
softmax therefore puts -inf on padded positions *and* writes exact zeros there afterwards, so a
row with no real position at all (an empty text) yields zeros instead of NaN.
"""
import torch


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax over `dim` restricted to positions where `mask` is True (broadcastable).

    Masked positions get exactly 0; a slice with no True position is all zeros.
    """
    mask = mask.expand_as(scores)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return probs.masked_fill(~mask, 0.0)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x [B,T,D] over the real positions of mask [B,T]; zeros for an empty row."""
    m = mask.unsqueeze(-1).to(x.dtype)
    count = m.sum(dim=1).clamp(min=1.0)
    return (x * m).sum(dim=1) / count


def reverse_within_length(mask: torch.Tensor) -> torch.Tensor:
    """Index [B,T] that reverses each row's real prefix and leaves its padding in place.

    Gathering with it twice is the identity. A backward RNN run over the gathered sequence sees a
    text's last real token first, whatever padding follows it, which makes bidirectional RNNs
    padding-invariant without packed sequences.
    """
    lengths = mask.long().sum(dim=1, keepdim=True)
    positions = torch.arange(mask.size(1), device=mask.device).unsqueeze(0).expand_as(mask)
    return torch.where(positions < lengths, lengths - 1 - positions, positions)
