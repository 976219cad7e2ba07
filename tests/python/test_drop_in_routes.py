"""Text Embeddings Inference's routes (server/http/tei/; docs/serving.md, "Drop-in routes"): POST /predict, POST /,
/models/{m}[/predict] and GET /info answer a classifier in TEI's shapes — the same scores as the native Classify —
and Hugging Face's own InferenceClient (huggingface_hub, pinned in requirements-test.txt) calls them unchanged;
errors take TEI's {"error", "error_type"} form and status codes; the model comes from the path, --default-model or
the store's only model."""
import json
import os
import re
import shutil

import pytest

from qvi_testing import STORE, ServerProcess, drop_in_server, http_call, metric_sum, tei_schema_errors, wait_until

TEXTS = ["a wonderful , moving film", "terrible acting and a boring plot", "it was fine"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = drop_in_server(tmp_path_factory.mktemp("tei"))
    yield proc
    proc.stop()


def native(api, server, model, texts):
    """The native answer's labels per text, best first: [[(label, score), ...], ...]."""
    pb, pbg = api
    answer = pbg.InferenceStub(server.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name=model), texts=texts, options=pb.OutputOptions(top_k=100)),
        timeout=30)
    return [[(s.label, s.score) for s in r.labels] for r in answer.results]


def pairs(predictions):
    assert all(list(p) == ["score", "label"] for p in predictions), predictions  # TEI's order of fields
    return [(p["label"], p["score"]) for p in predictions]


def same(got, want):
    """The same labels in the same order, with the same scores (a batch's other texts move the last digits)."""
    return [label for label, _ in got] == [label for label, _ in want] and \
        [score for _, score in got] == pytest.approx([score for _, score in want], abs=1e-5)


def test_predict_answers_every_label_best_first_in_teis_shapes(api, server):
    want = native(api, server, "sentiment", TEXTS)
    for path in ("/predict", "/", "/models/sentiment/predict", "/models/sentiment"):
        status, one, _ = http_call(server.http_address, "POST", path, {"inputs": TEXTS[0]})
        assert status == 200 and same(pairs(one), want[0]), (path, one)
        status, listed, _ = http_call(server.http_address, "POST", path, {"inputs": [TEXTS[1]], "truncate": True})
        assert status == 200 and same(pairs(listed), want[1]), (path, listed)  # ["text"]: one text
        status, batch, _ = http_call(server.http_address, "POST", path, {"inputs": [[t] for t in TEXTS]})
        assert status == 200 and len(batch) == 3 and all(same(pairs(b), w) for b, w in zip(batch, want)), batch
    topics = native(api, server, "topics", TEXTS[:1])[0]
    status, got, _ = http_call(server.http_address, "POST", "/models/topics/predict", {"inputs": TEXTS[0]})
    assert status == 200 and len(got) == 5 and same(pairs(got), topics)


def test_hugging_faces_inference_client_classifies_unchanged(api, server):
    """InferenceClient(base_url=...) posts {"inputs", "parameters"} to the URL as given and reads a list of
    lists: the default model at /, another at /models/{m}."""
    from huggingface_hub import InferenceClient
    for url, model in ((f"http://{server.http_address}", "sentiment"),
                       (f"http://{server.http_address}/models/topics", "topics")):
        client = InferenceClient(base_url=url, timeout=30)
        got = client.text_classification(TEXTS[0], top_k=2)
        want = native(api, server, model, TEXTS[:1])[0][:2]
        assert len(got) == 2 and same([(e.label, e.score) for e in got], want), (url, got)
    status, nested, _ = http_call(server.http_address, "POST", "/", {"inputs": TEXTS[0], "parameters": {}})
    assert status == 200 and len(nested) == 1 and len(nested[0]) == 2  # every label, in a list of lists


SENTENCES = ["Angela Merkel met Emmanuel Macron in Paris on Monday .", "Zoë works for Siemens in München ."]


