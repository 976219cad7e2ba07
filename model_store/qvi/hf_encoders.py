"""BERT-family encoders built from the zoo's own modules, so that a checkpoint fine-tuned with Hugging Face
`transformers` is served without it (qvi.hf_import reads the checkpoint into these).

One module, `Encoder`, covers BERT, RoBERTa and DistilBERT: post-norm Transformer layers (self-attention,
residual, LayerNorm; feed-forward, residual, LayerNorm) over word + position (+ token type) embeddings.
The families differ only in what `EncoderConfig` records: RoBERTa counts positions from its padding id
over the real tokens, DistilBERT has no token types, and each has its own sequence-classification head
(BERT: tanh pooler then the classifier; RoBERTa: dense + tanh then out_proj on <s>; DistilBERT:
pre_classifier + ReLU then the classifier). Token classification is a linear layer on every position.

The serving entry point is the zoo's (qvi.models): forward(token_ids [B,T], mask [B,T]) -> outputs
    logits            [B,C]        sequence classifiers
    emissions, tags   [B,T,K] [B,T] token classifiers (tags: the argmax, -1 on padding; no CRF)
    attention         [B,T]        the last layer's attention from the first position ([CLS] / <s>),
                                   averaged over heads: the row that feeds the classification head
    layer_attention   [B,L,H,T,T]  every layer's and head's attention map (forward only)
forward_without_maps returns the same but layer_attention, with fused attention for all but the last
layer (whose first row is `attention`).

The same encoder carries the paper's QVI when the zoo fine-tunes a pretrained one (qvi.finetune):
    pooling "attention" | "qvi"   the classifier pools the last layer with the zoo's additive attention
                                  (eq. 1-2, or QVI's eq. 4-6) and reads a linear layer: `attention` is then α,
                                  `gates` β, and `contribution` [B,T,C] each position's exact share of the
                                  logits (α_i W g_i; Σ_i + bias = the logits)
    qvi_layers N                  the top N layers' self-attention with QVI (eq. 7-10): Q̃ = softmax(V Qᵀ/√d) Q
                                  over real queries, G = (1-β) Q̃∗WV + βV, β = σ(u_hᵀ[Q̃∗WV; V]) per position and
                                  head, output A G. W and u_h start at 0 and the layer's value projection
                                  doubled (start_from_pretrained), so that G = ½·2V = V: fine-tuning starts
                                  from the pretrained function exactly. `layer_gates` [B,L,H,T] holds β (1 in
                                  the layers without QVI, whose G is V; 0 on padding), `gates` their mean over
                                  the QVI layers and heads where the pooling has none.
    crf                           a tagger decodes its emissions with the zoo's CRF (Viterbi), as the GloVe
                                  taggers do; the AOTInductor package leaves that to the server (qvi.pt2).
    dropout                       on each layer's two residual branches and the pooled vector, in training.
"""
import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from qvi.nn.additive import AdditiveAttention, contributions
from qvi.nn.crf import CRF
from qvi.nn.functional import masked_softmax

FAMILIES = ("bert", "roberta", "distilbert")
ACTIVATIONS = ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh")
HEADS = {  # the head a family's sequence classifier puts on its first position
    "bert": "pooler_tanh", "roberta": "dense_tanh", "distilbert": "dense_relu",
}
POOLINGS = ("first", "attention", "qvi")


@dataclass
class EncoderConfig:
    family: str                  # bert | roberta | distilbert
    task: str                    # classification | tagging
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int           # rows of the position embedding
    type_vocab_size: int         # 0: no token-type embedding (DistilBERT)
    layer_norm_eps: float
    activation: str
    num_labels: int
    pad_id: int = 0              # RoBERTa: positions start after it
    pooling: str = "first"       # classifiers: the family's head on the first position, or attention pooling
    qvi_layers: int = 0          # the top layers whose self-attention has QVI
    crf: bool = False            # taggers: Viterbi over the emissions
    dropout: float = 0.0         # training only

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if not 0 <= self.qvi_layers <= self.layers:
            raise ValueError(f"qvi_layers must be in [0, {self.layers}], got {self.qvi_layers}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not implemented; one of {ACTIVATIONS} is")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of {self.heads} heads")

    @property
    def max_tokens(self) -> int:
        """The longest sequence (special tokens included) the position embedding covers."""
        return self.max_positions - (self.pad_id + 1 if self.family == "roberta" else 0)

    def to_json(self) -> Dict[str, object]:
        return asdict(self)


