"""Explanations for every architecture of the model zoo, through the real server: each
architecture, with and without QVI, is exported (small, seeded weights) and served, and the α, β,
λ, HAN sentence weights and per-layer/per-head maps the server returns equal the Python model's own
outputs for the same texts. Also: α sums to 1, β and λ lie in (0, 1), token and span offsets slice
the original text exactly (CJK, emoji, after truncation), HAN splits texts of several sentences at
the exporter's sentence boundaries, and a batch mixing requests that ask for explanations with
requests that do not answers each as it asked (the server's qvi_batch_size shows that they shared
batches). Bounded: every call has a deadline, and every client thread must finish inside a join
timeout that covers all of its calls."""
import os
import re
import shutil
import tempfile
import threading
import time

import pytest
import torch

from qvi_testing import ServerProcess
from qvi import artifact
from qvi.cli import BOUNDARIES
from qvi.models import BASELINES, CLASSIFIERS, CONTEXT_AWARE, TAGGERS, ModelConfig, build_model
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_from_json, encode

torch.set_num_threads(1)

WORDS = ["a", "good", "film", "dull", "paris", "berlin", "barack", "obama", "went", "to", "and", "the", "!", "."]
LABELS = ["neg", "neu", "pos"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
MAX_TOKENS = 24
TEXTS = [
    "A good film !",
    "Barack Obama went to Paris and Berlin .",
    "東京 and café 👨‍👩‍👧 went to Berlin",       # CJK characters, an accent, a ZWJ emoji sequence
    "Dull. The film went to Paris! A good one.",  # three sentences (HAN)
    "A good film. A dull film! Obama went to Berlin",  # three sentences, the last one unterminated
    " ".join(["good film"] * 20),                 # 40 tokens: truncated to MAX_TOKENS
]
TOL = 1e-4
VOCAB = ["[PAD]", "[UNK]"] + WORDS
# HAN's sentence boundaries as the exporter (qvi.cli) sets them: the boundary tokens the vocabulary
# knows ('?' and the CJK ones are unknown here, and [UNK] must not end sentences).
BOUNDARY_IDS = sorted({VOCAB.index(b) for b in BOUNDARIES if b in VOCAB})
L, H = 2, 2  # layers and heads of the Transformer models
# A copy of transformer-qvi whose batches form only when full (or after a long delay): clients that
# keep exactly BATCH requests in flight at a time share every batch, and qvi_batch_size proves it.
BATCHED = "transformer-qvi-batched"
BATCH = 4
QUEUE_DELAY_MS = 10000  # far beyond the time clients take to send a round: a batch of BATCH is never cut short
CALL_TIMEOUT_S = 30     # a call's deadline; covers QUEUE_DELAY_MS, so a round that is short of a client still answers


# The context-aware models are served with each context: "arch:context" (plain arch = global).
SERVED = CLASSIFIERS + TAGGERS + tuple(f"{a}:{c}" for a in CONTEXT_AWARE for c in ("deep", "deep_global"))


def model_name(arch, g):
    return f"{arch.replace('_', '-').replace(':', '-')}-{g}"


@pytest.fixture(scope="module")
def zoo(api):
    work = tempfile.mkdtemp(prefix="qvi_expl_py_")
    store = os.path.join(work, "store")
    vocab = Vocabulary(VOCAB)
    tok = TokenizerConfig(max_tokens=MAX_TOKENS)
    assert BOUNDARY_IDS == sorted({vocab.id(b) for b in BOUNDARIES} - {1}) == sorted([vocab.id("."), vocab.id("!")])
    names = []
    for served in SERVED + BASELINES:
        arch, _, context = served.partition(":")
        for g in ("none",) if arch in BASELINES else ("qvi", "none"):
            torch.manual_seed(7)
            tagger = arch in TAGGERS
            cfg = ModelConfig(arch, len(vocab), len(TAGS if tagger else LABELS), g=g, emb_dim=16, hidden=16, heads=H,
                              layers=L, ffn=32, boundary_ids=BOUNDARY_IDS if arch == "han" else [], context=context)
            name = model_name(served, g)
            manifest = artifact.build_manifest(name, cfg, tok, vocab, TAGS if tagger else LABELS,
                                               "BIO" if tagger else "", {})
            artifact.export(build_model(cfg), manifest, vocab, store, 1)
            names.append(name)
    torch.manual_seed(7)
    cfg = ModelConfig("transformer", len(vocab), len(LABELS), g="qvi", emb_dim=16, hidden=16, heads=H, layers=L,
                      ffn=32)
    artifact.export(build_model(cfg), artifact.build_manifest(BATCHED, cfg, tok, vocab, LABELS, "", {}), vocab,
                    store, 1)
    with open(os.path.join(store, BATCHED, "serving.json"), "w") as f:
        f.write(f'{{"max_batch_size": {BATCH}, "max_queue_delay_ms": {QUEUE_DELAY_MS}, "batch_when_idle": false}}')
    proc = ServerProcess(store, work)
    yield proc, store, names
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def reference(store, name, text):
    """The Python model's outputs for one text alone, and its encoding."""
    module, manifest, vocab = artifact.load(os.path.join(store, name, "1", "model.pt"))
    enc = encode(text, config_from_json(manifest["tokenizer"]), vocab)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        out = module(ids, torch.ones_like(ids, dtype=torch.bool))
    return out, enc


def close(a, b):
    return abs(a - b) < TOL


def all_close(values, ref, name=""):
    """values (a server list) equals ref (a tensor) element-wise; lengths first, so that an empty or
    short list cannot pass."""
    ref = ref.flatten()
    assert len(values) == ref.numel(), (name, len(values), ref.numel())
    return all(close(a, float(b)) for a, b in zip(values, ref))


def call(api, proc, name, texts, options, timeout=60):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(proc.channel)
    spec = pb.ModelSpec(name=name)
    if "-crf-" in name:
        return stub.Tag(pb.TagRequest(model=spec, texts=texts, options=options), timeout=timeout)
    return stub.Classify(pb.ClassifyRequest(model=spec, texts=texts, options=options), timeout=timeout)


def full_options(pb, layered):
    o = pb.OutputOptions(top_k=3, attention=True, gates=True, tokens=True)
    if layered:
        o.layers.CopyFrom(pb.LayerOptions(gates=True, attention_maps=True))
    return o


def batches(proc, name):
    """(batches, texts) the server has run for model `name` so far: qvi_batch_size's count and sum."""
    found = {}
    for series, value in proc.metrics().items():
        m = re.match(r"qvi_batch_size_(count|sum)\{(.*)\}$", series)
        if m and f'model="{name}"' in m.group(2).split(","):
            assert m.group(1) not in found, f"two qvi_batch_size series for {name}"
            found[m.group(1)] = value
    return found.get("count", 0.0), found.get("sum", 0.0)


def run_clients(n, rounds, client):
    """n threads, thread i calling client(i, k) for rounds k = 0, 1, ... in turn, so each has one
    request in flight at a time; all must finish (each call is bounded by CALL_TIMEOUT_S) and none may
    fail. Returns nothing; a failure stops the other threads at their next round."""
    errors = []
    failed = threading.Event()

    def body(i):
        for k in range(rounds):
            if failed.is_set():
                return
            try:
                client(i, k)
            except Exception as e:  # noqa: BLE001 - reported below with the thread's index and round
                errors.append((i, k, repr(e)))
                failed.set()
                return

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + rounds * CALL_TIMEOUT_S + 30
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), ("client threads did not finish", errors)
    assert errors == []


