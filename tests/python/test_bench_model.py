"""The benchmark-only model of `python -m qvi bench-model` (an UNTRAINED QVI Transformer of BERT-base
shape), exported at a small size in float32 and bfloat16 and served by a real qvi-server: the
half-precision variant answers in float32 like any other, close to the float32 one, with and without
the attention maps, and both say they are untrained."""
import json
import os
import shutil
import tempfile

import pytest

from qvi_testing import ServerProcess


@pytest.fixture(scope="module")
def bench_server():
    from qvi.bench_model import bench_config, export_bench_model
    work = tempfile.mkdtemp(prefix="qvi_bench_model_py_")
    store = os.path.join(work, "store")
    config = bench_config(layers=2, width=32, heads=4, ffn=64, max_tokens=32, vocab_size=200)
    for dtype in ("float32", "bfloat16"):
        export_bench_model(store, config, dtype, seed=3)
    proc = ServerProcess(store, work)
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def classify(api, proc, name, maps):
    pb, pb_grpc = api
    options = pb.OutputOptions(top_k=2, attention=True, gates=True)
    if maps:
        options.layers.CopyFrom(pb.LayerOptions(attention_maps=True, gates=True))
    texts = ["the film was good but too long", "boring", "never a dull minute , the best cast !"]
    return pb_grpc.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name=name), texts=texts, options=options), timeout=60).results


@pytest.mark.parametrize("maps", [False, True])
def test_the_bf16_variant_answers_like_the_float32_one(bench_server, api, maps):
    full = classify(api, bench_server, "bert_base_qvi", maps)
    half = classify(api, bench_server, "bert_base_qvi_bf16", maps)
    for a, b in zip(full, half):
        pa = {label.label: label.score for label in a.labels}
        pb_ = {label.label: label.score for label in b.labels}
        assert pa.keys() == pb_.keys() == {"label_0", "label_1"}
        for k in pa:
            assert abs(pa[k] - pb_[k]) < 0.02, (pa, pb_)
        assert [t.text for t in a.tokens] == [t.text for t in b.tokens]
        assert all(t.id != 1 for t in a.tokens)  # the bench words are in its vocabulary, not [UNK]
        for ta, tb in zip(a.tokens, b.tokens):
            assert abs(ta.attention - tb.attention) < 0.01 and abs(ta.gate - tb.gate) < 0.01
        assert abs(sum(t.attention for t in b.tokens) - 1) < 0.01
        if maps:
            assert len(a.layers) == len(b.layers) > 0
            for la, lb in zip(a.layers, b.layers):
                assert max(abs(x - y) for x, y in zip(la.attention, lb.attention)) < 0.02
        else:
            assert len(a.layers) == len(b.layers) == 0


def test_the_bench_model_says_it_is_untrained(bench_server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(bench_server.channel)
    for name in ("bert_base_qvi", "bert_base_qvi_bf16"):
        m = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name)), timeout=30).model
        card = json.loads(m.versions[0].metadata.model_card_json)
        assert card["untrained"] is True
        assert card["description"].startswith("UNTRAINED"), card["description"]
