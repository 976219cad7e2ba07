"""The architectures of the paper (Tables 1-2) built from qvi.nn, each with the single serving
entry point forward(token_ids: Long[B,T], mask: Bool[B,T]) -> Dict[str, Tensor].

Output names and shapes (B batch, T tokens, C labels, K tags, L layers, H heads):
    logits            [B,C]      classifiers: unnormalised label scores
    emissions         [B,T,K]    taggers: per-token tag scores
    tags              [B,T]      taggers (eval mode): CRF Viterbi path, -1 on padding
    attention         [B,T]      α per token, sums to 1 over a text's real tokens, 0 on padding
    gates             [B,T]      β per token (QVI models), in (0,1) on real tokens, 0 on padding
    sentence_attention, sentence_gates  [B,T]  HAN: the sentence-level α / β of each token's sentence
    contribution      [B,T,C]    classifiers with attention: token i's share of each label's logit,
                                 α_i (W_out g(q, v_i)); Σ_i contribution[:, i, c] + bias_c = logits[:, c]
                                 (eval mode). HAN: its sentence's share times its word-level α
    sentence_contribution [B,T,C] HAN: the exact share of the token's sentence (sums, over the
                                 sentences, to the logits less the bias)
    lambda_q, lambda_k [B,T]     context-aware models: λ averaged over layers and heads
    layer_attention   [B,L,H,T,T] Transformer models: every layer's and head's attention map
    layer_gates       [B,L,H,T]  Transformer QVI models: β per layer, head and position
    layer_lambda_q, layer_lambda_k [B,L,H,T]  context-aware models
For classifiers `attention`/`gates` come from the final attention pooling; for taggers, which have
no pooling, `attention` is the attention each token receives (the column mean of the maps over
layers, heads and real queries) and `gates` is β averaged over layers and heads.

Transformer models also export forward_without_maps(token_ids, mask): every output above except
`layer_attention`, computed without ever forming the per-layer maps where nothing else needs them
(the classifiers' attentions run as fused scaled-dot-product attention; the taggers form one
layer's map at a time, for the attention each token receives, and keep none). A server calls it for
batches in which nobody asked for the maps; the outputs it shares with forward are equal.
"""
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Tuple

import torch
from torch import nn

from qvi.nn import (CRF, AdditiveAttention, MaskedBiRNN, MaskedConv1d, TransformerEncoder,
                    check_interaction, sinusoidal_positions)
from qvi.nn.additive import contributions
from qvi.nn.self_attention import CONTEXTS
from qvi.tokenizer import CASE_CLASSES

CLASSIFIERS = ("cnn_att", "lstm_att", "han", "transformer", "ctx_transformer")
# Table 1's plain baselines: classifiers without attention, so no explanations (and no QVI).
BASELINES = ("cnn", "lstm")
TAGGERS = ("transformer_crf", "cnn_transformer_crf", "ctx_transformer_crf")
ARCHITECTURES = CLASSIFIERS + BASELINES + TAGGERS
# The architectures whose self-attention has context-aware gates (λ), and the contexts they may
# read (the notes' global, deep and deep-global context; qvi.nn.TransformerEncoder).
CONTEXT_AWARE = ("ctx_transformer", "ctx_transformer_crf")
CONTEXT_KINDS = tuple(k for k in CONTEXTS if k != "none")
_CONTEXT_DISPLAY = {"global": "Context-aware", "deep": "Deep-context", "deep_global": "Deep-global-context"}
DISPLAY = {
    "cnn": "CNN", "lstm": "LSTM", "cnn_att": "CNN-Att", "lstm_att": "LSTM-Att", "han": "HAN", "transformer": "Transformer",
    "ctx_transformer": "Context-aware Transformer", "transformer_crf": "Transformer-CRF",
    "cnn_transformer_crf": "CNN-Transformer-CRF", "ctx_transformer_crf": "Context-aware Transformer-CRF",
}


