"""The Open Inference Protocol (inference.GRPCInferenceService) on qvi-server's gRPC port, called
with the clients people use: tritonclient's gRPC client calls every RPC, KServe's
InferenceGRPCClient the four it has. ModelInfer answers equal the native API's (Classify, Tag) for
the same texts, its errors carry the native messages, and it is counted in the same metrics under
method="ModelInfer". The clients run in their own virtual environment (conftest.interop_python)."""
import json

import pytest

from conftest import oip_calls
from qvi_testing import wait_until

TEXTS = ["a wonderful , moving film", "terrible acting and a boring plot", "it was fine"]
NER_TEXTS = ["Barack Obama went to Paris and Berlin .", "Angela Merkel met Emmanuel Macron in Brussels .", ""]
TOL = 1e-5
LONG = " ".join(["good"] * 400)  # more tokens than the demo model reads


def max_tokens(api, server):
    pb, pbg = api
    model = pbg.InferenceStub(server).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")), timeout=10)
    return model.model.versions[0].metadata.tokenizer.max_tokens


@pytest.fixture(scope="module")
def oip(interop_python, server_process):
    """Runs calls with the real clients against the session's server (its store is loaded before it
    listens)."""
    return lambda calls: oip_calls(interop_python, server_process.address, calls)


def native(api, server, method, texts, **options):
    pb, pbg = api
    stub = pbg.InferenceStub(server)
    request = (pb.ClassifyRequest if method == "Classify" else pb.TagRequest)(
        model=pb.ModelSpec(name="sentiment" if method == "Classify" else "ner"), texts=texts,
        options=pb.OutputOptions(**options))
    return getattr(stub, method)(request, timeout=30)


def native_error(api, server, method, model, texts, **options):
    import grpc
    pb, pbg = api
    stub = pbg.InferenceStub(server)
    request = (pb.ClassifyRequest if method == "Classify" else pb.TagRequest)(
        model=pb.ModelSpec(name=model), texts=texts, options=pb.OutputOptions(**options))
    with pytest.raises(grpc.RpcError) as e:
        getattr(stub, method)(request, timeout=30)
    return e.value.code().name, e.value.details()


def value(result):
    assert result["ok"], result
    return result["value"]