def test_hugging_faces_inference_client_tags_unchanged_in_the_pipelines_shape(api, server):
    """POST / and /models/{m} answer as the model is (as TEI's do): a tagger in the token-classification
    pipeline's shape — its entities with their one calibrated score and character offsets, the native Tag's
    spans exactly — so InferenceClient.token_classification reads them; /predict stays classification."""
    from huggingface_hub import InferenceClient
    pb, pbg = api
    native_tag = pbg.InferenceStub(server.channel).Tag(
        pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=SENTENCES), timeout=30)
    want = [[(s.label, s.text, s.start, s.end) for s in r.spans] for r in native_tag.results]
    scores = [[s.score for s in r.spans] for r in native_tag.results]
    assert all(want), want  # the demo tagger finds entities in both
    client = InferenceClient(base_url=f"http://{server.http_address}/models/ner", timeout=30)
    for text, spans, score in zip(SENTENCES, want, scores):
        for strategy in (None, "simple", "first"):
            got = client.token_classification(text, aggregation_strategy=strategy)
            assert [(e.entity_group, e.word, e.start, e.end) for e in got] == spans, (strategy, got)
            assert [e.score for e in got] == pytest.approx(score, abs=1e-6)
            assert all(text[e.start:e.end] == e.word for e in got)  # characters, as Python counts them
    status, batch, _ = http_call(server.http_address, "POST", "/models/ner",
                                 {"inputs": SENTENCES, "parameters": {"ignore_labels": ["O", "LOC"]}})
    assert status == 200 and [[(e["entity_group"], e["word"], e["start"], e["end"]) for e in b] for b in batch] == \
        [[s for s in spans if s[0] != "LOC"] for spans in want], batch
    assert all(list(e) == ["entity_group", "score", "word", "start", "end"] for b in batch for e in b)
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="TokenClassification"', 'code="OK"')
    assert http_call(server.http_address, "POST", "/models/ner", {"inputs": SENTENCES[0]})[0] == 200
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="TokenClassification"',
                                  'code="OK"') == before + 1, "the call counted")
    got = client.token_classification("the weather is fine today .", aggregation_strategy="SIMPLE")
    assert got == []  # no entity: an empty list (the case is read as transformers reads it)
    for parameters, message in (({"aggregation_strategy": "max"}, "parameters.aggregation_strategy: "),
                                ({"aggregation_strategy": "none"}, "sub-word scores"),
                                ({"stride": 16}, "parameters.stride: not read here"),
                                ({"ignore_labels": "O"}, "parameters.ignore_labels: not a list")):
        status, answer, _ = http_call(server.http_address, "POST", "/models/ner",
                                      {"inputs": SENTENCES[0], "parameters": parameters})
        assert (status, answer["error_type"]) == (422, "Validation") and message in answer["error"], answer
    for inputs, status, kind, message in ((["a", 3], 422, "Validation", "inputs[1]: not a text"),
                                          ([], 400, "Empty", "cannot be empty"),
                                          (["a"] * 300, 422, "Validation", "batch size 300")):
        got, answer, _ = http_call(server.http_address, "POST", "/models/ner", {"inputs": inputs})
        assert (got, answer["error_type"]) == (status, kind) and message in answer["error"], answer


def test_explain_gives_each_entity_the_words_and_its_occlusion_as_the_native_tag(api, server):
    """"explain": true in a token-classification body (POST /models/{m}) or a /pooling token_classify body gives
    each entity an "explanation": the text's words, α and β where the tagger has them, and "occlusion" — the
    entity's probability drop without each word (0 on its own) — the native Tag's numbers for the same options."""
    pb, pbg = api
    native_tag = pbg.InferenceStub(server.channel).Tag(pb.TagRequest(
        model=pb.ModelSpec(name="ner"), texts=SENTENCES,
        options=pb.OutputOptions(tokens=True, attention=True, gates=True, occlusion=True)), timeout=30)
    status, hf, _ = http_call(server.http_address, "POST", "/models/ner", {"inputs": SENTENCES, "explain": True})
    assert status == 200, hf
    status, pooled, _ = http_call(server.http_address, "POST", "/pooling",
                                  {"model": "ner", "input": SENTENCES, "explain": True})
    assert status == 200, pooled
    for entities in (hf, [item["entities"] for item in pooled["data"]]):
        for got, want in zip(entities, native_tag.results):
            assert [(e["entity_group"], e["start"], e["end"]) for e in got] == \
                [(s.label, s.start, s.end) for s in want.spans] and got
            for e, span in zip(got, want.spans):
                why = e["explanation"]
                assert [(w["text"], w["start"], w["end"]) for w in why["words"]] == \
                    [(t.text, t.start, t.end) for t in want.tokens]
                assert why["occlusion"] == pytest.approx(list(span.occlusion), abs=1e-5)
                assert len(why["occlusion"]) == len(want.tokens) and any(d != 0 for d in why["occlusion"])
                assert all(why["occlusion"][k] == 0 for k in range(span.token_start, span.token_end))
                for key, field in (("alpha", "attention"), ("beta", "gate")):
                    has = all(t.HasField(field) for t in want.tokens)
                    assert (key in why) == has, key
                    if has:
                        assert why[key] == pytest.approx([getattr(t, field) for t in want.tokens], abs=1e-5)
    # Without it the shapes are the pipeline's and vLLM's alone.
    assert all("explanation" not in e for e in http_call(server.http_address, "POST", "/models/ner",
                                                         {"inputs": SENTENCES[0]})[1])
    status, refused, _ = http_call(server.http_address, "POST", "/models/ner", {"inputs": "a", "explain": "yes"})
    assert (status, refused["error_type"]) == (422, "Validation") and "explain:" in refused["error"], refused