@dataclass
class ModelConfig:
    """Hyper-parameters of one architecture. `g` selects the attention values (qvi.nn.INTERACTIONS)."""
    arch: str
    vocab_size: int
    num_outputs: int                 # labels (classifiers) or tags (taggers)
    g: str = "qvi"
    score: str = "additive"          # h(q, v) of the additive pooling: qvi.nn.additive.SCORES
    emb_dim: int = 64
    hidden: int = 64                 # CNN filters, RNN size per direction, Transformer width
    heads: int = 4
    layers: int = 1
    ffn: int = 128
    window: int = 3
    dropout: float = 0.1
    max_tokens: int = 128
    boundary_ids: List[int] = field(default_factory=list)  # HAN: sentence-ending token ids
    context: str = ""                # context-aware architectures: CONTEXT_KINDS ("" = global)
    case_dim: int = 0                # > 0: ids fold in a case class (tokenizer rule 7), embedded in case_dim

    @property
    def token_dim(self) -> int:
        """What a token's embedding is wide: the word vector and, with casing, its case feature."""
        return self.emb_dim + self.case_dim

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.arch in CONTEXT_AWARE:
            self.context = self.context or "global"
            if self.context not in CONTEXT_KINDS:
                raise ValueError(f"context must be one of {CONTEXT_KINDS}, got {self.context!r}")
        elif self.context:
            raise ValueError(f"context applies to the context-aware architectures {CONTEXT_AWARE} only; "
                             f"{self.arch} has no context gates, got context={self.context!r}")
        self.g = check_interaction(self.g)
        if self.arch in BASELINES and self.g != "none":
            raise ValueError(f"{DISPLAY[self.arch]} has no attention, so no query-value interaction: "
                             f"train it with --g none (g1), got {self.g!r}")

    @property
    def task(self) -> str:
        return "tagging" if self.arch in TAGGERS else "classification"

    def display_name(self) -> str:
        base = DISPLAY[self.arch]
        if self.arch in CONTEXT_AWARE:
            base = base.replace("Context-aware", _CONTEXT_DISPLAY[self.context])
        if self.g == "none":
            return base
        suffix = "QVI" if self.g == "qvi" else self.g
        if base.endswith("-CRF"):
            return base[: -len("-CRF")] + f"-{suffix}-CRF"
        return f"{base}-{suffix}"

    def to_json(self) -> Dict[str, object]:
        return dict(asdict(self))


class TokenEmbedding(nn.Module):
    """Word vectors (row 0, [PAD], zero) and, with `case_dim`, the case feature of tokenizer rule 7
    concatenated: the server feeds id = word + vocab_size x case class, which is split here, so the
    serving interface stays forward(token_ids, mask). Pretrained vectors go into `weight`."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.num_embeddings = c.vocab_size
        self.weight = nn.Parameter(torch.empty(c.vocab_size, c.emb_dim))
        nn.init.normal_(self.weight)
        with torch.no_grad():
            self.weight[0].zero_()
        # Row 0 of the case table is [PAD]'s; real tokens use 1 + their class.
        self.cases = nn.Embedding(CASE_CLASSES + 1, c.case_dim, padding_idx=0) if c.case_dim > 0 else None

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.cases is None:
            return nn.functional.embedding(token_ids, self.weight, 0)
        words = torch.remainder(token_ids, self.num_embeddings)
        case = torch.div(token_ids, self.num_embeddings, rounding_mode="floor") + 1
        case = torch.where(token_ids == 0, torch.zeros_like(case), case)
        return torch.cat([nn.functional.embedding(words, self.weight, 0), self.cases(case)], dim=-1)


def token_embedding(model: nn.Module) -> TokenEmbedding:
    """The model's TokenEmbedding (every architecture has one)."""
    return next(m for m in model.modules() if isinstance(m, TokenEmbedding))


def _mean_over_layers_heads(x: torch.Tensor) -> torch.Tensor:
    return x.mean(dim=(1, 2))