class EncoderLayer(nn.Module):
    qvi: torch.jit.Final[bool]

    def __init__(self, c: EncoderConfig, qvi: bool = False):
        super().__init__()
        self.heads = c.heads
        self.head_dim = c.hidden // c.heads
        self.qvi = qvi
        # QVI (eq. 7-10): W [H,d,d] and the folded gate vector u_h [H,2d], 0 at the start (module docstring).
        self.w_qvi = nn.Parameter(torch.zeros(c.heads, self.head_dim, self.head_dim)) if qvi else None
        self.u_qvi = nn.Parameter(torch.zeros(c.heads, 2 * self.head_dim)) if qvi else None
        self.drop = nn.Dropout(c.dropout)
        self.q = nn.Linear(c.hidden, c.hidden)
        self.k = nn.Linear(c.hidden, c.hidden)
        self.v = nn.Linear(c.hidden, c.hidden)
        self.o = nn.Linear(c.hidden, c.hidden)
        self.norm1 = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.ffn1 = nn.Linear(c.hidden, c.ffn)
        self.ffn2 = nn.Linear(c.ffn, c.hidden)
        self.norm2 = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.activation = c.activation

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B,H,T,d]

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "relu":
            return F.relu(x)
        if self.activation == "gelu":
            return F.gelu(x)
        return F.gelu(x, approximate="tanh")

    def _qvi_values(self, q: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                    maps: bool) -> List[torch.Tensor]:
        """(G [B,H,T,d], β [B,H,T], 0 on padding): eq. 7-9."""
        w, u = self.w_qvi, self.u_qvi
        assert w is not None and u is not None
        if maps:  # eq. 7: every value position attends over the real queries
            scores = torch.matmul(v, q.transpose(-1, -2)) / math.sqrt(self.head_dim)
            q_tilde = torch.matmul(masked_softmax(scores, keys, dim=-1), q)
        else:
            q_tilde = F.scaled_dot_product_attention(v, q, q, attn_mask=keys)
        inter = q_tilde * torch.einsum("bhtd,hde->bhte", v, w)  # Q̃ ∗ W V
        beta = torch.sigmoid(torch.einsum("bhtc,hc->bht", torch.cat([inter, v], dim=-1), u))
        beta = beta.masked_fill(~keys.squeeze(2), 0.0)
        bb = beta.unsqueeze(-1)
        return [(1.0 - bb) * inter + bb * v, beta]

    def forward(self, x: torch.Tensor, keys: torch.Tensor, maps: bool) -> List[torch.Tensor]:
        """(the layer's output [B,T,D], its attention [B,H,T,T] when `maps` (else an empty tensor), β [B,H,T]
        for a QVI layer (else an empty tensor)). keys: Bool [B,1,1,T], True where a position may be attended to."""
        b, t, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        beta = torch.empty(0)
        if self.qvi:
            v, beta = self._qvi_values(q, v, keys, maps)  # eq. 10 attends over G instead of V
        if maps:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            # -inf, as scaled_dot_product_attention masks (the path without maps): float32's min, as transformers
            # writes it, overflows bfloat16. Every text has a real key ([CLS]), so no row is masked whole.
            scores = scores.masked_fill(~keys, float("-inf"))
            attention = torch.softmax(scores, dim=-1)
            context = torch.matmul(attention, v)
        else:
            attention = torch.empty(0)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        context = context.transpose(1, 2).reshape(b, t, d)
        h = self.norm1(x + self.drop(self.o(context)))
        return [self.norm2(h + self.drop(self.ffn2(self._act(self.ffn1(h))))), attention, beta]


