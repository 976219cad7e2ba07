"""Linear-chain conditional random field with masked, batched Viterbi decoding in TorchScript."""
from typing import List

import torch
from torch import nn


class CRF(nn.Module):
    """Scores a tag sequence y_1..y_n for emissions E [B,T,K] as
        s(y) = start[y_1] + Σ_t E[t, y_t] + Σ_{t>1} trans[y_{t-1}, y_t] + end[y_n]
    and models p(y | x) = exp s(y) / Σ_y' exp s(y').

    Each row's real tokens are a prefix of its mask (right padding). `decode` returns the
    highest-scoring sequence per row [B,T] with -1 on padding; `neg_log_likelihood` is the
    training loss, mean over the rows that have at least one token.
    """

    def __init__(self, num_tags: int):
        super().__init__()
        self.num_tags = num_tags
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))
        self.trans = nn.Parameter(torch.zeros(num_tags, num_tags))

    def neg_log_likelihood(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, k = emissions.shape
        lengths = mask.long().sum(1)
        rows = lengths > 0
        tags = tags.clamp(min=0)
        # score of the gold path
        first = tags[:, 0]
        gold = self.start[first] + emissions[:, 0].gather(1, first.unsqueeze(1)).squeeze(1)
        for i in range(1, t):
            step = self.trans[tags[:, i - 1], tags[:, i]] + emissions[:, i].gather(1, tags[:, i:i + 1]).squeeze(1)
            gold = gold + step * mask[:, i].to(emissions.dtype)
        last = tags.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        gold = gold + self.end[last]
        # log partition by the forward algorithm
        alpha = self.start.unsqueeze(0) + emissions[:, 0]
        for i in range(1, t):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.trans.unsqueeze(0), dim=1) + emissions[:, i]
            alpha = torch.where(mask[:, i].unsqueeze(1), nxt, alpha)
        log_z = torch.logsumexp(alpha + self.end.unsqueeze(0), dim=1)
        nll = (log_z - gold)[rows]
        return nll.mean() if nll.numel() > 0 else emissions.sum() * 0.0

    @torch.jit.export
    def decode(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, k = emissions.shape
        lengths = mask.long().sum(1)
        tags = torch.full((b, t), -1, dtype=torch.long, device=emissions.device)
        if t == 0:
            return tags
        score = self.start.unsqueeze(0) + emissions[:, 0]
        history: List[torch.Tensor] = []
        for i in range(1, t):
            best, idx = (score.unsqueeze(2) + self.trans.unsqueeze(0)).max(dim=1)
            history.append(idx)
            score = torch.where(mask[:, i].unsqueeze(1), best + emissions[:, i], score)
        cur = (score + self.end.unsqueeze(0)).argmax(dim=1)
        for i in range(t - 1, -1, -1):
            active = i < lengths
            tags[:, i] = torch.where(active, cur, tags[:, i])
            if i > 0:
                prev = history[i - 1].gather(1, cur.unsqueeze(1)).squeeze(1)
                cur = torch.where(active, prev, cur)
        return tags