class CNN(nn.Module):
    """CNN (Kim 2014), Table 1's baseline: embeddings -> masked CNN -> max over the real positions ->
    linear. No attention: it returns logits only."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.cnn = MaskedConv1d(c.token_dim, c.hidden, c.window)
        self.out = nn.Linear(c.hidden, c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.drop(self.cnn(self.drop(self.emb(token_ids)), mask))
        # Padding never wins the max; a text with no tokens pools to zeros.
        pooled = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values
        pooled = torch.where(mask.any(dim=1, keepdim=True), pooled, torch.zeros_like(pooled))
        return {"logits": self.out(self.drop(pooled))}


class LSTM(nn.Module):
    """LSTM, Table 1's baseline: embeddings -> masked bi-LSTM -> the forward direction's state at the
    last real token and the backward direction's at the first -> linear. No attention."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.hidden = c.hidden
        self.rnn = MaskedBiRNN("lstm", c.token_dim, c.hidden)
        self.out = nn.Linear(2 * c.hidden, c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.drop(self.rnn(self.drop(self.emb(token_ids)), mask))  # [B,T,2H], zero on padding
        last = (mask.sum(dim=1) - 1).clamp(min=0)  # an empty text reads position 0, which is zeros
        forward_final = h[torch.arange(h.size(0)), last, : self.hidden]
        backward_final = h[:, 0, self.hidden:]
        return {"logits": self.out(self.drop(torch.cat([forward_final, backward_final], dim=-1)))}


class CNNAtt(nn.Module):
    """CNN-Att(-QVI): embeddings -> masked CNN -> additive attention pooling -> linear."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.cnn = MaskedConv1d(c.token_dim, c.hidden, c.window)
        self.pool = AdditiveAttention(c.hidden, c.score, c.g)
        self.out = nn.Linear(c.hidden, c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.drop(self.cnn(self.drop(self.emb(token_ids)), mask))
        pooled, alpha, beta, gv = self.pool(h, mask)
        out = {"logits": self.out(self.drop(pooled)), "attention": alpha,
               "contribution": contributions(alpha, gv, self.out.weight)}
        if beta is not None:
            out["gates"] = beta
        return out


class LSTMAtt(nn.Module):
    """LSTM-Att(-QVI): embeddings -> masked bi-LSTM -> additive attention pooling -> linear."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.rnn = MaskedBiRNN("lstm", c.token_dim, c.hidden)
        self.pool = AdditiveAttention(2 * c.hidden, c.score, c.g)
        self.out = nn.Linear(2 * c.hidden, c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.drop(self.rnn(self.drop(self.emb(token_ids)), mask))
        pooled, alpha, beta, gv = self.pool(h, mask)
        out = {"logits": self.out(self.drop(pooled)), "attention": alpha,
               "contribution": contributions(alpha, gv, self.out.weight)}
        if beta is not None:
            out["gates"] = beta
        return out


class HAN(nn.Module):
    """HAN(-QVI) (Yang et al. 2016): word bi-GRU + word attention inside each sentence, then
    sentence bi-GRU + sentence attention over the document; QVI at both levels when g = qvi.

    Sentences are found inside the model: a token whose id is in `boundary_ids` ends a sentence.
    Tokens are scattered into a [B, S, W] grid (S sentences of at most W words), so one flat
    [B,T] batch serves HAN like every other model. A token's `attention` is its word-level α
    times its sentence's α, which sums to 1 over the text's tokens.
    """

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.word_rnn = MaskedBiRNN("gru", c.token_dim, c.hidden)
        self.word_pool = AdditiveAttention(2 * c.hidden, c.score, c.g)
        self.sent_rnn = MaskedBiRNN("gru", 2 * c.hidden, c.hidden)
        self.sent_pool = AdditiveAttention(2 * c.hidden, c.score, c.g)
        self.out = nn.Linear(2 * c.hidden, c.num_outputs)
        ids = c.boundary_ids if c.boundary_ids else [-1]
        self.register_buffer("boundaries", torch.tensor(ids, dtype=torch.long))

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        b, t = token_ids.shape
        x = self.drop(self.emb(token_ids))
        is_end = mask & (token_ids.unsqueeze(-1) == self.boundaries).any(-1)
        ends = is_end.long()
        sent = torch.cumsum(ends, dim=1) - ends                     # sentence index of each token
        steps = torch.arange(t, device=token_ids.device).unsqueeze(0).expand(b, t)
        starts = torch.ones_like(is_end)
        starts[:, 1:] = is_end[:, :-1]
        first = torch.cummax(torch.where(starts, steps, torch.zeros_like(steps)), dim=1)[0]
        pos = steps - first                                          # position inside its sentence
        sent = torch.where(mask, sent, torch.zeros_like(sent))
        pos = torch.where(mask, pos, torch.zeros_like(pos))
        n_sent = int(sent.max().item()) + 1 if t > 0 else 1
        n_word = int(pos.max().item()) + 1 if t > 0 else 1
        rows = torch.arange(b, device=token_ids.device).unsqueeze(1).expand(b, t)
        flat = (rows * n_sent + sent) * n_word + pos                 # [B,T] slot in the grid
        real = flat[mask]
        grid = torch.zeros(b * n_sent * n_word, x.size(-1), dtype=x.dtype, device=x.device)
        grid = grid.index_put((real,), x[mask])
        grid_mask = torch.zeros(b * n_sent * n_word, dtype=torch.bool, device=x.device)
        grid_mask = grid_mask.index_put((real,), torch.ones_like(real, dtype=torch.bool))
        words = grid.view(b * n_sent, n_word, -1)
        word_mask = grid_mask.view(b * n_sent, n_word)
        hw = self.drop(self.word_rnn(words, word_mask))
        sent_vec, w_alpha, w_beta, _ = self.word_pool(hw, word_mask)
        sent_vec = sent_vec.view(b, n_sent, -1)
        sent_mask = word_mask.view(b, n_sent, n_word).any(-1)
        hs = self.drop(self.sent_rnn(sent_vec, sent_mask))
        doc, s_alpha, s_beta, s_gv = self.sent_pool(hs, sent_mask)
        tok_sent = rows * n_sent + sent                              # [B,T] index into [B*S]
        word_alpha = w_alpha.reshape(-1)[flat.reshape(-1)].view(b, t)
        sent_alpha = s_alpha.reshape(-1)[tok_sent.reshape(-1)].view(b, t)
        zeros = torch.zeros(b, t, dtype=x.dtype, device=x.device)
        # Each sentence's exact share of the logits, carried by each of its tokens; a token's
        # `contribution` is its sentence's share times its word-level α (which sums to 1 over the
        # sentence), so the tokens' shares still sum to the logits less the bias. The sentence GRU
        # between the two poolings is not linear: the word-level split is α's, not an exact one.
        sent_share = contributions(s_alpha, s_gv, self.out.weight)  # [B,S,C]
        c = sent_share.size(-1)
        tok_share = sent_share.reshape(-1, c)[tok_sent.reshape(-1)].view(b, t, c)
        tok_share = torch.where(mask.unsqueeze(-1), tok_share, torch.zeros_like(tok_share))
        out = {
            "logits": self.out(self.drop(doc)),
            "attention": torch.where(mask, word_alpha * sent_alpha, zeros),
            "sentence_attention": torch.where(mask, sent_alpha, zeros),
            "contribution": tok_share * word_alpha.unsqueeze(-1),
            "sentence_contribution": tok_share,
        }
        if w_beta is not None and s_beta is not None:
            out["gates"] = torch.where(mask, w_beta.reshape(-1)[flat.reshape(-1)].view(b, t), zeros)
            out["sentence_gates"] = torch.where(mask, s_beta.reshape(-1)[tok_sent.reshape(-1)].view(b, t), zeros)
        return out


class _TransformerBody(nn.Module):
    """Embeddings (optionally through a masked CNN) + sinusoidal positions + Transformer encoder."""

    def __init__(self, c: ModelConfig, cnn: bool):
        super().__init__()
        self.emb = TokenEmbedding(c)
        self.drop = nn.Dropout(c.dropout)
        self.cnn = MaskedConv1d(c.token_dim, c.hidden, c.window) if cnn else None
        self.proj = nn.Linear(c.token_dim, c.hidden) if (not cnn and c.token_dim != c.hidden) else None
        self.register_buffer("positions", sinusoidal_positions(c.max_tokens, c.hidden))
        context = c.context if c.arch in CONTEXT_AWARE else "none"
        self.encoder = TransformerEncoder(c.hidden, c.heads, c.layers, c.ffn, c.g, context, c.dropout)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor,
                maps: str = "maps") -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        """(h [B,T,D], the encoder's attention as `maps` chose it, the other outputs)."""
        x = self.drop(self.emb(token_ids))
        if self.cnn is not None:
            x = self.cnn(x, mask)
        elif self.proj is not None:
            x = self.proj(x)
        x = self.drop(x + self.positions[: token_ids.size(1)].unsqueeze(0))
        h, attention, gates = self.encoder(x, mask, maps)
        out: Dict[str, torch.Tensor] = {}
        if maps == "maps":
            out["layer_attention"] = attention
        if "beta" in gates:
            out["layer_gates"] = gates["beta"]
        if "lambda_q" in gates:
            out["layer_lambda_q"] = gates["lambda_q"]
            out["layer_lambda_k"] = gates["lambda_k"]
            out["lambda_q"] = _mean_over_layers_heads(gates["lambda_q"])
            out["lambda_k"] = _mean_over_layers_heads(gates["lambda_k"])
        return h, attention, out


class TransformerClassifier(nn.Module):
    """Transformer(-QVI) and the context-aware Transformers (c.context chooses the context):
    encoder -> additive attention pooling (QVI when g = qvi) -> linear."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.body = _TransformerBody(c, cnn=False)
        self.pool = AdditiveAttention(c.hidden, c.score, c.g)
        self.drop = nn.Dropout(c.dropout)
        self.out = nn.Linear(c.hidden, c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, "maps")

    @torch.jit.export
    def forward_without_maps(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, "none")

    def _run(self, token_ids: torch.Tensor, mask: torch.Tensor, maps: str) -> Dict[str, torch.Tensor]:
        h, _, out = self.body(token_ids, mask, maps)
        pooled, alpha, beta, gv = self.pool(h, mask)
        out["logits"] = self.out(self.drop(pooled))
        out["attention"] = alpha
        out["contribution"] = contributions(alpha, gv, self.out.weight)
        if beta is not None:
            out["gates"] = beta
        return out


class TransformerCRF(nn.Module):
    """(CNN-)Transformer(-QVI)-CRF tagger: encoder -> linear emissions -> CRF (Viterbi in eval). For
    ctx_transformer_crf the encoder's self-attention is context-aware (λ_Q, λ_K gates per token, as
    the context-aware Transformer classifier has them, with the context c.context chooses)."""

    def __init__(self, c: ModelConfig, cnn: bool = False):
        super().__init__()
        self.body = _TransformerBody(c, cnn=cnn)
        self.emit = nn.Linear(c.hidden, c.num_outputs)
        self.crf = CRF(c.num_outputs)

    def forward(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, "maps")

    @torch.jit.export
    def forward_without_maps(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        return self._run(token_ids, mask, "received")

    def _run(self, token_ids: torch.Tensor, mask: torch.Tensor, maps: str,
             decode: bool = True) -> Dict[str, torch.Tensor]:
        """decode=False leaves out `tags`: the AOTInductor export (qvi.pt2), whose server decodes
        the emissions itself, because torch.export cannot trace Viterbi's loop over a dynamic T."""
        h, attention, out = self.body(token_ids, mask, maps)
        emissions = self.emit(h)
        out["emissions"] = emissions
        if decode and not self.training:
            out["tags"] = self.crf.decode(emissions, mask)
        # attention received by each token: mean over layers, heads and real queries
        if maps == "maps":
            q = mask.to(attention.dtype).unsqueeze(1).unsqueeze(1).unsqueeze(-1)   # [B,1,1,T,1]
            received = (attention * q).sum(dim=3)                                 # [B,L,H,T]
        else:
            received = attention
        n_real = mask.to(received.dtype).sum(1).clamp(min=1.0).view(-1, 1)
        out["attention"] = received.mean(dim=(1, 2)) / n_real
        if "layer_gates" in out:
            out["gates"] = _mean_over_layers_heads(out["layer_gates"])
        return out