def test_every_server_and_model_rpc_answers_through_tritonclient(oip, api, server):
    calls = [{"client": "triton", "rpc": "live"},
             {"client": "triton", "rpc": "ready"},
             {"client": "triton", "rpc": "model_ready", "model": "sentiment"},
             {"client": "triton", "rpc": "model_ready", "model": "ner", "version": "1"},
             {"client": "triton", "rpc": "model_ready", "model": "nope"},
             {"client": "triton", "rpc": "model_ready", "model": "ner", "version": "one"},
             {"client": "triton", "rpc": "model_ready", "model": "ner", "version": "3"},  # corrupt: FAILED
             {"client": "triton", "rpc": "server_metadata"},
             {"client": "triton", "rpc": "model_metadata", "model": "sentiment"},
             {"client": "triton", "rpc": "model_metadata", "model": "ner", "version": "1"},
             {"client": "triton", "rpc": "model_metadata", "model": "ner", "version": "7"}]
    r = oip(calls)
    assert value(r[0]) is True and value(r[1]) is True
    assert value(r[2]) is True and value(r[3]) is True
    assert r[4] == {"ok": False, "code": "NOT_FOUND", "message": r[4]["message"]}
    assert "model 'nope' not found" in r[4]["message"]
    assert r[5]["code"] == "INVALID_ARGUMENT" and r[5]["message"].startswith("version: 'one' is not a version")
    assert value(r[6]) is False
    meta = value(r[7])
    assert meta["name"] == "qvi-serve" and meta["extensions"] == ["classification"] and meta["version"]

    sentiment = value(r[8])
    pb, pbg = api
    model = pbg.InferenceStub(server).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")), timeout=10)
    labels = list(model.model.versions[0].metadata.labels)
    assert sentiment["name"] == "sentiment" and sentiment["versions"] == ["1"]
    assert sentiment["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    outputs = {o["name"]: (o["datatype"], [int(d) for d in o["shape"]]) for o in sentiment["outputs"]}
    assert outputs["label"] == ("BYTES", [-1]) and outputs["probabilities"] == ("FP32", [-1, len(labels)])
    assert outputs["attention"] == ("FP32", [-1, -1]) and outputs["gates"] == ("FP32", [-1, -1])
    assert sentiment["platform"] in ("qvi_pt2", "qvi_torchscript")

    ner = value(r[9])
    assert {o["name"] for o in ner["outputs"]} >= {"spans", "tags", "tokens", "attention"}
    assert "label" not in {o["name"] for o in ner["outputs"]}
    assert r[10]["code"] == "NOT_FOUND" and "has no version 7" in r[10]["message"]


def test_model_metadata_properties_carry_the_manifest(oip_api, api, server):
    """OIP's ModelMetadata.properties (which tritonclient's older proto does not have), read with
    stubs generated from the vendored proto."""
    pb, pbg = oip_api
    stub = pbg.GRPCInferenceServiceStub(server)
    sentiment = stub.ModelMetadata(pb.ModelMetadataRequest(name="sentiment"), timeout=10)
    qpb, qpbg = api
    info = qpbg.InferenceStub(server).GetModel(qpb.GetModelRequest(model=qpb.ModelSpec(name="sentiment")), timeout=10)
    meta = info.model.versions[0].metadata
    p = sentiment.properties
    assert json.loads(p["labels"]) == list(meta.labels)
    assert p["task"] == "classification" and p["version"] == "1" and p["max_tokens"] == str(meta.tokenizer.max_tokens)
    assert p["display_name"] == meta.display_name and p["architecture"] == meta.architecture
    ner = stub.ModelMetadata(pb.ModelMetadataRequest(name="ner"), timeout=10).properties
    assert ner["task"] == "tagging" and json.loads(ner["tags"])[0] == "O" and ner["tag_scheme"] in ("BIO", "BIOES")
    # the card's faithfulness figures as their own property, the same numbers GetModel types
    faith = json.loads(p["faithfulness"])
    assert faith == json.loads(meta.model_card_json)["faithfulness"]
    assert [m["method"] for m in faith["methods"]] == [m.method for m in meta.faithfulness.methods]


def test_classify_through_modelinfer_equals_classify(oip, api, server):
    outputs = ["label", "probabilities", "labels", "scores", "attention", "gates", "tokens", "token_count",
               "truncated"]
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "id": "oip-1",
              "outputs": [{"name": n} for n in outputs], "parameters": {"top_k": 2}}])
    answer = value(r[0])
    assert answer["model_name"] == "sentiment" and answer["model_version"] == "1" and answer["id"] == "oip-1"
    out = answer["outputs"]
    assert list(out) == outputs  # in the order asked for
    want = native(api, server, "Classify", TEXTS, top_k=2, attention=True, gates=True)
    pb, pbg = api
    labels = list(pbg.InferenceStub(server).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")),
                                                    timeout=10).model.versions[0].metadata.labels)
    n = len(TEXTS)
    t = max(len(w.tokens) for w in want.results)
    assert out["label"]["shape"] == [n] and out["probabilities"]["shape"] == [n, len(labels)]
    assert out["attention"]["shape"] == [n, t] and out["tokens"]["shape"] == [n, t]
    for i, w in enumerate(want.results):
        assert out["label"]["data"][i] == w.labels[0].label
        assert out["labels"]["data"][i] == [l.label for l in w.labels]
        assert out["scores"]["data"][i] == pytest.approx([l.score for l in w.labels], abs=TOL)
        by_label = {l.label: l.score for l in w.labels}
        assert out["probabilities"]["data"][i] == pytest.approx([by_label[l] for l in labels], abs=TOL)
        k = len(w.tokens)
        assert out["token_count"]["data"][i] == k and out["truncated"]["data"][i] is False
        assert out["tokens"]["data"][i] == [tok.text for tok in w.tokens] + [""] * (t - k)
        assert out["attention"]["data"][i][:k] == pytest.approx([tok.attention for tok in w.tokens], abs=TOL)
        assert out["gates"]["data"][i][:k] == pytest.approx([tok.gate for tok in w.tokens], abs=TOL)
        assert out["attention"]["data"][i][k:] == [0.0] * (t - k)  # padding


