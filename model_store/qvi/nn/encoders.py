"""Padding-safe sequence encoders: a masked CNN, masked bidirectional RNNs and a Transformer
encoder built on MultiHeadSelfAttention."""
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from qvi.nn.functional import masked_mean, reverse_within_length
from qvi.nn.self_attention import MultiHeadSelfAttention


class MaskedConv1d(nn.Module):
    """Convolution over time [B,T,Din] -> [B,T,Dout] with ReLU; odd window, 'same' length.

    Inputs are zeroed on padding before the convolution, so a real token next to padding sees the
    same zeros that the convolution's own border padding supplies; outputs are zeroed on padding.
    """

    def __init__(self, d_in: int, d_out: int, window: int = 3):
        super().__init__()
        if window % 2 != 1:
            raise ValueError(f"window must be odd, got {window}")
        self.conv = nn.Conv1d(d_in, d_out, window, padding=window // 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(x.dtype)
        y = torch.relu(self.conv((x * m).transpose(1, 2)).transpose(1, 2))
        return y * m


class MaskedBiRNN(nn.Module):
    """Bidirectional LSTM or GRU [B,T,Din] -> [B,T,2H] that ignores padding.

    The forward direction is causal, so trailing padding cannot reach real positions. The backward
    direction runs a second forward RNN over each row's real prefix reversed in place
    (reverse_within_length), then the outputs are put back in order. This gives exactly the
    outputs of a packed bidirectional RNN, and scripts cleanly.
    """

    def __init__(self, cell: str, d_in: int, hidden: int):
        super().__init__()
        if cell == "lstm":
            self.fwd = nn.LSTM(d_in, hidden, batch_first=True)
            self.bwd = nn.LSTM(d_in, hidden, batch_first=True)
        elif cell == "gru":
            self.fwd = nn.GRU(d_in, hidden, batch_first=True)
            self.bwd = nn.GRU(d_in, hidden, batch_first=True)
        else:
            raise ValueError(f"cell must be lstm or gru, got {cell!r}")

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        idx = reverse_within_length(mask).unsqueeze(-1)
        out_f = self.fwd(x)[0]
        out_b = self.bwd(torch.gather(x, 1, idx.expand_as(x)))[0]
        out_b = torch.gather(out_b, 1, idx.expand_as(out_b))
        return torch.cat([out_f, out_b], dim=-1) * mask.unsqueeze(-1).to(x.dtype)


def sinusoidal_positions(max_len: int, dim: int) -> torch.Tensor:
    """The Transformer's fixed sinusoidal position encodings [max_len, dim]."""
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(max_len, dim)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: dim // 2])
    return pe


class TransformerLayer(nn.Module):
    """Post-norm Transformer block: x = LN(x + SelfAttn(x)); x = LN(x + FFN(x))."""

    def __init__(self, dim: int, heads: int, ffn: int, g: str, context: str, dropout: float, context_dim: int = 0):
        super().__init__()
        self.attn = MultiHeadSelfAttention(dim, heads, g=g, context=context, dropout=dropout, context_dim=context_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.ReLU(), nn.Linear(ffn, dim))
        self.norm2 = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, maps: str = "maps",
                ctx: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        a, attn, gates = self.attn(x, mask, maps, ctx)
        x = self.norm1(x + self.dropout(a))
        x = self.norm2(x + self.dropout(self.ffn(x)))
        return x, attn, gates


class TransformerEncoder(nn.Module):
    """A stack of L TransformerLayers over x [B,T,D] (positions already added).

    Returns (x [B,T,D], attention, gates: name -> [B,L,H,T]) where the gate names are those of
    MultiHeadSelfAttention ("beta", "lambda_q", "lambda_k") and `maps` chooses the attention:
    the maps [B,L,H,T,T] ("maps"), the attention each position receives [B,L,H,T] ("received"), or
    an empty tensor ("none"; the maps are never formed).

    `context` (qvi.nn.self_attention.CONTEXTS) is what the context-aware gates of layer l = 1..L see,
    with X^0 the encoder's input and X^j layer j's output, so that layer l reads X^{l-1}:
        global       C = mean(X^{l-1}), one row for every position                       d_c = D
        deep         C = [X^0; ...; X^{l-1}], each position its own row                  d_c = l D
        deep_global  C = [mean(X^0); ...; mean(X^{l-1})], one row for every position     d_c = l D
    means over real tokens. The notes write the deep context as [H^1..H^{l-1}] (l-1 blocks) and the
    deep-global one as [c^1..c^l] (l blocks), which cannot both count from the same place; we read
    both as "every representation below the layer", its own input and the embeddings included, so
    the first layer has a context too and the two differ only in the averaging.
    """

    context: torch.jit.Final[str]

    def __init__(self, dim: int, heads: int, layers: int, ffn: int, g: str = "none",
                 context: str = "none", dropout: float = 0.1):
        super().__init__()
        self.context = context
        deep = context in ("deep", "deep_global")
        self.layers = nn.ModuleList(
            [TransformerLayer(dim, heads, ffn, g, context, dropout, dim * (j + 1) if deep else dim)
             for j in range(layers)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor,
                maps: str = "maps") -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        attention: List[torch.Tensor] = []
        per_layer: Dict[str, List[torch.Tensor]] = {}
        below: List[torch.Tensor] = []  # X^0..X^{l-1} (deep) or their means [B,1,D] (deep_global)
        for layer in self.layers:
            ctx: Optional[torch.Tensor] = None
            if self.context == "global":
                ctx = masked_mean(x, mask).unsqueeze(1)
            elif self.context == "deep":
                below.append(x)
                ctx = torch.cat(below, dim=-1)
            elif self.context == "deep_global":
                below.append(masked_mean(x, mask).unsqueeze(1))
                ctx = torch.cat(below, dim=-1)
            x, attn, gates = layer(x, mask, maps, ctx)
            if maps != "none":
                attention.append(attn)
            for name, value in gates.items():
                if name not in per_layer:
                    per_layer[name] = []
                per_layer[name].append(value)
        stacked: Dict[str, torch.Tensor] = {}
        for name, values in per_layer.items():
            stacked[name] = torch.stack(values, dim=1)
        if maps == "none":
            return x, torch.zeros(0, dtype=x.dtype, device=x.device), stacked
        return x, torch.stack(attention, dim=1), stacked