def build_model(c: ModelConfig) -> nn.Module:
    if c.arch == "cnn":
        return CNN(c)
    if c.arch == "lstm":
        return LSTM(c)
    if c.arch == "cnn_att":
        return CNNAtt(c)
    if c.arch == "lstm_att":
        return LSTMAtt(c)
    if c.arch == "han":
        return HAN(c)
    if c.arch in ("transformer", "ctx_transformer"):
        return TransformerClassifier(c)
    if c.arch in ("transformer_crf", "ctx_transformer_crf"):
        return TransformerCRF(c)
    return TransformerCRF(c, cnn=True)


_SHAPES = {
    "logits": ["B", "C"], "emissions": ["B", "T", "K"], "tags": ["B", "T"],
    "attention": ["B", "T"], "gates": ["B", "T"], "sentence_attention": ["B", "T"],
    "sentence_gates": ["B", "T"], "lambda_q": ["B", "T"], "lambda_k": ["B", "T"],
    "layer_attention": ["B", "L", "H", "T", "T"], "layer_gates": ["B", "L", "H", "T"],
    "layer_lambda_q": ["B", "L", "H", "T"], "layer_lambda_k": ["B", "L", "H", "T"],
    "contribution": ["B", "T", "C"], "sentence_contribution": ["B", "T", "C"],
}


def output_spec(c: ModelConfig) -> Dict[str, Dict[str, object]]:
    """The outputs a model of this config returns in eval mode, with their shapes and dims."""
    model = build_model(c).eval()
    ids = torch.full((1, 3), 2, dtype=torch.long).clamp(max=c.vocab_size - 1)
    with torch.no_grad():
        out = model(ids, torch.ones(1, 3, dtype=torch.bool))
    dims = {"C": c.num_outputs, "K": c.num_outputs, "L": c.layers, "H": c.heads}
    spec: Dict[str, Dict[str, object]] = {}
    for name in sorted(out):
        shape = _SHAPES[name]
        spec[name] = {"shape": shape, "dtype": str(out[name].dtype).replace("torch.", ""),
                      "dims": {d: dims[d] for d in shape if d in dims}}
    return spec