def test_default_outputs_and_the_classification_extension(oip):
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "outputs": [{"name": "probabilities", "class_count": 2}]},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"attention": True}}])
    plain = value(r[0])["outputs"]
    assert list(plain) == ["label", "probabilities"]  # the cheapest answer: no tokens, no explanations
    assert value(r[0])["id"] == ""  # no id asked, none echoed
    ranked = value(r[1])["outputs"]["probabilities"]
    assert ranked["datatype"] == "BYTES" and ranked["shape"] == [len(TEXTS), 2]
    for i, row in enumerate(ranked["data"]):
        score, index, label = row[0].split(":")
        assert label == plain["label"]["data"][i]
        assert float(score) == pytest.approx(max(plain["probabilities"]["data"][i]), abs=1e-5)
        assert int(index) == plain["probabilities"]["data"][i].index(max(plain["probabilities"]["data"][i]))
    assert list(value(r[2])["outputs"]) == ["label", "probabilities", "token_count", "attention"]


def test_tag_through_modelinfer_equals_tag(oip, api, server):
    r = oip([{"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS},
             {"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS,
              "outputs": [{"name": "spans"}, {"name": "tags"}, {"name": "tokens"}, {"name": "attention"}]}])
    out = value(r[0])["outputs"]
    assert list(out) == ["spans", "tags", "token_count"]
    want = native(api, server, "Tag", NER_TEXTS, attention=True)
    for i, w in enumerate(want.results):
        spans = json.loads(out["spans"]["data"][i])
        assert [(s["label"], s["start"], s["end"], s["text"], s["token_start"], s["token_end"]) for s in spans] == \
            [(s.label, s.start, s.end, s.text, s.token_start, s.token_end) for s in w.spans]
        assert [s["score"] for s in spans] == pytest.approx([s.score for s in w.spans], abs=TOL)
        k = len(w.tokens)
        assert out["token_count"]["data"][i] == k
        assert out["tags"]["data"][i][:k] == [tok.tag for tok in w.tokens]
        explained = value(r[1])["outputs"]
        assert explained["tokens"]["data"][i][:k] == [tok.text for tok in w.tokens]
        assert explained["attention"]["data"][i][:k] == pytest.approx([tok.attention for tok in w.tokens], abs=TOL)
    assert out["token_count"]["data"][2] == 0 and out["spans"]["data"][2] == "[]"  # an empty text: no tokens


def test_per_layer_maps_through_parameters_equal_the_native_layer_options(oip, api, server):
    pb, _ = api
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS[:2],
              "outputs": [{"name": "layer_index"}, {"name": "layer_gates"}, {"name": "layer_attention"}],
              "parameters": {"layers": "0", "heads": "0,1", "reduction": "mean_heads"}}])
    out = value(r[0])["outputs"]
    want = native(api, server, "Classify", TEXTS[:2], layers=pb.LayerOptions(
        gates=True, attention_maps=True, layers=[0], heads=[0, 1], reduction=pb.LAYER_REDUCTION_MEAN_HEADS))
    assert out["layer_index"]["data"] == [[0, -1]]
    t = out["layer_attention"]["shape"][2]
    for i, w in enumerate(want.results):
        m = w.layers[0]
        k = len(m.gates)
        assert out["layer_gates"]["data"][i][0][:k] == pytest.approx(list(m.gates), abs=TOL)
        rows = out["layer_attention"]["data"][i][0]
        assert len(rows) == t
        got = [v for row in rows[:k] for v in row[:k]]
        assert got == pytest.approx(list(m.attention), abs=TOL)