def test_answers_validate_against_teis_own_openapi_schemas(server):
    """TEI's OpenAPI document (proto/tei/openapi.json, vendored from TEI 1.9.3) is what a client generated for TEI
    reads: each request sent here is one of its requests, and each answer — predictions, info, tokens, errors —
    validates against the schema TEI declares for that route and status."""
    calls = (("/predict", {"inputs": TEXTS[0]}, "PredictRequest", 200, "PredictResponse"),
             ("/predict", {"inputs": [[t] for t in TEXTS], "truncate": True}, "PredictRequest", 200, "PredictResponse"),
             ("/predict", {"inputs": TEXTS[0], "truncation_direction": "Right", "raw_scores": False},
              "PredictRequest", 200, "PredictResponse"),
             ("/", {"inputs": TEXTS[1]}, "PredictRequest", 200, "PredictResponse"),
             ("/tokenize", {"inputs": TEXTS[0]}, "TokenizeRequest", 200, "TokenizeResponse"),
             ("/tokenize", {"inputs": TEXTS, "add_special_tokens": False}, "TokenizeRequest", 200, "TokenizeResponse"),
             ("/predict", {"inputs": ""}, "PredictRequest", 400, "ErrorResponse"),
             ("/predict", {"inputs": ["a", "b"]}, "PredictRequest", 422, "ErrorResponse"),
             ("/predict", {"inputs": TEXTS[0], "raw_scores": True}, "PredictRequest", 422, "ErrorResponse"),
             ("/tokenize", {"inputs": ""}, "TokenizeRequest", 400, "ErrorResponse"),
             # The GloVe models decode nothing (test_hf_import.py validates a sub-word model's /decode answer).
             ("/decode", {"ids": [5, 6]}, "DecodeRequest", 422, "ErrorResponse"),
             ("/decode", {"ids": [[]]}, "DecodeRequest", 400, "ErrorResponse"))
    for path, body, request_schema, want_status, answer_schema in calls:
        assert tei_schema_errors(request_schema, body) == [], (path, body)
        status, answer, _ = http_call(server.http_address, "POST", path, body)
        assert status == want_status, (path, body, answer)
        assert tei_schema_errors(answer_schema, answer) == [], (path, body, answer)
    status, info, _ = http_call(server.http_address, "GET", "/info")
    assert status == 200 and tei_schema_errors("Info", info) == [], info
    assert info["tokenization_workers"] >= 1
    # The check can fail: a TEI answer with a field of the wrong type is refused.
    assert tei_schema_errors("PredictResponse", [{"score": "high", "label": "positive"}])
    assert tei_schema_errors("Info", {**info, "tokenization_workers": None})