def sentences(enc, boundaries):
    """Each token's sentence index, as HAN splits them: a boundary token ends its sentence."""
    index, out = 0, []
    for i in enc.ids:
        out.append(index)
        index += i in boundaries
    return out


@pytest.mark.parametrize("served", SERVED)
@pytest.mark.parametrize("g", ["qvi", "none"])
def test_explanations_equal_the_python_model(zoo, api, served, g):
    pb, _ = api
    proc, store, _ = zoo
    name = model_name(served, g)
    arch, _, context = served.partition(":")
    if context:
        # The server names the model as its manifest does: "Deep-context Transformer-QVI", ...
        _, pb_grpc = api
        info = pb_grpc.InferenceStub(proc.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name)),
                                                           timeout=30).model.versions[0]
        expected = ModelConfig(arch, len(VOCAB), 5, g=g, context=context).display_name()
        assert info.metadata.display_name == expected and expected.startswith(("Deep-context", "Deep-global-context"))
    layered = "transformer" in arch
    has_gates = g == "qvi" or arch.startswith("ctx_")  # the context-aware models always have λ
    options = full_options(pb, layered)
    if not has_gates:
        options.gates = False
        options.layers.gates = False
    resp = call(api, proc, name, TEXTS, options)
    assert len(resp.results) == len(TEXTS)
    several_sentences = 0
    for text, res in zip(TEXTS, resp.results):
        out, enc = reference(store, name, text)
        n = len(enc.ids)
        assert ("sentence_attention" in out) == (arch == "han")
        assert ("sentence_gates" in out) == (arch == "han" and g == "qvi")
        assert ("lambda_q" in out) == ("layer_lambda_q" in out) == arch.startswith("ctx_")
        assert len(res.tokens) == len(enc.tokens) == n and res.truncated == enc.truncated
        chars = list(text)
        for j, (tok, ref) in enumerate(zip(res.tokens, enc.tokens)):
            # Offsets are code points into the original text, also after truncation.
            assert "".join(chars[tok.start:tok.end]) == tok.text == text[ref.start:ref.end]
            assert text.encode()[tok.byte_start:tok.byte_end].decode() == tok.text
            assert close(tok.attention, float(out["attention"][0, j])), (name, text, j)
            if "sentence_attention" in out:
                assert close(tok.sentence_attention, float(out["sentence_attention"][0, j]))
            else:
                assert not tok.HasField("sentence_attention")
            if g == "qvi":
                assert close(tok.gate, float(out["gates"][0, j])) and 0 < tok.gate < 1
                if "sentence_gates" in out:
                    assert close(tok.sentence_gate, float(out["sentence_gates"][0, j])) and 0 < tok.sentence_gate < 1
            else:
                assert not tok.HasField("gate")
            if "sentence_gates" not in out:
                assert not tok.HasField("sentence_gate")
            if "lambda_q" in out:
                assert close(tok.lambda_q, float(out["lambda_q"][0, j])) and 0 < tok.lambda_q < 1
                assert close(tok.lambda_k, float(out["lambda_k"][0, j])) and 0 < tok.lambda_k < 1
            else:
                assert not tok.HasField("lambda_q") and not tok.HasField("lambda_k")
        # α sums to 1 over a text's tokens: the pooling's α for classifiers, the attention each
        # token receives for taggers.
        assert abs(sum(t.attention for t in res.tokens) - 1) < 1e-4, (name, text)
        if arch == "han":
            # One sentence-level α (and β) per sentence, shared by its tokens; the sentences' α sum
            # to 1, and inside each sentence the word-level α (α / sentence α) sums to 1.
            sent = sentences(enc, set(BOUNDARY_IDS))
            groups = {}
            for s, tok in zip(sent, res.tokens):
                groups.setdefault(s, []).append(tok)
            assert sorted(groups) == list(range(len(groups)))
            for toks in groups.values():
                assert all(close(t.sentence_attention, toks[0].sentence_attention) for t in toks)
                if g == "qvi":
                    assert all(close(t.sentence_gate, toks[0].sentence_gate) for t in toks)
                assert abs(sum(t.attention / t.sentence_attention for t in toks) - 1) < 1e-3, (name, text)
            assert abs(sum(toks[0].sentence_attention for toks in groups.values()) - 1) < 1e-4
            if len(groups) > 1:
                several_sentences += 1
                assert all(0 < t.sentence_attention < 1 - 1e-3 for t in res.tokens), (name, text)
                assert len({round(toks[0].sentence_attention, 4) for toks in groups.values()}) > 1, (name, text)
            else:
                assert all(close(t.sentence_attention, 1) for t in res.tokens)
        if arch in CLASSIFIERS:
            probs = out["logits"][0].softmax(-1)
            assert len(res.labels) == len(LABELS)
            assert res.labels[0].label == LABELS[int(probs.argmax())]
            for ls in res.labels:
                assert close(ls.score, float(probs[LABELS.index(ls.label)]))
        else:
            assert [t.tag for t in res.tokens] == [TAGS[int(i)] for i in out["tags"][0, :n]]
            for span in res.spans:
                assert "".join(chars[span.start:span.end]) == span.text
        if layered:
            assert sorted((m.layer, m.head) for m in res.layers) == [(l, h) for l in range(L) for h in range(H)]
            for m in res.layers:
                where = (name, text, m.layer, m.head)
                assert all_close(m.attention, out["layer_attention"][0, m.layer, m.head, :n, :n], where)
                if g == "qvi":
                    assert all_close(m.gates, out["layer_gates"][0, m.layer, m.head, :n], where)
                else:
                    assert len(m.gates) == 0
                if "layer_lambda_q" in out:
                    assert all_close(m.lambda_q, out["layer_lambda_q"][0, m.layer, m.head, :n], where)
                    assert all_close(m.lambda_k, out["layer_lambda_k"][0, m.layer, m.head, :n], where)
                    assert all(0 < x < 1 for x in list(m.lambda_q) + list(m.lambda_k))
                else:
                    assert len(m.lambda_q) == len(m.lambda_k) == 0
        else:
            assert len(res.layers) == 0
    if arch == "han":
        assert several_sentences >= 2  # TEXTS[3] and TEXTS[4]