def test_the_faithfulness_check_through_modelinfer_equals_the_native_check(oip, api, server):
    check = ["faithfulness_label", "faithfulness_score", "faithfulness_score_without", "faithfulness_removed"]
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"faithfulness_top_k": 2}},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "outputs": [{"name": "faithfulness_score"}]},
             {"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS[:1],
              "parameters": {"faithfulness_top_k": 2}}])
    out = value(r[0])["outputs"]
    assert list(out) == ["label", "probabilities", *check]  # the check's tensors come with it
    pb, _ = api
    want = native(api, server, "Classify", TEXTS, faithfulness=pb.FaithfulnessOptions(top_k=2))
    assert out["faithfulness_removed"]["shape"] == [len(TEXTS), max(len(w.faithfulness.removed) for w in want.results)]
    for i, w in enumerate(want.results):
        f = w.faithfulness
        assert out["faithfulness_label"]["data"][i] == f.label == w.labels[0].label
        assert out["faithfulness_score"]["data"][i] == pytest.approx(f.score, abs=TOL)
        assert out["faithfulness_score_without"]["data"][i] == pytest.approx(f.score_without, abs=TOL)
        removed = out["faithfulness_removed"]["data"][i]
        assert removed == list(f.removed) + [-1] * (len(removed) - len(f.removed))
    assert r[1]["code"] == "INVALID_ARGUMENT" and "parameters.faithfulness_top_k" in r[1]["message"], r[1]
    assert r[2]["code"] == "INVALID_ARGUMENT", r[2]
    assert "parameters.faithfulness_top_k: the check is for classifiers; model 'ner' tags" in r[2]["message"]


def test_contributions_through_modelinfer_equal_the_native_answers(oip, api, server):
    """Issue 54: the switch `contributions` answers three tensors: contribution [N, K, T] (each returned
    label's tokens' shares, K as `labels` has them), margin and contribution_rest [N, K]; the values
    are the native API's; a tagger refuses it naming the parameter."""
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"contributions": True, "top_k": 2}},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "outputs": [{"name": "labels"}, {"name": "contribution"}, {"name": "margin"}],
              "parameters": {"contributions": True, "top_k": 2}},
             {"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS[:1],
              "parameters": {"contributions": True}}])
    out = value(r[0])["outputs"]
    assert list(out) == ["label", "probabilities", "token_count", "contribution", "margin", "contribution_rest"]
    pb, _ = api
    want = native(api, server, "Classify", TEXTS, top_k=2, contributions=True)
    t = max(len(w.tokens) for w in want.results)
    assert out["contribution"]["shape"] == [len(TEXTS), 2, t] and out["margin"]["shape"] == [len(TEXTS), 2]
    named = value(r[1])["outputs"]
    for i, w in enumerate(want.results):
        k = len(w.tokens)
        assert named["labels"]["data"][i] == [lab.label for lab in w.labels]
        for j, lab in enumerate(w.labels):
            row = out["contribution"]["data"][i][j]
            assert row[:k] == pytest.approx([tok.contribution[j] for tok in w.tokens], abs=TOL)
            assert row[k:] == [0.0] * (t - k)
            assert out["margin"]["data"][i][j] == pytest.approx(lab.margin, abs=TOL)
            assert out["contribution_rest"]["data"][i][j] == pytest.approx(lab.contribution_rest, abs=TOL)
            assert sum(row) + out["contribution_rest"]["data"][i][j] == pytest.approx(lab.margin, abs=1e-4)
        assert named["contribution"]["data"][i] == out["contribution"]["data"][i]
    assert r[2]["code"] == "INVALID_ARGUMENT", r[2]
    assert "contributions: model 'ner'" in r[2]["message"], r[2]


