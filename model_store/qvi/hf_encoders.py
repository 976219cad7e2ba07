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
"""
import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("bert", "roberta", "distilbert")
ACTIVATIONS = ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh")
HEADS = {  # the head a family's sequence classifier puts on its first position
    "bert": "pooler_tanh", "roberta": "dense_tanh", "distilbert": "dense_relu",
}


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

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
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
    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.heads = c.heads
        self.head_dim = c.hidden // c.heads
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

    def forward(self, x: torch.Tensor, keys: torch.Tensor, maps: bool) -> List[torch.Tensor]:
        """(the layer's output [B,T,D], its attention [B,H,T,T] when `maps`, else an empty tensor).
        keys: Bool [B,1,1,T], True where a position may be attended to."""
        b, t, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        if maps:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(~keys, -3.4028234663852886e38)  # float32 min, as transformers masks
            attention = torch.softmax(scores, dim=-1)
            context = torch.matmul(attention, v)
        else:
            attention = torch.empty(0)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        context = context.transpose(1, 2).reshape(b, t, d)
        h = self.norm1(x + self.o(context))
        return [self.norm2(h + self.ffn2(self._act(self.ffn1(h)))), attention]


class Encoder(nn.Module):
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
        self.layers = nn.ModuleList([EncoderLayer(c) for _ in range(c.layers)])
        classify = c.task == "classification"
        # The sequence classifier's dense layer on the first position (BERT's pooler, RoBERTa's
        # classifier.dense, DistilBERT's pre_classifier); Identity for token classifiers.
        self.head_dense: nn.Module = nn.Linear(c.hidden, c.hidden) if classify else nn.Identity()
        self.head_activation = HEADS[c.family] if classify else "none"
        self.classifier = nn.Linear(c.hidden, c.num_labels)

    def _positions(self, token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.family == "roberta":  # as transformers counts them: over the tokens that are not its padding id
            m = (mask & (token_ids != self.pad_id)).to(torch.long)
            return torch.cumsum(m, dim=1) * m + self.pad_id
        return torch.arange(mask.size(1), device=mask.device).unsqueeze(0).expand(mask.size(0), -1)

    def _embed(self, token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.emb_word(token_ids) + self.emb_pos(self._positions(token_ids, mask))
        if self.has_types:
            x = x + self.emb_type.weight[0]
        return self.emb_norm(x)

    def _head(self, first: torch.Tensor) -> torch.Tensor:
        h = self.head_dense(first)
        if self.head_activation == "dense_relu":
            h = F.relu(h)
        elif self.head_activation != "none":
            h = torch.tanh(h)
        return self.classifier(h)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, True)

    @torch.jit.export
    def forward_without_maps(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, False)

    def _run(self, token_ids: torch.Tensor, mask: torch.Tensor, maps: bool) -> Dict[str, torch.Tensor]:
        keys = mask.unsqueeze(1).unsqueeze(2)
        x = self._embed(token_ids, mask)
        attentions: List[torch.Tensor] = []
        last: Optional[torch.Tensor] = None
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            out = layer(x, keys, maps or i == n - 1)
            x = out[0]
            last = out[1]
            if maps:
                attentions.append(out[1])
        out: Dict[str, torch.Tensor] = {}
        assert last is not None
        # The first position's row of the last layer, averaged over heads: 0 on padding already.
        out["attention"] = last[:, :, 0, :].mean(dim=1)
        if maps:
            out["layer_attention"] = torch.stack(attentions, dim=1)
        if self.task == "classification":
            out["logits"] = self._head(x[:, 0])
        else:
            emissions = self.classifier(x)
            out["emissions"] = emissions
            out["tags"] = torch.where(mask, emissions.argmax(dim=-1), torch.full_like(token_ids, -1))
        return out


def output_spec(c: EncoderConfig) -> Dict[str, Dict[str, object]]:
    """The manifest's `outputs` of an encoder of this config."""
    dims = {"C": c.num_labels, "K": c.num_labels, "L": c.layers, "H": c.heads}
    shapes: Dict[str, List[str]] = {"attention": ["B", "T"], "layer_attention": ["B", "L", "H", "T", "T"]}
    if c.task == "classification":
        shapes["logits"] = ["B", "C"]
    else:
        shapes["emissions"] = ["B", "T", "K"]
        shapes["tags"] = ["B", "T"]
    return {name: {"shape": shape, "dtype": "int64" if name == "tags" else "float32",
                   "dims": {d: dims[d] for d in shape if d in dims}} for name, shape in sorted(shapes.items())}