def test_tokenize_answers_a_word_level_models_words_and_ids(api, server):
    """TEI's /tokenize on a GloVe model: its words, their vocabulary ids and byte offsets — the native answer's
    tokens — always a list per text; /decode needs a sub-word tokenizer (test_hf_import.py has those)."""
    pb, pbg = api
    texts = ["Zoë's café , naïve !", "a wonderful , moving film"]
    answer = pbg.InferenceStub(server.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts, options=pb.OutputOptions(tokens=True)),
        timeout=30)
    want = [[{"id": t.id, "text": t.text, "special": False, "start": t.byte_start, "stop": t.byte_end}
             for t in r.tokens] for r in answer.results]
    for path, inputs in (("/tokenize", texts), ("/models/sentiment/tokenize", texts), ("/tokenize", texts[0])):
        status, got, _ = http_call(server.http_address, "POST", path, {"inputs": inputs})
        assert status == 200 and got == want[:len(got)] and len(got) == (2 if isinstance(inputs, list) else 1), got
    assert [t["text"] for t in want[0]] == ["Zoë", "'", "s", "café", ",", "naïve", "!"]
    assert [t["stop"] - t["start"] for t in want[0]] == [len(t["text"].encode()) for t in want[0]]  # bytes
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="Decode"', 'code="FAILED_PRECONDITION"')
    status, refused, _ = http_call(server.http_address, "POST", "/decode", {"ids": [5, 6]})
    assert (status, refused["error_type"]) == (422, "Validation") and "reads words, not sub-words" in refused["error"]
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="Decode"',
                                  'code="FAILED_PRECONDITION"') == before + 1, "the refusal counted")


def test_explain_adds_the_words_alpha_beta_and_contributions_the_native_answer_has(api, server):
    """"explain": true, QVI's addition in a field TEI's and vLLM's clients ignore: TEI's top prediction and each of
    vLLM's data items carry the text's words with α, β and every label's exact contributions — the native Classify's
    numbers for the same options."""
    pb, pbg = api
    options = pb.OutputOptions(top_k=100, attention=True, gates=True, contributions=True)
    answer = pbg.InferenceStub(server.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS[:2], options=options), timeout=30)
    want = []
    for r in answer.results:
        want.append({"words": [(t.text, t.start, t.end) for t in r.tokens], "alpha": [t.attention for t in r.tokens],
                     "beta": [t.gate for t in r.tokens],
                     "contributions": {label.label: [t.contribution[k] for t in r.tokens]
                                       for k, label in enumerate(r.labels)}})
    assert all(w["words"] and any(w["beta"]) for w in want)

    def same_explanation(got, w):
        assert [(x["text"], x["start"], x["end"]) for x in got["words"]] == w["words"]
        assert got["alpha"] == pytest.approx(w["alpha"], abs=1e-6) and got["beta"] == pytest.approx(w["beta"], abs=1e-6)
        assert set(got["contributions"]) == set(w["contributions"])
        for label, values in w["contributions"].items():
            assert got["contributions"][label] == pytest.approx(values, abs=1e-6), label

    status, tei, _ = http_call(server.http_address, "POST", "/predict", {"inputs": [[t] for t in TEXTS[:2]],
                                                                         "explain": True})
    assert status == 200 and len(tei) == len(want) == 2
    for predictions, w in zip(tei, want):
        assert "explanation" in predictions[0] and all("explanation" not in p for p in predictions[1:])
        same_explanation(predictions[0]["explanation"], w)
    status, vllm, _ = http_call(server.http_address, "POST", "/classify", {"input": TEXTS[:2], "explain": True})
    assert status == 200 and len(vllm["data"]) == 2
    for item, w in zip(vllm["data"], want):
        same_explanation(item["explanation"], w)
    # Without it, nothing is added; a flag that is not true or false is refused, naming it.
    status, plain, _ = http_call(server.http_address, "POST", "/predict", {"inputs": TEXTS[0]})
    assert status == 200 and all(list(p) == ["score", "label"] for p in plain)
    status, refused, _ = http_call(server.http_address, "POST", "/predict", {"inputs": TEXTS[0], "explain": "yes"})
    assert status == 422 and refused["error"] == "explain: not true or false"