class Encoder(nn.Module):
    pooling: torch.jit.Final[str]
    qvi_layers: torch.jit.Final[int]

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.family = c.family
        self.task = c.task
        self.pad_id = c.pad_id
        self.emb_word = nn.Embedding(c.vocab_size, c.hidden)
        self.emb_pos = nn.Embedding(c.max_positions, c.hidden)
        self.has_types = c.type_vocab_size > 0
        self.emb_type = nn.Embedding(max(c.type_vocab_size, 1), c.hidden)
        self.emb_norm = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList([EncoderLayer(c, qvi=i >= c.layers - c.qvi_layers) for i in range(c.layers)])
        self.qvi_layers = c.qvi_layers
        classify = c.task == "classification"
        self.pooling = c.pooling if classify else "none"
        first = self.pooling == "first"
        # The sequence classifier's dense layer on the first position (BERT's pooler, RoBERTa's
        # classifier.dense, DistilBERT's pre_classifier); Identity for token classifiers and pooled ones.
        self.head_dense: nn.Module = nn.Linear(c.hidden, c.hidden) if first else nn.Identity()
        self.head_activation = HEADS[c.family] if first else "none"
        self.pool = AdditiveAttention(c.hidden, "additive", "qvi" if c.pooling == "qvi" else "none") \
            if classify and not first else None
        self.drop = nn.Dropout(c.dropout)
        self.classifier = nn.Linear(c.hidden, c.num_labels)
        self.crf = CRF(c.num_labels) if c.task == "tagging" and c.crf else None

    def _positions(self, token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.family == "roberta":  # as transformers counts them: over the tokens that are not its padding id
            m = (mask & (token_ids != self.pad_id)).to(torch.long)
            return torch.cumsum(m, dim=1) * m + self.pad_id
        return torch.arange(mask.size(1), device=mask.device).unsqueeze(0).expand(mask.size(0), -1)

    def _embed(self, token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.emb_word(token_ids) + self.emb_pos(self._positions(token_ids, mask))
        if self.has_types:
            x = x + self.emb_type.weight[0]
        return self.drop(self.emb_norm(x))

    def _head(self, first: torch.Tensor) -> torch.Tensor:
        h = self.head_dense(first)
        if self.head_activation == "dense_relu":
            h = F.relu(h)
        elif self.head_activation != "none":
            h = torch.tanh(h)
        return self.classifier(self.drop(h))

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, True)

    @torch.jit.export
    def forward_without_maps(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, False)

    def _classify(self, x: torch.Tensor, mask: torch.Tensor, out: Dict[str, torch.Tensor]) -> None:
        pool = self.pool
        if pool is None:
            out["logits"] = self._head(x[:, 0])
            return
        pooled, alpha, beta, gv = pool(x, mask)
        out["logits"] = self.classifier(self.drop(pooled))
        out["attention"] = alpha
        out["contribution"] = contributions(alpha, gv, self.classifier.weight)
        if beta is not None:
            out["gates"] = beta

    def _tag(self, x: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor, decode: bool,
             out: Dict[str, torch.Tensor]) -> None:
        emissions = self.classifier(self.drop(x))
        out["emissions"] = emissions
        crf = self.crf
        if crf is None:
            out["tags"] = torch.where(mask, emissions.argmax(dim=-1), torch.full_like(token_ids, -1))
        elif decode and not self.training:
            out["tags"] = crf.decode(emissions, mask)

    def _run(self, token_ids: torch.Tensor, mask: torch.Tensor, maps: bool,
             decode: bool = True) -> Dict[str, torch.Tensor]:
        """decode=False leaves a CRF tagger's `tags` out (the AOTInductor package: the server decodes)."""
        keys = mask.unsqueeze(1).unsqueeze(2)
        x = self._embed(token_ids, mask)
        attentions: List[torch.Tensor] = []
        betas: List[torch.Tensor] = []
        last: Optional[torch.Tensor] = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            out = layer(x, keys, maps or (i == n - 1 and self.pooling in ("first", "none")))
            x = out[0]
            last = out[1]
            if maps:
                attentions.append(out[1])
            if self.qvi_layers > 0:
                betas.append(out[2])
        out: Dict[str, torch.Tensor] = {}
        if self.pooling in ("first", "none"):
            assert last is not None
            # The first position's row of the last layer, averaged over heads: 0 on padding already.
            out["attention"] = last[:, :, 0, :].mean(dim=1)
        if maps:
            out["layer_attention"] = torch.stack(attentions, dim=1)
        if self.task == "classification":
            self._classify(x, mask, out)
        else:
            self._tag(x, token_ids, mask, decode, out)
        if self.qvi_layers > 0:
            self._gates(betas, keys, out)
        return out

    def _gates(self, betas: List[torch.Tensor], keys: torch.Tensor, out: Dict[str, torch.Tensor]) -> None:
        qvi = torch.stack(betas[len(betas) - self.qvi_layers:], dim=1)  # [B,N,H,T]
        b, _, h, t = qvi.shape
        plain = keys.squeeze(2).to(qvi.dtype).unsqueeze(1).expand(b, len(betas) - self.qvi_layers, h, t)
        out["layer_gates"] = torch.cat([plain, qvi], dim=1)  # β = 1 where G is V
        if "gates" not in out:
            out["gates"] = qvi.mean(dim=(1, 2))


def start_from_pretrained(model: Encoder) -> None:
    """After the pretrained weights are loaded: each QVI layer's value projection doubled, so that with W and u_h
    at 0 (β = ½, Q̃∗WV = 0) G = ½·2V = V and every layer computes what the pretrained one did."""
    with torch.no_grad():
        for layer in model.layers:
            if layer.qvi:
                layer.v.weight.mul_(2.0)
                layer.v.bias.mul_(2.0)


def output_spec(c: EncoderConfig) -> Dict[str, Dict[str, object]]:
    """The manifest's `outputs` of an encoder of this config."""
    dims = {"C": c.num_labels, "K": c.num_labels, "L": c.layers, "H": c.heads}
    shapes: Dict[str, List[str]] = {"attention": ["B", "T"], "layer_attention": ["B", "L", "H", "T", "T"]}
    if c.task == "classification":
        shapes["logits"] = ["B", "C"]
        if c.pooling != "first":
            shapes["contribution"] = ["B", "T", "C"]
    else:
        shapes["emissions"] = ["B", "T", "K"]
        shapes["tags"] = ["B", "T"]
    if (c.task == "classification" and c.pooling == "qvi") or c.qvi_layers > 0:
        shapes["gates"] = ["B", "T"]
    if c.qvi_layers > 0:
        shapes["layer_gates"] = ["B", "L", "H", "T"]
    return {name: {"shape": shape, "dtype": "int64" if name == "tags" else "float32",
                   "dims": {d: dims[d] for d in shape if d in dims}} for name, shape in sorted(shapes.items())}
