"""Explanations for every architecture of the model zoo, through the real server: each
architecture, with and without QVI, is exported (small, seeded weights) and served, and the α, β,
λ, HAN sentence weights and per-layer/per-head maps the server returns equal the Python model's own
outputs for the same texts. Also: α sums to 1, β and λ lie in (0, 1), token and span offsets slice
the original text exactly (CJK, emoji, after truncation), and a batch mixing requests that ask for
explanations with requests that do not answers each as it asked."""
import os
import shutil
import tempfile
import threading

import pytest
import torch

from conftest import ServerProcess
from qvi import artifact
from qvi.models import CLASSIFIERS, TAGGERS, ModelConfig, build_model
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
    "Dull. The film went to Paris! A good one.",  # several sentences (HAN)
    " ".join(["good film"] * 20),                 # 40 tokens: truncated to MAX_TOKENS
]
TOL = 1e-4


def model_name(arch, g):
    return f"{arch.replace('_', '-')}-{g}"


@pytest.fixture(scope="module")
def zoo(api):
    work = tempfile.mkdtemp(prefix="qvi_expl_py_")
    store = os.path.join(work, "store")
    vocab = Vocabulary(["[PAD]", "[UNK]"] + WORDS)
    tok = TokenizerConfig(max_tokens=MAX_TOKENS)
    names = []
    for arch in CLASSIFIERS + TAGGERS:
        for g in ("qvi", "none"):
            torch.manual_seed(7)
            tagger = arch in TAGGERS
            cfg = ModelConfig(arch, len(vocab), len(TAGS if tagger else LABELS), g=g, emb_dim=16, hidden=16, heads=2,
                              layers=2, ffn=32)
            name = model_name(arch, g)
            manifest = artifact.build_manifest(name, cfg, tok, vocab, TAGS if tagger else LABELS,
                                               "BIO" if tagger else "", {})
            artifact.export(build_model(cfg), manifest, vocab, store, 1)
            names.append(name)
    # One model waits for its batches to fill, so that concurrent requests share batches (the
    # mixed-batch tests).
    with open(os.path.join(store, model_name("transformer", "qvi"), "serving.json"), "w") as f:
        f.write('{"max_queue_delay_ms": 20, "batch_when_idle": false}')
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


def call(api, proc, name, texts, options):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(proc.channel)
    spec = pb.ModelSpec(name=name)
    if name.endswith(("crf-qvi", "crf-none")):
        return stub.Tag(pb.TagRequest(model=spec, texts=texts, options=options), timeout=60)
    return stub.Classify(pb.ClassifyRequest(model=spec, texts=texts, options=options), timeout=60)


def full_options(pb, layered):
    o = pb.OutputOptions(top_k=3, attention=True, gates=True, tokens=True)
    if layered:
        o.layers.CopyFrom(pb.LayerOptions(gates=True, attention_maps=True))
    return o


@pytest.mark.parametrize("arch", CLASSIFIERS + TAGGERS)
@pytest.mark.parametrize("g", ["qvi", "none"])
def test_explanations_equal_the_python_model(zoo, api, arch, g):
    pb, _ = api
    proc, store, _ = zoo
    name = model_name(arch, g)
    layered = "transformer" in arch
    has_gates = g == "qvi" or arch == "ctx_transformer"  # the context-aware model always has λ
    options = full_options(pb, layered)
    if not has_gates:
        options.gates = False
        options.layers.gates = False
    resp = call(api, proc, name, TEXTS, options)
    assert len(resp.results) == len(TEXTS)
    for text, res in zip(TEXTS, resp.results):
        out, enc = reference(store, name, text)
        n = len(enc.ids)
        assert len(res.tokens) == n and res.truncated == enc.truncated
        chars = list(text)
        for j, (tok, ref) in enumerate(zip(res.tokens, enc.tokens)):
            # Offsets are code points into the original text, also after truncation.
            assert "".join(chars[tok.start:tok.end]) == tok.text == text[ref.start:ref.end]
            assert text.encode()[tok.byte_start:tok.byte_end].decode() == tok.text
            assert close(tok.attention, float(out["attention"][0, j])), (name, text, j)
            if "sentence_attention" in out:
                assert close(tok.sentence_attention, float(out["sentence_attention"][0, j]))
            if g == "qvi":
                assert close(tok.gate, float(out["gates"][0, j])) and 0 < tok.gate < 1
                if "sentence_gates" in out:
                    assert close(tok.sentence_gate, float(out["sentence_gates"][0, j]))
            else:
                assert not tok.HasField("gate")
            if "lambda_q" in out:
                assert close(tok.lambda_q, float(out["lambda_q"][0, j])) and 0 < tok.lambda_q < 1
                assert close(tok.lambda_k, float(out["lambda_k"][0, j])) and 0 < tok.lambda_k < 1
        if arch in CLASSIFIERS:
            assert abs(sum(t.attention for t in res.tokens) - 1) < 1e-4
            probs = out["logits"][0].softmax(-1)
            assert res.labels[0].label == LABELS[int(probs.argmax())]
            for ls in res.labels:
                assert close(ls.score, float(probs[LABELS.index(ls.label)]))
        else:
            assert [t.tag for t in res.tokens] == [TAGS[int(i)] for i in out["tags"][0, :n]]
            for span in res.spans:
                assert "".join(chars[span.start:span.end]) == span.text
        if layered:
            L, H = 2, 2
            assert len(res.layers) == L * H
            for m in res.layers:
                ref_att = out["layer_attention"][0, m.layer, m.head, :n, :n].flatten()
                assert len(m.attention) == n * n
                assert all(close(a, float(b)) for a, b in zip(m.attention, ref_att)), (name, m.layer, m.head)
                if g == "qvi":
                    assert all(close(a, float(b)) for a, b in zip(m.gates, out["layer_gates"][0, m.layer, m.head, :n]))
                if "layer_lambda_q" in out:
                    assert all(close(a, float(b))
                               for a, b in zip(m.lambda_q, out["layer_lambda_q"][0, m.layer, m.head, :n]))


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
    mean = out["layer_attention"][0, 1, :, :n, :n].mean(0).flatten()
    assert all(close(a, float(b)) for a, b in zip(res.layers[0].attention, mean))
    o = pb.OutputOptions(layers=pb.LayerOptions(gates=True, heads=[1]))
    [res] = call(api, proc, name, [text], o).results
    assert [(m.layer, m.head) for m in res.layers] == [(0, 1), (1, 1)]
    assert all(len(m.attention) == 0 for m in res.layers)  # maps not asked for, not sent