def margin_of(values, label):
    """values[..., label] less the mean of the other labels' values (the server's margin)."""
    c = values.shape[-1]
    picked = values[..., label]
    return picked - (values.sum(-1) - picked) / (c - 1)


@pytest.mark.parametrize("served", [s for s in SERVED if s.partition(":")[0] in CLASSIFIERS])
@pytest.mark.parametrize("g", ["qvi", "none"])
def test_contributions_split_each_returned_labels_margin_as_the_python_model_does(zoo, api, served, g):
    """options.contributions with top_k 3: for every returned label, each token's share of its margin
    equals the Python model's contribution output read the same way, the margin equals the Python
    logits', the rest equals the output layer's bias part, and the shares and the rest sum to the
    margin (1e-4 relative); HAN's sentence shares likewise. The answer's labels and α are unchanged."""
    pb, _ = api
    proc, store, _ = zoo
    name = model_name(served, g)
    arch = served.partition(":")[0]
    plain = call(api, proc, name, TEXTS, pb.OutputOptions(top_k=3, attention=True))
    resp = call(api, proc, name, TEXTS, pb.OutputOptions(top_k=3, attention=True, contributions=True))
    module, _, _ = artifact.load(os.path.join(store, name, "1", "model.pt"))
    bias = module.out.bias.detach()
    for text, res, before in zip(TEXTS, resp.results, plain.results):
        out, enc = reference(store, name, text)
        assert [(ls.label, round(ls.score, 6)) for ls in res.labels] == \
            [(ls.label, round(ls.score, 6)) for ls in before.labels]
        assert [t.attention for t in res.tokens] == [t.attention for t in before.tokens]
        assert len(res.labels) == 3 and len(res.tokens) == len(enc.ids)
        for j, ls in enumerate(res.labels):
            y = LABELS.index(ls.label)
            margin = float(margin_of(out["logits"][0], y))
            assert ls.HasField("margin") and close(ls.margin, margin), (name, text, ls.label)
            assert close(ls.contribution_rest, float(margin_of(bias, y))), (name, text, ls.label)
            shares = margin_of(out["contribution"][0], y)
            assert all_close([t.contribution[j] for t in res.tokens], shares, (name, text, ls.label))
            carried = sum(t.contribution[j] for t in res.tokens) + ls.contribution_rest
            assert abs(carried - ls.margin) <= 1e-4 * max(1.0, abs(ls.margin)), (name, text, ls.label)
            if arch == "han":
                sent = margin_of(out["sentence_contribution"][0], y)
                assert all_close([t.sentence_contribution[j] for t in res.tokens], sent, (name, text))
            else:
                assert all(len(t.sentence_contribution) == 0 for t in res.tokens)
        assert not any(ls.HasField("margin") for ls in before.labels)
        assert all(len(t.contribution) == 0 for t in before.tokens)