def test_pooling_answers_each_words_tag_probabilities_with_the_entities_they_make(api, server):
    """vLLM's /pooling with task token_classify: a row per word of its probability of every tag (the CRF's
    marginals, calibrated), which sums to 1, and from which each entity's score is the mean over its words of its tags' — the native Tag's spans exactly; the words and
    entities ride beside vLLM's fields. classify: every label's probability, the native Classify's."""
    import numpy as np
    pb, pbg = api
    native_tag = pbg.InferenceStub(server.channel).Tag(
        pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=SENTENCES), timeout=30)
    for body in ({"model": "ner", "input": SENTENCES, "task": "token_classify"}, {"model": "ner", "input": SENTENCES}):
        status, got, _ = http_call(server.http_address, "POST", "/pooling", body)
        assert status == 200, got
        assert got["id"].startswith("pooling-") and got["object"] == "list" and got["model"] == "ner"
        tags = got["labels"]
        assert len(got["data"]) == len(native_tag.results) == len(SENTENCES)
        for item, want in zip(got["data"], native_tag.results):
            rows = np.array(item["data"])
            assert item["object"] == "pooling" and rows.shape == (len(item["words"]), len(tags))
            assert np.allclose(rows.sum(axis=1), 1.0, atol=1e-4)
            assert [(w["text"], w["start"], w["end"]) for w in item["words"]] == \
                [(t.text, t.start, t.end) for t in want.tokens]
            assert [w["tag"] for w in item["words"]] == [t.tag for t in want.tokens]
            assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in item["entities"]] == \
                [(s.label, s.text, s.start, s.end) for s in want.spans]
            for e, span in zip(item["entities"], want.spans):
                decoded = [tags.index(item["words"][k]["tag"]) for k in range(span.token_start, span.token_end)]
                mean = np.mean([rows[k, d] for k, d in zip(range(span.token_start, span.token_end), decoded)])
                assert e["score"] == pytest.approx(span.score, abs=1e-6) and mean == pytest.approx(span.score, abs=1e-5)
    status, got, _ = http_call(server.http_address, "POST", "/pooling", {"model": "topics", "input": TEXTS[0]})
    assert status == 200 and got["labels"] and len(got["data"][0]["data"]) == len(got["labels"])
    want = dict(native(api, server, "topics", TEXTS[:1])[0])
    assert got["data"][0]["data"] == pytest.approx([want[label] for label in got["labels"]], abs=1e-6)
    for body, message in (({"input": "a", "task": "embed"}, "task: \"token_classify\" or \"classify\""),
                          ({"input": "a", "encoding_format": "base64"}, "encoding_format: only \"float\""),
                          ({"input": "a", "dimensions": 8}, "dimensions: not read here"),
                          ({"model": "sentiment", "input": "a", "task": "token_classify"}, "classification model")):
        status, refused, _ = http_call(server.http_address, "POST", "/pooling", body)
        assert status == 400 and refused["error"]["type"] == "BadRequestError", refused
        assert message in refused["error"]["message"], refused


def test_refusals_take_teis_form_and_status(server):
    long_text = " ".join(["good"] * 400)  # more tokens than the demo model reads
    for body, path, status, kind, message in (
            ({"inputs": ["q", "d"]}, "/predict", 422, "Validation", "inputs: a pair of texts"),
            ({"inputs": ""}, "/predict", 400, "Empty", "`inputs` cannot be empty"),
            ({"inputs": "a", "raw_scores": True}, "/predict", 422, "Validation", "raw_scores: the models' logits"),
            ({"inputs": long_text, "truncate": False}, "/predict", 422, "Validation", "exceed model 'sentiment'"),
            ({"inputs": [["a"]] * 300}, "/predict", 422, "Validation", "batch size 300 > maximum allowed batch size"),
            ({"inputs": "a"}, "/models/nope/predict", 404, "Validation", "nope"),
            ({"inputs": "Anna went to Paris"}, "/models/ner/predict", 422, "Validation", "model 'ner' is a tagging model"),
            ({"inputs": "x" * (10 << 20)}, "/predict", 422, "Validation", "bytes")):
        got, answer, _ = http_call(server.http_address, "POST", path, body)
        assert (got, answer["error_type"]) == (status, kind) and message in answer["error"], (body.keys(), answer)
        assert list(answer) == ["error", "error_type"]
    # A body that is not JSON, or whose cost is out of bounds, is refused before anything is built from it.
    for body, message in ((b"[" * 10000, "nested deeper than 16 levels"), (b'{"inputs": "\xff\xfe"}', "UTF-8"),
                          (b'{"inputs": "a"', "request body")):
        got, answer, _ = http_call(server.http_address, "POST", "/predict", body)
        assert (got, answer["error_type"]) == (422, "Validation") and message in answer["error"], (body[:20], answer)
    # Routing's refusals on TEI's paths take TEI's form too.
    got, answer, headers = http_call(server.http_address, "GET", "/predict")
    assert (got, headers["Allow"], answer["error_type"]) == (405, "POST, OPTIONS", "Validation"), answer
    got, answer, _ = http_call(server.http_address, "POST", "/models/sentiment/embed", {"inputs": "a"})
    assert got == 404 and "TEI's routes for a model are" in answer["error"] and answer["error_type"] == "Validation"
    got, _, headers = http_call(server.http_address, "OPTIONS", "/")
    assert got == 204 and headers["Allow"] == "GET, POST, OPTIONS"
    # The same long text with truncation (TEI's default) is answered, cut at the model's max_tokens.
    assert http_call(server.http_address, "POST", "/predict", {"inputs": long_text})[0] == 200


