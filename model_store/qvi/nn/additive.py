"""Additive attention pooling, with and without query-value interaction (QVI)."""
from typing import Optional, Tuple

import torch
from torch import nn

from qvi.nn.functional import masked_softmax


# The score functions h(q, v_i) the pooling offers.
SCORES = ("dot", "scaled_dot", "general", "additive", "mlp")


class AdditiveAttention(nn.Module):
    """Pools a sequence of values v_1..v_N [B,T,D] into one vector [B,D] with a learned query q.

    Attention weights (eq. 1), with h(q, v_i) selected by `score` (survey §2, eq. 6-9):
        dot:        h = qᵀ v_i                                                          (survey eq. 6)
        scaled_dot: h = qᵀ v_i / √D               (dot scaled as the Transformer scales it)
        general:    h = qᵀ W_a v_i                                                      (survey eq. 7)
        additive:   h = w₂ᵀ tanh(W₁ [q ; v_i])                                          (survey eq. 8)
        mlp:        h = σ(w₂ᵀ tanh(W₁ [q ; v_i] + b₁) + b₂)                             (survey eq. 9)
        α_i = softmax_i h(q, v_i)                   over real positions only; exactly 0 on padding

    Output, by `g` (paper §3 and §4.3):
        none (g1): o = Σ α_i v_i                                                      (eq. 2)
        qvi:       g(q, v_i) = (1 - β_i) · (q ∗ W v_i) + β_i · v_i                    (eq. 4)
                   β_i = σ(uᵀ [q ∗ W v_i ; v_i])                                      (eq. 5)
                   ô = Σ α_i g(q, v_i)                                                (eq. 6)
        g2:        g = q ∗ W v_i            g3: g = q ∗ W v_i + v_i

    Because q ∗ W v_i and v_i are summed, the query has the values' dimension D.
    Returns (output [B,D], α [B,T], β [B,T] or None, g(q, v_i) [B,T,D]). β is 0 on padding.
    """

    g: torch.jit.Final[str]
    score: torch.jit.Final[str]

    def __init__(self, dim: int, score: str = "additive", g: str = "none", score_hidden: int = 0):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
        self.g = g
        self.score = score
        self.query = nn.Parameter(torch.randn(dim) * (1.0 / dim ** 0.5))
        hidden = score_hidden if score_hidden > 0 else dim
        self.w_a: Optional[nn.Linear] = nn.Linear(dim, dim, bias=False) if score == "general" else None
        # The MLP score is the additive one with biases and a sigmoid (survey eq. 9 against eq. 8).
        mlp = score == "mlp"
        self.w_1: Optional[nn.Linear] = nn.Linear(2 * dim, hidden, bias=mlp) if score in ("additive", "mlp") else None
        self.w_2: Optional[nn.Linear] = nn.Linear(hidden, 1, bias=mlp) if score in ("additive", "mlp") else None
        self.w: Optional[nn.Linear] = nn.Linear(dim, dim, bias=False) if g != "none" else None
        self.u: Optional[nn.Linear] = nn.Linear(2 * dim, 1, bias=False) if g == "qvi" else None

    def scores(self, values: torch.Tensor) -> torch.Tensor:
        """h(q, v_i) for every position: [B,T]."""
        q = self.query
        if self.score == "dot":
            return torch.matmul(values, q)
        if self.score == "scaled_dot":
            return torch.matmul(values, q) / (float(q.size(0)) ** 0.5)
        if self.score == "general":
            w_a = self.w_a
            assert w_a is not None
            return torch.matmul(w_a(values), q)
        w_1 = self.w_1
        w_2 = self.w_2
        assert w_1 is not None and w_2 is not None
        q_rep = q.expand(values.size(0), values.size(1), q.size(0))
        h = w_2(torch.tanh(w_1(torch.cat([q_rep, values], dim=-1)))).squeeze(-1)
        return torch.sigmoid(h) if self.score == "mlp" else h

    def gated(self, values: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The values the weights α average, g(q, v_i) [B,T,D] (v_i itself for g1), and β [B,T] or None.
        The output is Σ α_i g(q, v_i), so a token's share of it is α_i g(q, v_i) (qvi.faithfulness)."""
        if self.g == "none":
            return values, None
        w = self.w
        assert w is not None
        inter = self.query * w(values)  # q ∗ W v_i
        if self.g == "g2":
            return inter, None
        if self.g == "g3":
            return inter + values, None
        u = self.u
        assert u is not None
        beta = torch.sigmoid(u(torch.cat([inter, values], dim=-1)).squeeze(-1)).masked_fill(~mask, 0.0)
        bb = beta.unsqueeze(-1)
        return (1.0 - bb) * inter + bb * values, beta

    def forward(self, values: torch.Tensor,
                mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(output [B,D], α [B,T], β [B,T] or None, and the values α averaged, g(q, v_i) [B,T,D]:
        what `contributions` splits the output into)."""
        alpha = masked_softmax(self.scores(values), mask, dim=-1)
        gv, beta = self.gated(values, mask)
        out = torch.bmm(alpha.unsqueeze(1), gv).squeeze(1)
        return out, alpha, beta, gv

def contributions(alpha: torch.Tensor, gv: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each position's exact share of each output of a linear layer read after the pooling:
    α_i (W g(q, v_i)) [B,T,C] for W [C,D]. The pooled output is Σ_i α_i g_i, so for every label c
    Σ_i share[i, c] + b_c is the logit W_c·ô + b_c (in eval mode: dropout between them is off). A
    label's margin over the mean of the others splits the same way, token by token."""
    return alpha.unsqueeze(-1) * torch.matmul(gv, weight.t())