def test_a_tagger_refuses_contributions_naming_the_option(zoo, api):
    import grpc
    pb, _ = api
    proc, _, _ = zoo
    name = model_name("transformer_crf", "qvi")
    with pytest.raises(grpc.RpcError) as refused:
        call(api, proc, name, ["Obama went to Berlin"], pb.OutputOptions(contributions=True))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"options.contributions: model '{name}'"), refused.value.details()


@pytest.mark.parametrize("served", SERVED)
def test_occlusion_equals_the_python_leave_one_out(zoo, api, served):
    """options.occlusion, served, equals faithfulness.py's occlusion (leave-one-out, deletion) on the exported
    model for the same answers: Classify, each token's drop in each of the 3 returned labels'
    probability; Tag, for each entity, each token's drop in the entity's mean CRF marginal (0 on its
    own tokens) and that probability itself. The labels, spans and tags are those answered without it."""
    from qvi.faithfulness import Answer, Methods, Scorer
    pb, _ = api
    proc, store, _ = zoo
    name = model_name(served, "qvi")
    arch = served.partition(":")[0]
    tagger = arch in TAGGERS
    top_k = 0 if tagger else 3
    plain = call(api, proc, name, TEXTS, pb.OutputOptions(top_k=top_k))
    resp = call(api, proc, name, TEXTS, pb.OutputOptions(top_k=top_k, occlusion=True))
    module, manifest, vocab = artifact.load(os.path.join(store, name, "1", "model.pt"))
    config = ModelConfig(arch, len(VOCAB), len(TAGS if tagger else LABELS), g="qvi")
    engine = Methods(Scorer(module, config, "delete"), ig_steps=1, seed=1)
    checked = 0
    for text, res, before in zip(TEXTS, resp.results, plain.results):
        ids = encode(text, config_from_json(manifest["tokenizer"]), vocab).ids
        assert len(res.tokens) == len(ids)
        if tagger:
            assert [(s.label, s.token_start, s.token_end) for s in res.spans] == \
                [(s.label, s.token_start, s.token_end) for s in before.spans]
            assert [t.tag for t in res.tokens] == [t.tag for t in before.tokens]
            answers = [Answer(0, ids, span=(s.token_start, s.token_end),
                              tags=[TAGS.index(t.tag) for t in res.tokens[s.token_start:s.token_end]])
                       for s in res.spans]
            full = engine.s.probs([(a, []) for a in answers]) if answers else []
            for s, a, p, ref in zip(res.spans, answers, full, engine.occlusion(answers)):
                assert s.HasField("probability") and close(s.probability, float(p)), (name, text, s.text)
                assert all_close(list(s.occlusion), torch.tensor(ref), (name, text, s.text))
                checked += 1
            assert not any(s.HasField("probability") or len(s.occlusion) for s in before.spans)
        else:
            assert [ls.label for ls in res.labels] == [ls.label for ls in before.labels] and len(res.labels) == 3
            answers = [Answer(0, ids, label=LABELS.index(ls.label)) for ls in res.labels]
            for j, ref in enumerate(engine.occlusion(answers)):
                assert all_close([t.occlusion[j] for t in res.tokens], torch.tensor(ref), (name, text, j))
                checked += 1
            assert all(len(t.occlusion) == 0 for t in before.tokens)
    assert checked >= (1 if tagger else 3 * len(TEXTS)), (name, checked)


