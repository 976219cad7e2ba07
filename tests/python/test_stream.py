"""ClassifyStream and TagStream (proto/qvi/serving/v1/inference.proto) with grpcio against the demo
models: each request of a stream is answered once, with its index and id, as the unary call answers
it; a request's error is its own answer and the stream goes on; an API key is asked for once per
stream and rate limits per request; the stream's deadline ends it."""
import hashlib
import json
import threading

import grpc
import pytest

from qvi_testing import ServerProcess, STORE, wait_until

TEXTS = ["A moving, funny film.", "Dull and far too long.", "The cast is superb but the plot wanders.",
         "I would not watch it again.", "An instant classic.", "Flat, lifeless and predictable."]


def by_index(answers):
    out = {}
    for a in answers:
        assert a.index not in out, f"index {a.index} answered twice"
        out[a.index] = a
    return out


def same_answer(a, b):
    """Equal labels and tokens, and equal numbers to float precision, not to the bit: a text batched with
    other texts than in the unary call may come out another last bit (a GEMM's sums follow the batch's
    shape), and rounding both to 5 places would split 0.112295 from 0.112294999."""
    assert [l.label for l in a.labels] == [l.label for l in b.labels]
    assert [l.score for l in a.labels] == pytest.approx([l.score for l in b.labels], abs=1e-5)
    assert [t.text for t in a.tokens] == [t.text for t in b.tokens]
    values = lambda result: [x for t in result.tokens for x in (t.attention, t.gate)]  # noqa: E731
    assert values(a) == pytest.approx(values(b), abs=1e-5)


def test_a_stream_answers_every_request_as_the_unary_call_does(server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    options = pb.OutputOptions(top_k=2, attention=True, gates=True)
    requests = [pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[TEXTS[i % len(TEXTS)]],
                                   options=options, request_id=f"r{i}") for i in range(60)]
    answers = by_index(stub.ClassifyStream(iter(requests), timeout=60))
    assert sorted(answers) == list(range(60))
    for i, request in enumerate(requests):
        a = answers[i]
        assert a.WhichOneof("answer") == "response", a
        assert a.request_id == f"r{i}" and a.response.request_id == f"r{i}"
        unary = stub.Classify(request, timeout=30)
        same_answer(a.response.results[0], unary.results[0])

    tag = [pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=["Angela Merkel visited Paris in May."]),
           pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=["Google opened an office in Zurich.", "x"])]
    answers = by_index(stub.TagStream(iter(tag), timeout=60))
    for i, request in enumerate(tag):
        unary = stub.Tag(request, timeout=30)
        assert len(answers[i].response.results) == len(unary.results)
        for a, b in zip(answers[i].response.results, unary.results):
            where = lambda result: [(s.label, s.start, s.end, s.text) for s in result.spans]  # noqa: E731
            assert where(a) == where(b)
            assert [s.score for s in a.spans] == pytest.approx([s.score for s in b.spans], abs=1e-5)
            tagged = lambda result: [(t.text, t.start, t.end, t.tag) for t in result.tokens]  # noqa: E731
            assert tagged(a) == tagged(b)
        assert answers[i].request_id.startswith("req-")  # made up, as for a unary call


def test_a_requests_error_is_its_own_answer_and_the_stream_goes_on(server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    sentiment = pb.ModelSpec(name="sentiment")
    requests = [pb.ClassifyRequest(model=sentiment, texts=["fine"]),
                pb.ClassifyRequest(model=pb.ModelSpec(name="missing"), texts=["x"]),
                pb.ClassifyRequest(model=sentiment, texts=["a" * 70000]),
                pb.ClassifyRequest(model=sentiment, texts=["x"] * 257),
                pb.ClassifyRequest(model=pb.ModelSpec(name="ner"), texts=["x"]),
                pb.ClassifyRequest(model=sentiment, texts=["still answered"], request_id="last")]
    answers = by_index(stub.ClassifyStream(iter(requests), timeout=60))
    assert answers[0].WhichOneof("answer") == "response"
    expected = {1: (grpc.StatusCode.NOT_FOUND, "models: "), 2: (grpc.StatusCode.INVALID_ARGUMENT, "limit of 65536 bytes"),
                3: (grpc.StatusCode.INVALID_ARGUMENT, "texts"), 4: (grpc.StatusCode.INVALID_ARGUMENT, "call Tag")}
    for i, (code, words) in expected.items():
        assert answers[i].WhichOneof("answer") == "error", answers[i]
        assert answers[i].error.code == code.value[0], answers[i]
        assert words in answers[i].error.message, answers[i]
    assert answers[5].response.request_id == "last"


def test_the_streams_deadline_ends_it_and_its_requests_are_counted_by_method(server_process, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server_process.channel)
    def counted():
        return sum(v for k, v in server_process.metrics().items() if k.startswith("qvi_requests_total{")
                   and 'method="ClassifyStream"' in k and 'model="sentiment"' in k and 'code="OK"' in k)

    before = counted()
    hold = threading.Event()

    def requests():
        yield pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["one request"])
        hold.wait(30)  # the client keeps the stream open past its deadline

    stream = stub.ClassifyStream(requests(), timeout=1.0)
    first = next(stream)
    assert first.WhichOneof("answer") == "response"
    with pytest.raises(grpc.RpcError) as e:
        next(stream)
    hold.set()
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: counted() == before + 1, "the stream's request counted under its method")


def test_a_stream_asks_for_the_key_once_and_rate_limits_each_request(api, tmp_path):
    pb, pb_grpc = api
    keys = tmp_path / "keys.json"
    key = "k-batch-0123456789abcdef"
    # A bucket of 3 texts refilled at one a second: six requests sent at once meet it.
    keys.write_text(json.dumps({"keys": [{"name": "batch", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                          "scopes": ["infer"],
                                          "limits": {"texts_per_second": 1, "burst_seconds": 3}}]}))
    proc = ServerProcess(STORE, str(tmp_path), "--api-keys", str(keys))
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"])
        with pytest.raises(grpc.RpcError) as e:
            list(stub.ClassifyStream(iter([request]), timeout=30))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

        metadata = (("authorization", f"Bearer {key}"),)
        answers = by_index(stub.ClassifyStream(iter([request] * 6), timeout=30, metadata=metadata))
        kinds = [answers[i].WhichOneof("answer") for i in range(6)]
        assert kinds.count("response") >= 3, kinds  # the burst
        refused = [answers[i].error for i in range(6) if kinds[i] == "error"]
        assert refused, "6 texts at once over a burst of 3 should meet the limit"
        for error in refused:
            assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and error.retry_after_ms > 0, error
    finally:
        proc.stop()
