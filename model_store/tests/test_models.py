"""Every architecture: padding invariance, explanation ranges, scripted == eager."""
import pytest
import torch

from qvi.models import BASELINES, CLASSIFIERS, TAGGERS, ModelConfig, build_model

# The context-aware architectures with the deep and deep-global contexts (the plain ctx_ entries of
# ALL have the global one): "arch:context" for make().
DEEP = [("ctx_transformer:deep", "qvi"), ("ctx_transformer:deep_global", "none"),
        ("ctx_transformer_crf:deep", "none"), ("ctx_transformer_crf:deep_global", "qvi")]
ALL = [(a, g) for a in CLASSIFIERS + TAGGERS for g in ("none", "qvi")] + [("cnn_att", "g2"), ("transformer", "g3")] + DEEP
# The pooling's other score functions (survey eq. 6-9), on the architectures that pool.
SCORED = [("cnn_att", "qvi", "mlp"), ("lstm_att", "none", "mlp"), ("transformer", "qvi", "scaled_dot"),
          ("han", "qvi", "scaled_dot"), ("transformer", "none", "dot"), ("cnn_att", "qvi", "general")]
# Table 1's baselines without attention (g1 only).
PLAIN = [(a, "none", "additive") for a in BASELINES]
VOCAB = 40
BOUNDARY = 3  # a sentence-ending token id (HAN)


def make(arch: str, g: str, score: str = "additive") -> torch.nn.Module:
    """`arch` may name a context too: "ctx_transformer:deep"."""
    arch, _, context = arch.partition(":")
    cfg = ModelConfig(arch, VOCAB, 5, g=g, score=score, emb_dim=16, hidden=16, heads=2, layers=2, ffn=32,
                      max_tokens=32, boundary_ids=[BOUNDARY], context=context)
    return build_model(cfg).eval()