@pytest.mark.parametrize("arch", BASELINES)
def test_a_baseline_without_attention_answers_and_refuses_explanations(zoo, api, arch):
    """Table 1's CNN and LSTM: served with the Python model's label scores; the manifest lists no
    explanations, and asking for α, β or per-layer maps is INVALID_ARGUMENT naming the option."""
    import grpc
    pb, pb_grpc = api
    proc, store, _ = zoo
    name = model_name(arch, "none")
    stub = pb_grpc.InferenceStub(proc.channel)
    info = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name)), timeout=30).model.versions[0]
    assert info.state == pb.MODEL_STATE_READY, info.reason
    assert len(info.metadata.outputs) == 0, "metadata.outputs lists the explanations the model gives: none"
    resp = call(api, proc, name, TEXTS, pb.OutputOptions(top_k=3, tokens=True))
    for text, res in zip(TEXTS, resp.results):
        out, enc = reference(store, name, text)
        assert set(out) == {"logits"}
        probs = out["logits"][0].softmax(-1)
        assert res.labels[0].label == LABELS[int(probs.argmax())]
        for ls in res.labels:
            assert close(ls.score, float(probs[LABELS.index(ls.label)]))
        assert len(res.tokens) == len(enc.ids) and not any(t.HasField("attention") for t in res.tokens)
    for options, field in ((pb.OutputOptions(attention=True), "options.attention"),
                           (pb.OutputOptions(gates=True), "options.gates"),
                           (pb.OutputOptions(contributions=True), "options.contributions"),
                           (pb.OutputOptions(layers=pb.LayerOptions(attention_maps=True)), "options.layers")):
        with pytest.raises(grpc.RpcError) as refused:
            call(api, proc, name, ["a good film"], options)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith(f"{field}: model '{name}'"), refused.value.details()