def test_scores_are_the_native_floats_written_shortest(server):
    """A score is the native answer's float32, written as the shortest decimal that reads back as it (as TEI's
    serde writes an f32: 0.9855092, not its double's 0.9855092167854309)."""
    import numpy as np
    _, tei, _ = http_call(server.http_address, "POST", "/predict", {"inputs": TEXTS[0]}, raw=True)
    _, native_json, _ = http_call(server.http_address, "POST", "/v1/models/sentiment:classify",
                                  {"texts": [TEXTS[0]], "options": {"topK": 2}}, raw=True)
    ours = re.findall(rb'"score": ?([0-9.e-]+)', tei)
    theirs = re.findall(rb'"score": ?([0-9.e-]+)', native_json)  # protobuf's JSON: nine significant digits
    assert [np.float32(float(x)) for x in ours] == [np.float32(float(x)) for x in theirs], (tei, native_json)
    assert all(len(a) <= len(b) for a, b in zip(ours, theirs)) and any(len(a) < len(b) for a, b in zip(ours, theirs))


def test_info_names_the_model_its_labels_and_limits(api, server):
    pb, pbg = api
    md = pbg.InferenceStub(server.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="topics")),
                                                     timeout=10).model.versions[0].metadata
    for path, model in (("/info", "sentiment"), ("/models/topics/info", "topics")):
        status, info, _ = http_call(server.http_address, "GET", path)
        assert status == 200 and info["model_id"] == model == info["served_model_name"], info
        labels = info["model_type"]["classifier"]["id2label"]
        assert info["model_type"]["classifier"]["label2id"] == {v: int(k) for k, v in labels.items()}
        assert info["max_input_length"] > 0 and info["max_client_batch_size"] == 256 and info["auto_truncate"]
    assert list(labels.values()) == list(md.labels) and info["max_input_length"] == md.tokenizer.max_tokens
    status, tagger, _ = http_call(server.http_address, "GET", "/models/ner/info")
    assert status == 200 and "token_classifier" in tagger["model_type"]


def test_predict_is_counted_as_every_call_is(server):
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="Predict"', 'code="OK"')
    assert http_call(server.http_address, "POST", "/predict", {"inputs": TEXTS[0]})[0] == 200
    after = metric_sum(server.metrics(), "qvi_requests_total", 'method="Predict"', 'code="OK"')
    assert after == before + 1


