"""Multi-head scaled dot-product self-attention, with QVI and with context-aware gates."""
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from qvi.nn.functional import masked_mean, masked_softmax


MAPS = ("maps", "received", "none")
# Where the context-aware gates take their context from (papers/context-aware-san-notes-ko.txt §b);
# "none" is plain self-attention. The encoder (qvi.nn.encoders) builds the context for each layer.
CONTEXTS = ("none", "global", "deep", "deep_global")


def _attend(s: torch.Tensor, r: torch.Tensor, values: torch.Tensor, r_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(S Rᵀ · scale) V over the positions of R where r_mask [B,T] is True, without forming
    the weights. A text with no real position gets zeros, as masked_softmax gives: it attends over
    every position (so no NaN arises) and the result is multiplied by 0."""
    real = r_mask.any(dim=1, keepdim=True)
    allowed = r_mask | ~real
    out = F.scaled_dot_product_attention(s, r, values, attn_mask=allowed.unsqueeze(1).unsqueeze(2), scale=scale)
    return out * real.to(out.dtype).view(-1, 1, 1, 1)


class MultiHeadSelfAttention(nn.Module):
    """Self-attention over x [B,T,D] with H heads of size d = D/H.

    Q = x W_Q, K = x W_K, V = x W_V, split into heads [B,H,T,d].

    Context-aware gates (`context` other than "none"; Yang et al. 2019,
    papers/context-aware-san-notes-ko.txt), with a context C [T, d_c] (one row per position, or
    one row shared by every position) and U_Q, U_K [d_c, D]:
        λ_Q = σ(Q v_Q^H + (C U_Q) v_Q^C),   λ_K = σ(K v_K^H + (C U_K) v_K^C)     one per position per head
        Q̂ = (1 - λ_Q) Q + λ_Q (C U_Q),      K̂ = (1 - λ_K) K + λ_K (C U_K)
    and Q, K below stand for Q̂, K̂. The caller passes C as `ctx` ([B,1,d_c] or [B,T,d_c]); without
    it C is the global context, the mean of x over real tokens (d_c = D). The deep contexts of a
    stack of layers are built by TransformerEncoder, which knows the layers below.

    Attention map (eq. 3):  A = softmax(Q Kᵀ / √d)   over real keys; rows of padded queries are
    computed but never read.

    Values, by `g` (paper §3 and §4.3):
        none (g1): G = V                                                         output A V  (eq. 3)
        qvi:       Q̃ = softmax(V Qᵀ / √d) Q          softmax over real queries          (eq. 7)
                   G = (1 - β) · (Q̃ ∗ W V) + β · V                                       (eq. 8)
                   β = σ(uᵀ [Q̃ ∗ W V ; V] h)                                             (eq. 9)
                   output A G                                                             (eq. 10)
        g2:        G = Q̃ ∗ W V        g3: G = Q̃ ∗ W V + V
    Eq. 9 leaves β's shape loose; we read it as one gate per position per head, so u and h fold
    into one vector u_h ∈ R^{2d} for each head (the product of two linear maps is linear) and
    β has shape [B,H,T]. W is a d×d matrix per head.

    Multi-head outputs are concatenated and projected by W_O as in the Transformer.
    Returns (output [B,T,D], A, gates) where gates holds "beta" for g=qvi and "lambda_q",
    "lambda_k" for context=True, each [B,H,T] and 0 on padding. What comes back as A is chosen by
    `maps` (see MAPS):
        "maps"      the map A [B,H,T,T] itself
        "received"  the attention each key receives from the real queries, Σ_q A[q, k]  [B,H,T];
                    A is formed but not kept
        "none"      an empty tensor; A is never formed: eq. 3/10 and eq. 7 are each one
                    scaled-dot-product attention (softmax(S Rᵀ/√d) R' with the mask on R's
                    positions), which PyTorch computes with fused kernels.
    The output and the gates are the same whichever is chosen (up to float rounding).
    """

    g: torch.jit.Final[str]
    context: torch.jit.Final[str]
    heads: torch.jit.Final[int]
    head_dim: torch.jit.Final[int]

    def __init__(self, dim: int, heads: int, g: str = "none", context: str = "none", dropout: float = 0.0,
                 context_dim: int = 0):
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"model dimension {dim} is not divisible by heads={heads}")
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
        dc = context_dim if context_dim > 0 else dim  # d_c, the width of a context row
        gated = context != "none"
        self.g = g
        self.context = context
        self.heads = heads
        self.head_dim = dim // heads
        d = self.head_dim
        self.w_q = nn.Linear(dim, dim)
        self.w_k = nn.Linear(dim, dim)
        self.w_v = nn.Linear(dim, dim)
        self.w_o = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        init = 1.0 / d ** 0.5
        # QVI parameters (per head): W [H,d,d] and the folded gate vector u_h [H,2d].
        self.w_qvi = nn.Parameter(torch.randn(heads, d, d) * init) if g != "none" else None
        self.u_qvi = nn.Parameter(torch.randn(heads, 2 * d) * init) if g == "qvi" else None
        # Context-aware parameters: U_Q, U_K [d_c,D]; v^H, v^C [H,d] for Q and K.
        self.u_q = nn.Parameter(torch.randn(dc, dim) * (1.0 / dc ** 0.5)) if gated else None
        self.u_k = nn.Parameter(torch.randn(dc, dim) * (1.0 / dc ** 0.5)) if gated else None
        self.v_qh = nn.Parameter(torch.randn(heads, d) * init) if gated else None
        self.v_qc = nn.Parameter(torch.randn(heads, d) * init) if gated else None
        self.v_kh = nn.Parameter(torch.randn(heads, d) * init) if gated else None
        self.v_kc = nn.Parameter(torch.randn(heads, d) * init) if gated else None

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def _gate_towards_context(self, x: torch.Tensor, ctx: torch.Tensor, v_h: torch.Tensor,
                              v_c: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # x [B,H,T,d], ctx = C U [B,H,1,d] or [B,H,T,d]; λ [B,H,T]
        lam = torch.sigmoid((x * v_h.unsqueeze(1)).sum(-1) + (ctx * v_c.unsqueeze(1)).sum(-1))
        lam = lam.masked_fill(~mask.unsqueeze(1), 0.0)
        l4 = lam.unsqueeze(-1)
        return (1.0 - l4) * x + l4 * ctx, lam

    def forward(self, x: torch.Tensor, mask: torch.Tensor, maps: str = "maps",
                ctx: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        b, t, dim = x.shape
        q = self._split(self.w_q(x))
        k = self._split(self.w_k(x))
        v = self._split(self.w_v(x))
        gates: Dict[str, torch.Tensor] = {}
        if self.context != "none":
            u_q, u_k = self.u_q, self.u_k
            v_qh, v_qc, v_kh, v_kc = self.v_qh, self.v_qc, self.v_kh, self.v_kc
            assert u_q is not None and u_k is not None
            assert v_qh is not None and v_qc is not None and v_kh is not None and v_kc is not None
            c = ctx if ctx is not None else masked_mean(x, mask).unsqueeze(1)  # C [B,1 or T,d_c]
            cq = self._split(torch.matmul(c, u_q))  # C U_Q [B,H,1 or T,d]
            ck = self._split(torch.matmul(c, u_k))
            q, lam_q = self._gate_towards_context(q, cq, v_qh, v_qc, mask)
            k, lam_k = self._gate_towards_context(k, ck, v_kh, v_kc, mask)
            gates["lambda_q"] = lam_q
            gates["lambda_k"] = lam_k
        scale = 1.0 / (self.head_dim ** 0.5)
        key_mask = mask.unsqueeze(1).unsqueeze(2)  # [B,1,1,T]
        fused = maps == "none"
        if self.g == "none":
            values = v
        else:
            w = self.w_qvi
            assert w is not None
            # eq. 7: every value position attends over the (real) queries
            if fused:
                q_tilde = _attend(v, q, q, mask, scale)
            else:
                q_tilde = torch.matmul(masked_softmax(torch.matmul(v, q.transpose(-1, -2)) * scale, key_mask, dim=-1), q)
            inter = q_tilde * torch.einsum("bhtd,hde->bhte", v, w)  # Q̃ ∗ W V
            if self.g == "qvi":
                u = self.u_qvi
                assert u is not None
                beta = torch.sigmoid(torch.einsum("bhtc,hc->bht", torch.cat([inter, v], dim=-1), u))
                beta = beta.masked_fill(~mask.unsqueeze(1), 0.0)
                gates["beta"] = beta
                bb = beta.unsqueeze(-1)
                values = (1.0 - bb) * inter + bb * v
            elif self.g == "g2":
                values = inter
            else:
                values = inter + v
        if fused:
            # eq. 10 (eq. 3 when g = none); serving only, so no dropout on weights never formed
            out = _attend(q, k, values, mask, scale)
            returned = torch.zeros(0, dtype=x.dtype, device=x.device)
        else:
            attn = masked_softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, key_mask, dim=-1)
            out = torch.matmul(self.dropout(attn), values)  # eq. 10 (eq. 3 when g = none)
            if maps == "received":
                returned = (attn * mask.to(attn.dtype).unsqueeze(1).unsqueeze(-1)).sum(dim=2)
            else:
                returned = attn
        out = out.transpose(1, 2).reshape(b, t, dim)
        return self.w_o(out), returned, gates