def test_layer_selection_and_reduction(zoo, api):
    pb, _ = api
    proc, store, _ = zoo
    name = model_name("transformer", "qvi")
    text = TEXTS[1]
    out, enc = reference(store, name, text)
    n = len(enc.ids)
    o = pb.OutputOptions(layers=pb.LayerOptions(gates=True, attention_maps=True, layers=[1], heads=[0, 1],
                                                reduction=pb.LAYER_REDUCTION_MEAN_HEADS))
    [res] = call(api, proc, name, [text], o).results
    assert [(m.layer, m.head) for m in res.layers] == [(1, -1)]
    assert all_close(res.layers[0].attention, out["layer_attention"][0, 1, :, :n, :n].mean(0))
    assert all_close(res.layers[0].gates, out["layer_gates"][0, 1, :, :n].mean(0))
    o = pb.OutputOptions(layers=pb.LayerOptions(gates=True, heads=[1]))
    [res] = call(api, proc, name, [text], o).results
    assert [(m.layer, m.head) for m in res.layers] == [(0, 1), (1, 1)]
    assert all(len(m.attention) == 0 for m in res.layers)  # maps not asked for, not sent
    for m in res.layers:
        assert all_close(m.gates, out["layer_gates"][0, m.layer, 1, :n])


def test_different_layer_selections_in_one_batch(zoo, api):
    """Texts asking for different layers and heads share a batch; the batch carries their union
    off the device, and each gets exactly its own selection. Each round sends one text per
    selection at once, and qvi_batch_size shows that every batch held all of them."""
    pb, _ = api
    proc, store, _ = zoo
    refs = {t: reference(store, BATCHED, t) for t in TEXTS}
    asks = [([0], [1], pb.LAYER_REDUCTION_NONE), ([1], [0], pb.LAYER_REDUCTION_NONE),
            ([1], [], pb.LAYER_REDUCTION_MEAN_HEADS), ([], [1], pb.LAYER_REDUCTION_NONE)]
    assert len(asks) == BATCH
    rounds = 3

    def client(i, k):
        layers, heads, reduction = asks[i]
        text = TEXTS[(i + k) % len(TEXTS)]
        out, enc = refs[text]
        n = len(enc.ids)
        o = pb.OutputOptions(layers=pb.LayerOptions(attention_maps=True, gates=True, layers=layers, heads=heads,
                                                    reduction=reduction))
        [res] = call(api, proc, BATCHED, [text], o, timeout=CALL_TIMEOUT_S).results
        want_layers = layers or list(range(L))
        if reduction == pb.LAYER_REDUCTION_MEAN_HEADS:
            assert [(m.layer, m.head) for m in res.layers] == [(l, -1) for l in want_layers]
            for m in res.layers:
                assert all_close(m.attention, out["layer_attention"][0, m.layer, :, :n, :n].mean(0))
                assert all_close(m.gates, out["layer_gates"][0, m.layer, :, :n].mean(0))
            return
        assert [(m.layer, m.head) for m in res.layers] == [(l, h) for l in want_layers for h in heads]
        for m in res.layers:
            assert all_close(m.attention, out["layer_attention"][0, m.layer, m.head, :n, :n])
            assert all_close(m.gates, out["layer_gates"][0, m.layer, m.head, :n])

    before = batches(proc, BATCHED)
    run_clients(len(asks), rounds, client)
    after = batches(proc, BATCHED)
    # Every batch held one text of every client: the selections shared each batch.
    assert (after[0] - before[0], after[1] - before[1]) == (rounds, rounds * BATCH)