def test_without_a_default_the_only_model_answers_and_several_must_be_named(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(os.path.join(STORE, "sentiment"), store / "sentiment")
    proc = ServerProcess(str(store), str(tmp_path))
    try:
        assert http_call(proc.http_address, "POST", "/predict", {"inputs": TEXTS[0]})[0] == 200
        shutil.copytree(os.path.join(STORE, "topics"), store / "topics")
        proc.stop()
        proc = ServerProcess(str(store), str(tmp_path))
        for method, path, body in (("POST", "/predict", {"inputs": "a"}), ("GET", "/info", None)):
            status, answer, _ = http_call(proc.http_address, method, path, body)
            assert status == 422 and answer["error"] == (
                "no model named: this server holds 2 models (sentiment, topics); call /models/{m}/predict, or start "
                "it with --default-model"), answer
        assert http_call(proc.http_address, "POST", "/models/topics/predict", {"inputs": "a"})[0] == 200
    finally:
        proc.stop()


# --- OpenAI-style /classify, as vLLM serves it -----------------------------------------------------------------
def test_classify_answers_as_vllm_does_with_the_native_scores(api, server):
    """vLLM's ClassificationResponse: an id, "list", a unix time, the model, per text its top label and every
    label's probability in the model's label order, and the tokens read."""
    import time
    pb, pbg = api
    labels = list(pbg.InferenceStub(server.channel).GetModel(
        pb.GetModelRequest(model=pb.ModelSpec(name="topics")), timeout=10).model.versions[0].metadata.labels)
    want = native(api, server, "topics", TEXTS)
    for path in ("/classify", "/v1/classify"):
        t0 = int(time.time())
        status, got, headers = http_call(server.http_address, "POST", path, {"model": "topics", "input": TEXTS},
                                         {"X-Request-Id": "vllm-client-1"})
        assert status == 200, got
        assert list(got) == ["id", "object", "created", "model", "data", "usage"]
        assert (got["id"], got["object"], got["model"]) == ("classify-vllm-client-1", "list", "topics")
        assert t0 <= got["created"] <= time.time() + 1
        assert [d["index"] for d in got["data"]] == [0, 1, 2]
        for d, w in zip(got["data"], want):
            assert d["num_classes"] == len(labels) == len(d["probs"]) and d["label"] == w[0][0]
            assert dict(zip(labels, d["probs"])) == pytest.approx(dict(w), abs=1e-5)
        usage = got["usage"]
        assert usage["prompt_tokens"] == usage["total_tokens"] > len(TEXTS) and usage["completion_tokens"] == 0
        assert "completion_tokens_details" in usage and usage["completion_tokens_details"] is None
    status, one, _ = http_call(server.http_address, "POST", "/classify", {"input": TEXTS[0]})  # the default model
    assert status == 200 and one["model"] == "sentiment" and len(one["data"]) == 1


def test_v1_models_answers_vllms_model_list_beside_the_native_one(api, server):
    """GET /v1/models is both ListModels' path and vLLM's: the one body holds the native "models" and OpenAI's
    {"object": "list", "data": [{"id", "object": "model", "created", "owned_by", "root", "parent",
    "max_model_len"}]}, one card per model a request reaches (a READY version)."""
    import time
    pb, pbg = api
    t0 = int(time.time())
    status, got, _ = http_call(server.http_address, "GET", "/v1/models")
    assert status == 200, got
    ready = {m["name"]: m["versions"] for m in got["models"]
             if any(v["state"] == "MODEL_STATE_READY" for v in m["versions"])}
    assert got["object"] == "list" and [c["id"] for c in got["data"]] == sorted(ready) and len(ready) >= 3
    for card in got["data"]:
        assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len"]
        assert card["object"] == "model" and card["owned_by"] == "qvi-serve" and card["parent"] is None
        assert t0 <= card["created"] <= time.time() + 1
        newest = pbg.InferenceStub(server.channel).GetModel(
            pb.GetModelRequest(model=pb.ModelSpec(name=card["id"])), timeout=10).model.versions[0].metadata
        assert card["max_model_len"] == newest.tokenizer.max_tokens > 0
        info = http_call(server.http_address, "GET", f"/models/{card['id']}/info")[1]
        assert card["root"] == info["model_id"] and info["served_model_name"] == card["id"]


def test_classify_refuses_in_openais_form(server):
    for body, status, kind, message in (
            ({"model": "nope", "input": "a"}, 404, "NotFoundError", "nope"),
            ({"input": [1, 2, 3]}, 400, "BadRequestError", "input[0]: token ids are not read here"),
            ({"input": "a", "use_activation": False}, 400, "BadRequestError", "use_activation: false asks for logits"),
            ({"input": []}, 400, "BadRequestError", "input: a text or a list of texts"),
            ({"model": "ner", "input": "Anna went to Paris"}, 400, "BadRequestError", "is a tagging model"),
            ({"messages": [{"role": "user", "content": "a"}]}, 400, "BadRequestError", "messages: the chat form")):
        got, answer, _ = http_call(server.http_address, "POST", "/v1/classify", body)
        error = answer["error"]
        assert (got, error["type"], error["code"]) == (status, kind, status) and message in error["message"], answer
        assert list(error) == ["message", "type", "param", "code"]
    got, answer, headers = http_call(server.http_address, "GET", "/classify")
    assert (got, headers["Allow"], answer["error"]["code"]) == (405, "POST, OPTIONS", 405), answer