def test_kserve_client_calls_the_server(oip):
    r = oip([{"client": "kserve", "rpc": "live"},
             {"client": "kserve", "rpc": "ready"},
             {"client": "kserve", "rpc": "model_ready", "model": "ner"},
             {"client": "kserve", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "id": "k-1"},
             {"client": "kserve", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "as_list": True,
              "outputs": [{"name": "label"}, {"name": "gates"}], "parameters": {"gates": True}},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "outputs": [{"name": "label"}, {"name": "gates"}]},
             {"client": "kserve", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "version": "99"}])
    assert value(r[0]) is True and value(r[1]) is True and value(r[2]) is True
    raw = value(r[3])  # numpy inputs travel as raw_input_contents
    assert raw["id"] == "k-1" and list(raw["outputs"]) == ["label", "probabilities"]
    listed = value(r[4])  # lists travel as contents.bytes_contents
    triton = value(r[5])
    assert listed["outputs"]["label"]["data"] == raw["outputs"]["label"]["data"] == triton["outputs"]["label"]["data"]
    for a, b in zip(listed["outputs"]["gates"]["data"], triton["outputs"]["gates"]["data"]):
        assert a == pytest.approx(b, abs=TOL)
    assert r[6]["code"] == "NOT_FOUND" and "has no version 99" in r[6]["message"]


def test_errors_name_the_field_and_carry_the_native_messages(oip, api, server):
    too_many = ["a film"] * 257
    long_text = "word " * 20000  # over --max-text-bytes
    r = oip([
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": too_many},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["ok", long_text]},
        {"client": "triton", "rpc": "infer", "model": "nope", "texts": TEXTS},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["a film", "  "]},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "input": {"name": "TEXT"}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "outputs": [{"name": "spans"}]},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "parameters": {"topk": 2}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "parameters": {"top_k": "2"}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS, "version": "v1"},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
         "parameters": {"layers": "5", "layer_gates": True}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["a film"] * 6,
         "input": {"shape": [3, 2]}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
         "outputs": [{"name": "label"}, {"name": "label"}]},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
         "outputs": [{"name": "label", "class_count": 2}]},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["ok", LONG],
         "parameters": {"truncation": "error"}},
        {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["ok", LONG],
         "outputs": [{"name": "truncated"}, {"name": "token_count"}]},
    ])
    pb, _ = api
    assert (r[13]["code"], r[13]["message"]) == native_error(
        api, server, "Classify", "sentiment", ["ok", LONG], truncation=pb.TRUNCATION_POLICY_ERROR)
    truncated = value(r[14])["outputs"]
    assert truncated["truncated"]["data"] == [False, True]
    assert truncated["token_count"]["data"][1] == max_tokens(api, server)
    assert (r[0]["code"], r[0]["message"]) == native_error(api, server, "Classify", "sentiment", too_many)
    assert (r[1]["code"], r[1]["message"]) == native_error(api, server, "Classify", "sentiment", ["ok", long_text])
    assert (r[2]["code"], r[2]["message"]) == native_error(api, server, "Classify", "nope", TEXTS)
    assert (r[3]["code"], r[3]["message"]) == native_error(api, server, "Classify", "sentiment", ["a film", "  "])
    assert r[3]["message"].startswith("texts[1]: has no tokens")
    expected = [
        (4, "inputs[0].name: 'TEXT' is not an input of model 'sentiment'; its input is 'text'"),
        (5, "outputs[0].name: model 'sentiment' has no output 'spans'; its outputs: label, probabilities"),
        (6, "parameters.topk: not a parameter of ModelInfer ("),
        (7, "parameters.top_k: must be an int64"),
        (8, "model_version: 'v1' is not a version"),
        (9, "options.layers.layers[0]: 5 is out of range"),
        (10, "inputs[0].shape: [3, 2]; 'text' is [N] (or [N, 1]): N texts"),
        (11, "outputs[1].name: 'label' is asked for twice"),
        (12, "outputs[0].parameters.classification: not supported"),
    ]
    for i, prefix in expected:
        assert r[i]["code"] == "INVALID_ARGUMENT", (i, r[i])
        assert r[i]["message"].startswith(prefix), (i, r[i]["message"])