def texts():
    g = torch.Generator().manual_seed(7)
    lengths = [5, 12, 9, 1, 17]
    out = []
    for n in lengths:
        ids = torch.randint(4, VOCAB, (n,), generator=g)
        ids[n // 2] = BOUNDARY  # gives HAN more than one sentence
        out.append(ids)
    return out


def batch(items):
    t = max(len(x) for x in items)
    ids = torch.zeros(len(items), t, dtype=torch.long)
    mask = torch.zeros(len(items), t, dtype=torch.bool)
    for i, x in enumerate(items):
        ids[i, : len(x)] = x
        mask[i, : len(x)] = True
    return ids, mask


@pytest.mark.parametrize("arch,g,score", [(a, g, "additive") for a, g in ALL] + SCORED + PLAIN)
def test_padding_does_not_leak(arch, g, score):
    """A text alone and the same text batched with longer texts give the same outputs."""
    model = make(arch, g, score)
    items = texts()
    with torch.no_grad():
        together = model(*batch(items))
        for i, x in enumerate(items):
            alone = model(*batch([x]))
            assert set(alone) == set(together)
            for name, value in alone.items():
                n = len(x)
                a = value[0]
                b = together[name][i]
                if name in ("emissions", "contribution", "sentence_contribution"):  # [T, K or C]
                    a, b = a[:n], b[:n]
                elif name != "logits":
                    a, b = a[..., :n], b[..., :n]
                    if name == "layer_attention":
                        a, b = a[..., :n, :], b[..., :n, :]
                torch.testing.assert_close(a.float(), b.float(), atol=1e-5, rtol=1e-5, msg=f"{arch} {g} {name} text {i}")


@pytest.mark.parametrize("arch,g,score", [(a, g, "additive") for a, g in ALL] + SCORED)
def test_explanations_are_distributions_and_gates(arch, g, score):
    model = make(arch, g, score)
    ids, mask = batch(texts())
    with torch.no_grad():
        out = model(ids, mask)
    alpha = out["attention"]
    torch.testing.assert_close(alpha.sum(-1), torch.ones(len(ids)), atol=1e-5, rtol=0)
    assert torch.all(alpha[~mask] == 0), "α must be exactly 0 on padding"
    assert torch.all(alpha[mask] >= 0)
    for name in ("gates", "sentence_gates", "lambda_q", "lambda_k"):
        if name in out:
            v = out[name]
            assert torch.all((v[mask] > 0) & (v[mask] < 1)), f"{name} must lie in (0, 1)"
            assert torch.all(v[~mask] == 0)
    for name in ("layer_gates", "layer_lambda_q", "layer_lambda_k"):
        if name in out:
            v = out[name]  # [B,L,H,T]
            m = mask[:, None, None, :].expand_as(v)
            assert torch.all((v[m] > 0) & (v[m] < 1)) and torch.all(v[~m] == 0)
    if "layer_attention" in out:
        maps = out["layer_attention"]  # [B,L,H,T,T]; rows of real queries sum to 1 over real keys
        rows = maps.sum(-1)
        q = mask[:, None, None, :].expand_as(rows)
        torch.testing.assert_close(rows[q], torch.ones_like(rows[q]), atol=1e-5, rtol=0)
        assert torch.all(maps.masked_select(~mask[:, None, None, None, :].expand_as(maps)) == 0)
    has_beta = "gates" in out
    assert has_beta == (g == "qvi"), "β is returned exactly by the QVI models"
    if arch.partition(":")[0] in TAGGERS:
        tags = out["tags"]
        assert torch.all(tags[~mask] == -1) and torch.all(tags[mask] >= 0)


POOLING = [(a, g, "additive") for a, g in ALL if a.partition(":")[0] in CLASSIFIERS] + SCORED


def margins(values: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """[..., C] -> each row's value at `label` [...] less the mean of its other labels' values."""
    c = values.size(-1)
    picked = values.gather(-1, label.unsqueeze(-1)).squeeze(-1)
    return picked - (values.sum(-1) - picked) / (c - 1)


@pytest.mark.parametrize("arch,g,score", POOLING)
def test_contributions_split_every_logit_exactly_and_equal_the_offline_reference(arch, g, score):
    """Σ_i contribution[i, c] + bias_c = logit_c for every label (issue 54's 1e-4 relative bound, met
    here to float rounding), 0 on padding; for every model but HAN each token's share of the best
    label's margin is α·g computed apart through hooks on the pooling; for HAN the
    sentences' shares also split the logits and each token's share is its sentence's times word α."""
    from qvi import faithfulness
    model = make(arch, g, score)
    ids, mask = batch(texts())
    with torch.no_grad():
        out = model(ids, mask)
    share, logits = out["contribution"], out["logits"]
    assert share.shape == (*ids.shape, 5)
    assert torch.all(share[~mask] == 0)
    bias = model.out.bias
    torch.testing.assert_close(share.sum(1) + bias, logits, atol=1e-5, rtol=1e-4)
    best = logits.argmax(-1)
    per_token = margins(share, best.unsqueeze(1).expand(ids.shape))
    torch.testing.assert_close(per_token.sum(1) + margins(bias.expand_as(logits), best), margins(logits, best),
                               atol=1e-5, rtol=1e-4)
    if arch == "han":
        sentences = out["sentence_contribution"]
        torch.testing.assert_close(share, sentences * (out["attention"] / out["sentence_attention"].clamp(min=1e-30))
                                   .unsqueeze(-1), atol=1e-6, rtol=1e-4)
        return
    torch.testing.assert_close(per_token, alpha_value(model, ids, mask, best), atol=1e-6, rtol=1e-4)
    # and qvi.faithfulness's `contribution` method (what the cards measure) reads exactly that share
    scorer = faithfulness.Scorer(model, ModelConfig(arch.partition(":")[0], VOCAB, 5), "delete")
    with torch.no_grad():
        read = faithfulness.Methods(scorer, ig_steps=2, seed=0).contribution(ids, mask, best)
    torch.testing.assert_close(read, per_token, atol=1e-6, rtol=1e-4)


def alpha_value(model, ids, mask, label):
    """The offline reference, apart from the model's own output: α_i (w_ŷ − mean of the other rows)ᵀ
    g(q, v_i), from the pooling's inputs and weights caught by a hook."""
    seen = {}
    hook = model.pool.register_forward_hook(lambda _m, inp, out: seen.update(values=inp[0], alpha=out[1]))
    try:
        with torch.no_grad():
            model(ids, mask)
            gv, _ = model.pool.gated(seen["values"], mask)
    finally:
        hook.remove()
    w = model.out.weight
    direction = w[label] - (w.sum(0, keepdim=True) - w[label]) / (w.size(0) - 1)
    return seen["alpha"] * torch.einsum("btd,bd->bt", gv, direction)


@pytest.mark.parametrize("arch,g,score", [(a, g, "additive") for a, g in ALL] + SCORED + PLAIN)
def test_scripted_equals_eager(arch, g, score):
    model = make(arch, g, score)
    scripted = torch.jit.script(model)
    ids, mask = batch(texts())
    with torch.no_grad():
        eager, script = model(ids, mask), scripted(ids, mask)
    assert set(eager) == set(script)
    for name in eager:
        torch.testing.assert_close(script[name], eager[name], atol=1e-6, rtol=1e-6)


def test_empty_text_gives_finite_outputs():
    """A row without real tokens must not poison its batch with NaN."""
    for arch in CLASSIFIERS + BASELINES + TAGGERS:
        model = make(arch, "none" if arch in BASELINES else "qvi")
        ids, mask = batch([torch.tensor([5, 6, 7]), torch.tensor([5])])
        mask[1] = False
        with torch.no_grad():
            out = model(ids, mask)
        for name, value in out.items():
            assert torch.isfinite(value.float()).all(), f"{arch} {name}"


MAPPED = [(a, g) for a, g in ALL if "transformer" in a] \
    + [("transformer", "g2"), ("ctx_transformer", "none")]


@pytest.mark.parametrize("arch,g", MAPPED)
def test_forward_without_maps_gives_the_same_answers(arch, g):
    """forward_without_maps: every output of forward but the maps, equal to forward's (eager and
    scripted), an empty text included; padding still does not leak into it."""
    model = make(arch, g)
    scripted = torch.jit.script(model)
    items = texts() + [torch.tensor([], dtype=torch.long)]
    ids, mask = batch(items)
    with torch.no_grad():
        full = model(ids, mask)
        for run in (model.forward_without_maps, scripted.forward_without_maps):
            lean = run(ids, mask)
            assert set(full) - set(lean) == {"layer_attention"}, sorted(lean)
            for name, value in lean.items():
                assert torch.isfinite(value.float()).all(), f"{arch} {g} {name}"
                torch.testing.assert_close(value, full[name], atol=1e-5, rtol=1e-5, msg=f"{arch} {g} {name}")
        together = scripted.forward_without_maps(ids, mask)
        for i, x in enumerate(items[:-1]):
            alone = scripted.forward_without_maps(*batch([x]))
            n = len(x)
            for name, value in alone.items():
                a, b = value[0], together[name][i]
                if name in ("emissions", "contribution", "sentence_contribution"):  # [T, K or C]
                    a, b = a[:n], b[:n]
                elif name != "logits":
                    a, b = a[..., :n], b[..., :n]
                torch.testing.assert_close(a.float(), b.float(), atol=1e-5, rtol=1e-5, msg=f"{arch} {g} {name} text {i}")


def test_only_models_with_maps_have_a_forward_without_them():
    """The server looks for forward_without_maps; models without per-layer maps do not need one."""
    for arch in CLASSIFIERS + TAGGERS:
        scripted = torch.jit.script(make(arch, "qvi"))
        with torch.no_grad():
            has_maps = "layer_attention" in scripted(*batch(texts()))
        assert hasattr(scripted, "forward_without_maps") == has_maps, arch


@pytest.mark.parametrize("arch", BASELINES)
def test_baselines_answer_with_logits_only_and_refuse_qvi(arch):
    """CNN and LSTM have no attention: no α, no β, and so no query-value interaction to switch on."""
    ids, mask = batch(texts())
    with torch.no_grad():
        out = make(arch, "none")(ids, mask)
    assert set(out) == {"logits"} and out["logits"].shape == (len(ids), 5)
    for g in ("qvi", "g2", "g3"):
        with pytest.raises(ValueError, match="has no attention"):
            make(arch, g)


def test_the_lstm_baseline_reads_the_final_states_of_both_directions():
    """The LSTM's text vector is the forward state at the last real token (not at the padding after
    it) and the backward state at the first token."""
    torch.manual_seed(3)
    model = make("lstm", "none")
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    mask = ids != 0
    with torch.no_grad():
        h = model.rnn(model.emb(ids), mask)
        logits = model(ids, mask)["logits"]
        expected = model.out(torch.cat([h[0, 2, :16], h[0, 0, 16:]]).unsqueeze(0))
    torch.testing.assert_close(logits, expected)


def test_the_context_is_checked_and_named():
    """Only the context-aware architectures take a context; it defaults to the global one (so older
    checkpoints, which have none, load as before) and names the model."""
    assert ModelConfig("ctx_transformer", VOCAB, 2).context == "global"
    names = {c: ModelConfig("ctx_transformer_crf", VOCAB, 5, context=c).display_name()
             for c in ("global", "deep", "deep_global")}
    assert names == {"global": "Context-aware Transformer-QVI-CRF", "deep": "Deep-context Transformer-QVI-CRF",
                     "deep_global": "Deep-global-context Transformer-QVI-CRF"}
    with pytest.raises(ValueError, match="context must be one of"):
        ModelConfig("ctx_transformer", VOCAB, 2, context="local")
    with pytest.raises(ValueError, match="transformer has no context gates"):
        ModelConfig("transformer", VOCAB, 2, context="deep")