def test_different_layer_selections_in_one_batch(zoo, api):
    """Texts asking for different layers and heads share a batch; the batch carries their union
    off the device, and each gets exactly its own selection."""
    pb, _ = api
    proc, store, _ = zoo
    name = model_name("transformer", "qvi")
    text = TEXTS[0]
    out, enc = reference(store, name, text)
    n = len(enc.ids)
    asks = [([0], [1], pb.LAYER_REDUCTION_NONE), ([1], [0], pb.LAYER_REDUCTION_NONE),
            ([1], [], pb.LAYER_REDUCTION_MEAN_HEADS), ([], [1], pb.LAYER_REDUCTION_NONE)] * 3
    errors = []

    def client(layers, heads, reduction):
        try:
            o = pb.OutputOptions(layers=pb.LayerOptions(attention_maps=True, gates=True, layers=layers, heads=heads,
                                                        reduction=reduction))
            [res] = call(api, proc, name, [text], o).results
            want_layers = layers or [0, 1]
            if reduction == pb.LAYER_REDUCTION_MEAN_HEADS:
                assert [(m.layer, m.head) for m in res.layers] == [(l, -1) for l in want_layers]
                for m in res.layers:
                    ref = out["layer_attention"][0, m.layer, :, :n, :n].mean(0).flatten()
                    assert all(close(a, float(b)) for a, b in zip(m.attention, ref))
                return
            assert [(m.layer, m.head) for m in res.layers] == [(l, h) for l in want_layers for h in heads]
            for m in res.layers:
                ref = out["layer_attention"][0, m.layer, m.head, :n, :n].flatten()
                assert all(close(a, float(b)) for a, b in zip(m.attention, ref))
                assert all(close(a, float(b)) for a, b in zip(m.gates, out["layer_gates"][0, m.layer, m.head, :n]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((layers, heads, reduction, repr(e)))

    threads = [threading.Thread(target=client, args=a) for a in asks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []


def test_a_mixed_batch_answers_each_request_as_it_asked(zoo, api):
    """Requests with and without explanations share batches of the same model; each gets exactly
    what it asked for, and the same labels and scores as the model gives its text alone."""
    pb, _ = api
    proc, store, _ = zoo
    name = model_name("transformer", "qvi")
    refs = {t: reference(store, name, t)[0]["logits"][0].softmax(-1) for t in TEXTS}
    errors = []

    def client(i):
        try:
            for k in range(6):
                explain = (i + k) % 2 == 0
                text = TEXTS[(i + k) % len(TEXTS)]
                o = full_options(pb, True) if explain else pb.OutputOptions(top_k=3)
                [res] = call(api, proc, name, [text], o).results
                for ls in res.labels:
                    assert close(ls.score, float(refs[text][LABELS.index(ls.label)]))
                if explain:
                    assert res.tokens and all(t.HasField("attention") and t.HasField("gate") for t in res.tokens)
                    assert len(res.layers) == 4
                else:
                    assert len(res.tokens) == 0 and len(res.layers) == 0
        except Exception as e:  # noqa: BLE001 - reported below with the thread's index
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
