"""Each equation of the paper checked against a direct, loop-based computation (float64)."""
import math

import pytest
import torch

from qvi.nn import AdditiveAttention, MultiHeadSelfAttention, TransformerEncoder

MASK = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@torch.no_grad()
def ref_additive(m: AdditiveAttention, values: torch.Tensor, mask: torch.Tensor):
    """eq. 1-2 (g = none), eq. 4-6 (g = qvi), and the §4.3 ablations, one position at a time."""
    q = m.query.detach()
    outs, alphas, betas = [], [], []
    for b in range(values.size(0)):
        real = [i for i in range(values.size(1)) if mask[b, i]]
        h = []
        for i in real:
            v = values[b, i]
            if m.score == "dot":
                h.append(float(q @ v))                                         # survey eq. 6
            elif m.score == "scaled_dot":
                h.append(float(q @ v) / math.sqrt(q.numel()))
            elif m.score == "general":
                h.append(float(q @ (m.w_a.weight @ v).detach()))               # survey eq. 7
            elif m.score == "additive":
                h.append(float(m.w_2.weight[0] @ torch.tanh(m.w_1.weight @ torch.cat([q, v]))))  # eq. 8
            else:                                                              # survey eq. 9
                hidden = torch.tanh(m.w_1.weight @ torch.cat([q, v]) + m.w_1.bias)
                h.append(sigmoid(float(m.w_2.weight[0] @ hidden + m.w_2.bias[0])))
        z = sum(math.exp(x) for x in h)
        alpha = [math.exp(x) / z for x in h]                                   # eq. 1
        o = torch.zeros_like(q)
        beta_row = torch.zeros(values.size(1), dtype=values.dtype)
        alpha_row = torch.zeros(values.size(1), dtype=values.dtype)
        for a, i in zip(alpha, real):
            v = values[b, i]
            alpha_row[i] = a
            if m.g == "none":
                gv = v                                                         # eq. 2
            else:
                inter = q * (m.w.weight @ v)                                   # q ∗ W v_i
                if m.g == "qvi":
                    beta = sigmoid(float(m.u.weight[0] @ torch.cat([inter, v])))  # eq. 5
                    beta_row[i] = beta
                    gv = (1 - beta) * inter + beta * v                         # eq. 4
                elif m.g == "g2":
                    gv = inter
                else:
                    gv = inter + v
            o = o + a * gv                                                     # eq. 6
        outs.append(o)
        alphas.append(alpha_row)
        betas.append(beta_row)
    return torch.stack(outs), torch.stack(alphas), torch.stack(betas)


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "additive", "mlp"])
@pytest.mark.parametrize("g", ["none", "qvi", "g2", "g3"])
def test_additive_attention_matches_equations(score, g):
    m = AdditiveAttention(5, score=score, g=g).double()
    values = torch.randn(3, 6, 5, dtype=torch.float64)
    out, alpha, beta, _ = m(values, MASK)
    ref_out, ref_alpha, ref_beta = ref_additive(m, values, MASK)
    torch.testing.assert_close(out, ref_out.detach(), atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(alpha, ref_alpha.detach(), atol=1e-12, rtol=1e-10)
    if g == "qvi":
        torch.testing.assert_close(beta, ref_beta.detach(), atol=1e-12, rtol=1e-10)
    else:
        assert beta is None


@torch.no_grad()
def ref_self_attention(m: MultiHeadSelfAttention, x: torch.Tensor, mask: torch.Tensor, ctx=None):
    """eq. 3 (g = none), eq. 7-10 (g = qvi), ablations, and the context-aware gates. `ctx` is the
    context C [B, 1 or T, d_c]; without it, the global context (the mean of x over real tokens)."""
    H, d = m.heads, m.head_dim
    lin = lambda layer, v: layer.weight @ v + layer.bias  # noqa: E731
    B, T, D = x.shape
    out = torch.zeros(B, T, D, dtype=x.dtype)
    maps = torch.zeros(B, H, T, T, dtype=x.dtype)
    gates = {k: torch.zeros(B, H, T, dtype=x.dtype) for k in ("beta", "lambda_q", "lambda_k")}
    for b in range(B):
        real = [i for i in range(T) if mask[b, i]]
        mean = sum(x[b, i] for i in real) / len(real)                                # global context
        context = lambda i: mean if ctx is None else ctx[b, i if ctx.size(1) > 1 else 0]  # noqa: E731
        concat = torch.zeros(T, D, dtype=x.dtype)
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            Q = {i: lin(m.w_q, x[b, i])[sl] for i in range(T)}
            K = {i: lin(m.w_k, x[b, i])[sl] for i in range(T)}
            V = {i: lin(m.w_v, x[b, i])[sl] for i in range(T)}
            if m.context != "none":
                for i in real:
                    cq, ck = (context(i) @ m.u_q)[sl], (context(i) @ m.u_k)[sl]
                    lq = sigmoid(float(Q[i] @ m.v_qh[h] + cq @ m.v_qc[h]))
                    lk = sigmoid(float(K[i] @ m.v_kh[h] + ck @ m.v_kc[h]))
                    gates["lambda_q"][b, h, i], gates["lambda_k"][b, h, i] = lq, lk
                    Q[i] = (1 - lq) * Q[i] + lq * cq
                    K[i] = (1 - lk) * K[i] + lk * ck
            G = {}
            for i in real:
                if m.g == "none":
                    G[i] = V[i]
                    continue
                w = [math.exp(float(V[i] @ Q[j]) / math.sqrt(d)) for j in real]
                q_tilde = sum(wj / sum(w) * Q[j] for wj, j in zip(w, real))         # eq. 7
                inter = q_tilde * (V[i] @ m.w_qvi[h])                              # Q̃ ∗ W V
                if m.g == "qvi":
                    beta = sigmoid(float(m.u_qvi[h] @ torch.cat([inter, V[i]])))   # eq. 9
                    gates["beta"][b, h, i] = beta
                    G[i] = (1 - beta) * inter + beta * V[i]                        # eq. 8
                elif m.g == "g2":
                    G[i] = inter
                else:
                    G[i] = inter + V[i]
            for i in range(T):
                s = [math.exp(float(Q[i] @ K[j]) / math.sqrt(d)) for j in real]
                for sj, j in zip(s, real):
                    maps[b, h, i, j] = sj / sum(s)                                 # softmax(QKᵀ/√d)
                concat[i, sl] = sum(maps[b, h, i, j] * G[j] for j in real)         # eq. 10
        for i in range(T):
            out[b, i] = lin(m.w_o, concat[i])
    return out, maps, gates


# The gates' context as the module sees it: none, the global mean it forms itself, or one the
# caller passes (a row per position, as the deep context is; one row for all, as deep-global is).
CONTEXT_CASES = [("none", None), ("global", None), ("deep", "per position"), ("deep_global", "shared")]


@pytest.mark.parametrize("g", ["none", "qvi", "g2", "g3"])
@pytest.mark.parametrize("context,given", CONTEXT_CASES)
def test_self_attention_matches_equations(g, context, given):
    dc = 6 if given is None else 18
    m = MultiHeadSelfAttention(6, heads=2, g=g, context=context, context_dim=dc).double().eval()
    x = torch.randn(3, 6, 6, dtype=torch.float64)
    ctx = None if given is None else torch.randn(3, 6 if given == "per position" else 1, dc, dtype=torch.float64)
    with torch.no_grad():
        out, maps, gates = m(x, MASK, "maps", ctx)
        ref_out, ref_maps, ref_gates = ref_self_attention(m, x, MASK, ctx)
    real = MASK.unsqueeze(-1)
    torch.testing.assert_close(out.masked_fill(~real, 0), ref_out.masked_fill(~real, 0), atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(maps, ref_maps, atol=1e-12, rtol=1e-10)
    expected = ({"beta"} if g == "qvi" else set()) | ({"lambda_q", "lambda_k"} if context != "none" else set())
    assert set(gates) == expected
    for name in expected:
        torch.testing.assert_close(gates[name], ref_gates[name], atol=1e-12, rtol=1e-10)


@torch.no_grad()
def ref_encoder(enc: TransformerEncoder, x: torch.Tensor, mask: torch.Tensor, context: str):
    """The encoder layer by layer, each layer's context built by hand from the representations
    below it (X^0 = the input): global = mean of X^{l-1}; deep = [X^0..X^{l-1}] at each position;
    deep_global = [mean X^0..mean X^{l-1}]. Means are over real tokens only."""
    B, T, D = x.shape
    below, gates = [], {"lambda_q": [], "lambda_k": []}

    def mean(h):
        out = torch.zeros(B, 1, D, dtype=h.dtype)
        for b in range(B):
            real = [i for i in range(T) if mask[b, i]]
            out[b, 0] = sum(h[b, i] for i in real) / len(real)
        return out

    for layer in enc.layers:
        if context == "global":
            ctx = mean(x)
        elif context == "deep":
            below.append(x)
            ctx = torch.cat(below, dim=-1)
        else:
            below.append(mean(x))
            ctx = torch.cat(below, dim=-1)
        a, _, g = ref_self_attention(layer.attn, x, mask, ctx)
        for name in gates:
            gates[name].append(g[name])
        x = layer.norm1(x + a)
        x = layer.norm2(x + layer.ffn(x))
    return x, {name: torch.stack(v, dim=1) for name, v in gates.items()}


@pytest.mark.parametrize("context", ["global", "deep", "deep_global"])
def test_the_encoder_gives_each_layer_its_context(context):
    """Three layers: the third one's deep context is [X^0; X^1; X^2] (U is 18x6), and the encoder's
    output and every layer's λ equal the layer-by-layer reference."""
    torch.manual_seed(5)
    enc = TransformerEncoder(6, heads=2, layers=3, ffn=8, g="qvi", context=context, dropout=0.0).double().eval()
    widths = [tuple(layer.attn.u_q.shape) for layer in enc.layers]
    assert widths == ([(6, 6)] * 3 if context == "global" else [(6, 6), (12, 6), (18, 6)])
    x = torch.randn(3, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        out, _, gates = enc(x, MASK)
    ref_out, ref_gates = ref_encoder(enc, x, MASK, context)
    real = MASK.unsqueeze(-1)
    torch.testing.assert_close(out.masked_fill(~real, 0), ref_out.masked_fill(~real, 0), atol=1e-9, rtol=1e-8)
    for name in ("lambda_q", "lambda_k"):
        torch.testing.assert_close(gates[name], ref_gates[name], atol=1e-12, rtol=1e-10)


def test_g1_is_standard_attention():
    """The paper's g1 (values only) is attention without QVI: the output is A V exactly."""
    m = MultiHeadSelfAttention(4, heads=1, g="none").double()
    x = torch.randn(1, 5, 4, dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    out, maps, _ = m(x, mask)
    v = m.w_v(x)
    torch.testing.assert_close(out, m.w_o(maps[:, 0] @ v))