def test_deadlines_and_metrics_are_shared_with_the_native_api(oip, server_process):
    def count(code):
        key = f'qvi_requests_total{{code="{code}",method="ModelInfer",model="sentiment",version="1"}}'
        return server_process.metrics().get(key, 0)

    ok_before = count("OK")
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS},
             # A deadline no batch can meet, through the protocol's own "timeout" parameter (µs).
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["a film"] * 200,
              "server_timeout": 1}])
    assert value(r[0]) and value(r[1])
    assert r[2]["code"] == "DEADLINE_EXCEEDED", r[2]
    assert r[2]["message"] == "the deadline passed before the model ran"
    wait_until(lambda: count("OK") >= ok_before + 2, "two ModelInfer calls counted OK")
    assert any('method="ModelInfer"' in k and "qvi_request_duration_seconds_count" in k
               for k in server_process.metrics())


def test_the_readme_tritonclient_snippet_runs_as_written(interop_python, server_process):
    import re
    import subprocess
    from conftest import REPO
    with open(f"{REPO}/README.md", encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("### From tritonclient or KServe"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert '"localhost:8500"' in snippet
    out = subprocess.run([interop_python, "-c", snippet.replace("localhost:8500", server_process.address)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[b'positive' b'negative']", out.stdout  # what the demo model answers
    assert "[[" in lines[1]


def test_occlusion_through_modelinfer_equals_the_native_answers(oip, api, server):
    """Issue 54: the switch `occlusion` answers occlusion [N, K, T] for a classifier (each returned
    label's drop per token) and entity_occlusion [N, S, T] for a tagger (each entity's drop per token, S
    the most entities of a text), with each entity's probability in the spans' JSON; the values are
    the native API's."""
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"occlusion": True, "top_k": 2}},
             {"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS,
              "parameters": {"occlusion": True}}])
    out = value(r[0])["outputs"]
    assert list(out) == ["label", "probabilities", "token_count", "occlusion"]
    want = native(api, server, "Classify", TEXTS, top_k=2, occlusion=True)
    t = max(len(w.tokens) for w in want.results)
    assert out["occlusion"]["shape"] == [len(TEXTS), 2, t]
    for i, w in enumerate(want.results):
        k = len(w.tokens)
        for j in range(len(w.labels)):
            row = out["occlusion"]["data"][i][j]
            assert row[:k] == pytest.approx([tok.occlusion[j] if tok.occlusion else 0.0 for tok in w.tokens], abs=TOL)
            assert row[k:] == [0.0] * (t - k)
    tagged = value(r[1])["outputs"]
    assert "entity_occlusion" in tagged
    want = native(api, server, "Tag", NER_TEXTS, occlusion=True)
    s = max(len(w.spans) for w in want.results)
    t = tagged["entity_occlusion"]["shape"][2]
    assert s >= 1 and tagged["entity_occlusion"]["shape"] == [len(NER_TEXTS), s, t]
    for i, w in enumerate(want.results):
        spans = json.loads(tagged["spans"]["data"][i])
        assert [sp["probability"] for sp in spans] == pytest.approx([sp.probability for sp in w.spans], abs=TOL)
        for j, sp in enumerate(w.spans):
            row = tagged["entity_occlusion"]["data"][i][j]
            assert row[:len(sp.occlusion)] == pytest.approx(list(sp.occlusion), abs=TOL)
            assert row[len(sp.occlusion):] == [0.0] * (t - len(sp.occlusion))



def test_label_sets_and_abstention_through_modelinfer_equal_the_native_answers(oip, api, server):
    """Issue 77 over OIP: the parameters coverage and abstain_below bring the tensors label_set (each
    text's set, JSON) and abstained; a tagger's spans carry "abstained"; the same answers as the native
    API's, and the same refusals."""
    r = oip([{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"coverage": 0.9, "abstain_below": 0.8}},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "outputs": [{"name": "label_set"}]},
             {"client": "triton", "rpc": "infer", "model": "sentiment", "texts": TEXTS,
              "parameters": {"coverage": 0.8}},
             {"client": "triton", "rpc": "infer", "model": "ner", "texts": NER_TEXTS,
              "parameters": {"abstain_below": 0.95}}])
    out = value(r[0])["outputs"]
    assert list(out) == ["label", "probabilities", "label_set", "abstained"]
    want = native(api, server, "Classify", TEXTS, coverage=0.9, abstain_below=0.8)
    for i, w in enumerate(want.results):
        assert json.loads(out["label_set"]["data"][i]) == list(w.label_set.labels)
        assert out["abstained"]["data"][i] == w.abstained
    assert r[1]["code"] == "INVALID_ARGUMENT" and "'label_set' needs parameters.coverage" in r[1]["message"], r[1]
    assert r[2]["code"] == "INVALID_ARGUMENT", r[2]
    assert "options.coverage: 0.8 is not a level model 'sentiment' was calibrated for (0.9, 0.95)" in r[2]["message"]
    spans = [json.loads(s) for s in value(r[3])["outputs"]["spans"]["data"]]
    tagged = native(api, server, "Tag", NER_TEXTS, abstain_below=0.95)
    for got, w in zip(spans, tagged.results):
        assert [s.get("abstained", False) for s in got] == [s.abstained for s in w.spans]