def test_a_mixed_batch_answers_each_request_as_it_asked(zoo, api):
    """Requests with and without explanations share batches of the same model; each gets exactly
    what it asked for, and the same labels, scores and explanations as the model gives its text
    alone. BATCH clients send one request each per round, half of them asking for explanations; the
    model's batches form only when full, and qvi_batch_size shows that each round was one batch."""
    pb, _ = api
    proc, store, _ = zoo
    refs = {t: reference(store, BATCHED, t) for t in TEXTS}
    rounds = 6
    asked = []

    def client(i, k):
        explain = (i + k) % 2 == 0  # in every round, half of the clients ask for explanations
        text = TEXTS[(i + k) % len(TEXTS)]
        out, enc = refs[text]
        n = len(enc.ids)
        o = full_options(pb, True) if explain else pb.OutputOptions(top_k=3)
        [res] = call(api, proc, BATCHED, [text], o, timeout=CALL_TIMEOUT_S).results
        probs = out["logits"][0].softmax(-1)
        assert len(res.labels) == len(LABELS) and res.labels[0].label == LABELS[int(probs.argmax())]
        for ls in res.labels:
            assert close(ls.score, float(probs[LABELS.index(ls.label)]))
        if explain:
            assert len(res.tokens) == n
            for j, t in enumerate(res.tokens):
                assert t.HasField("attention") and close(t.attention, float(out["attention"][0, j]))
                assert t.HasField("gate") and close(t.gate, float(out["gates"][0, j]))
            assert sorted((m.layer, m.head) for m in res.layers) == [(l, h) for l in range(L) for h in range(H)]
            for m in res.layers:
                assert all_close(m.attention, out["layer_attention"][0, m.layer, m.head, :n, :n])
                assert all_close(m.gates, out["layer_gates"][0, m.layer, m.head, :n])
        else:
            assert len(res.tokens) == 0 and len(res.layers) == 0
        asked.append((k, explain))

    before = batches(proc, BATCHED)
    run_clients(BATCH, rounds, client)
    after = batches(proc, BATCHED)
    # Each round's BATCH requests were one batch (no batch ran short of one, none held two rounds),
    # and each round mixed requests with and without explanations.
    assert (after[0] - before[0], after[1] - before[1]) == (rounds, rounds * BATCH)
    for k in range(rounds):
        assert sorted(e for r, e in asked if r == k) == [False] * (BATCH // 2) + [True] * (BATCH // 2)