def test_a_models_default_threshold_in_serving_json_judges_every_answer_that_sets_none(interop_python, api,
                                                                                        tmp_path):
    """serving.json's "abstain_below" (issue 77): the answers of a request that sets no threshold are judged by
    the model's, natively and over OIP (whose default outputs then carry "abstained"), and counted; a request's
    own threshold (0: none abstains) and raw_scores override it; the response cache keeps them apart."""
    import os
    import shutil
    from qvi_testing import STORE, ServerProcess, metric_sum, wait_until
    pb, pbg = api
    store = tmp_path / "store"
    for name in ("sentiment", "ner"):
        shutil.copytree(os.path.join(STORE, name), store / name)
        (store / name / "serving.json").write_text('{"abstain_below": 0.8}')
    proc = ServerProcess(str(store), str(tmp_path), "--response-cache-bytes", str(1 << 20))
    try:
        def counted(name):
            return metric_sum(proc.metrics(), name, 'model="sentiment"')

        def reaches(name, value):  # a gRPC call is counted once done (OnDone), maybe just after its answer
            wait_until(lambda: counted(name) >= value, f"{name} to reach {value}", seconds=30)
            assert counted(name) == value, name

        plain = native(api, proc.channel, "Classify", TEXTS)
        marks = [r.abstained for r in plain.results]
        assert marks == [r.labels[0].score < 0.8 for r in plain.results] and any(marks) and not all(marks), plain
        reaches("qvi_abstention_judged_total", len(TEXTS))
        reaches("qvi_abstained_total", sum(marks))
        # The request's own threshold and raw scores are other answers, kept apart from the default's in the cache
        # (each misses it once), and judged by their own threshold or not at all.
        for options in ({"abstain_below": 0.0}, {"raw_scores": True}):
            assert not any(r.abstained for r in native(api, proc.channel, "Classify", TEXTS, **options).results)
        reaches("qvi_abstention_judged_total", 2 * len(TEXTS))
        assert counted("qvi_response_cache_hits_total") == 0
        assert [r.abstained for r in native(api, proc.channel, "Classify", TEXTS).results] == marks
        reaches("qvi_response_cache_hits_total", len(TEXTS))  # from the cache, judged and counted still
        reaches("qvi_abstention_judged_total", 3 * len(TEXTS))
        reaches("qvi_abstained_total", 2 * sum(marks))
        tagged = native(api, proc.channel, "Tag", NER_TEXTS)
        spans = [s for r in tagged.results for s in r.spans]
        assert spans and all(s.abstained == (s.score < 0.8) for s in spans)
        r = oip_calls(interop_python, proc.address, [{"client": "triton", "rpc": "infer", "model": "sentiment",
                                                      "texts": TEXTS}])
        out = value(r[0])["outputs"]
        assert list(out) == ["label", "probabilities", "abstained"] and out["abstained"]["data"] == marks
        reaches("qvi_abstention_judged_total", 4 * len(TEXTS))
        with open(proc.log_path, encoding="utf-8") as f:  # the operator reads the default in the load's line
            assert "answers below p 0.8 marked abstained unless a request sets its own (serving.json)" in f.read()
    finally:
        proc.stop()
