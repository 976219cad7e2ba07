"""Spans over OTLP/HTTP (--otlp-endpoint; docs/observability.md "Traces") to a receiver that decodes them
with OpenTelemetry's own opentelemetry-proto package: a call's span under the caller's traceparent with
its children, the batch's span linked to it, the attributes; sampling by ratio and by the caller's flag;
a collector that is down or slow costs the calls nothing and its spans are counted."""
import time

import grpc
import pytest

from qvi_testing import STORE, OtlpReceiver, ServerProcess, wait_until

trace_service_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Receiver(OtlpReceiver):
    """Spans: each POST decoded as an ExportTraceServiceRequest; `delay` seconds before answering (a slow
    collector)."""

    def __init__(self, delay=0.0):
        super().__init__(trace_service_pb2.ExportTraceServiceRequest, delay)

    @property
    def spans(self):
        return [s for r in self.received() for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]

    @property
    def resources(self):
        return [{kv.key: kv.value.string_value for kv in rs.resource.attributes}
                for r in self.received() for rs in r.resource_spans]

    def named(self, name):
        return [s for s in self.spans if s.name == name]


def attributes(span):
    out = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def classify(pb, stub, text, traceparent=None):
    metadata = (("traceparent", traceparent),) if traceparent else None
    return stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[text],
                                            options=pb.OutputOptions(gates=True)), timeout=30, metadata=metadata)


def test_a_call_is_a_span_tree_under_the_callers_traceparent_and_its_batch_links_to_it(api, tmp_path):
    pb, pb_grpc = api
    receiver = Receiver()
    proc = ServerProcess(STORE, str(tmp_path), "--otlp-endpoint", receiver.endpoint, "--otlp-sampling-ratio", "0",
                         "--otlp-resource-attributes", "deployment.environment=test")
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        answer = classify(pb, stub, "A moving, funny film.", TRACEPARENT)
        classify(pb, stub, "not sampled: no traceparent at a ratio of 0")
        classify(pb, stub, "not sampled: its caller said so", TRACEPARENT[:-2] + "00")
        last = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        classify(pb, stub, "sampled again, after the others", last)
        wait_until(lambda: len(receiver.named("Classify")) >= 2 and receiver.named("qvi.batch"),
                   "the spans (flushed each second)")
        calls = receiver.named("Classify")
        assert sorted(c.trace_id.hex() for c in calls) == ["0af7651916cd43dd8448eb211c80319c",
                                                            "4bf92f3577b34da6a3ce929d0e0e4736"], \
            [attributes(c) for c in calls]
        call = [c for c in calls if c.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"][0]
        assert call.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert call.parent_span_id.hex() == "00f067aa0ba902b7"
        assert call.kind == call.SPAN_KIND_SERVER
        a = attributes(call)
        assert a["qvi.model"] == "sentiment" and a["qvi.version"] == answer.model.version
        assert a["qvi.texts"] == 1 and a["qvi.tokens"] > 0 and a["qvi.answer_bytes"] > 0
        assert a["qvi.outputs"] == "gates" and a["rpc.grpc.status_code"] == 0
        children = {s.name: s for s in receiver.spans if s.parent_span_id == call.span_id}
        assert set(children) == {"qvi.prepare", "qvi.queue", "qvi.postprocess", "qvi.answer"}, set(children)
        for child in children.values():
            assert child.trace_id == call.trace_id
            assert call.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
            assert child.end_time_unix_nano <= call.end_time_unix_nano + 1_000_000  # clock offsets, 1 ms
        batches = [b for b in receiver.named("qvi.batch") if any(l.span_id == call.span_id for l in b.links)]
        assert len(batches) == 1, "the batch that ran the text links to its call"
        batch = batches[0]
        assert batch.trace_id != call.trace_id and not batch.parent_span_id
        assert attributes(batch)["qvi.batch.texts"] >= 1 and attributes(batch)["qvi.model"] == "sentiment"
        assert receiver.resources[0]["service.name"] == "qvi-server"
        assert receiver.resources[0]["deployment.environment"] == "test"
        assert proc.metrics().get('qvi_otlp_spans_total{outcome="exported"}', 0) >= 6
    finally:
        proc.stop()
        receiver.close()


def test_an_error_is_the_calls_status_and_a_stream_gives_each_request_a_span(api, tmp_path):
    pb, pb_grpc = api
    receiver = Receiver()
    proc = ServerProcess(STORE, str(tmp_path), "--otlp-endpoint", receiver.endpoint)  # every call sampled
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        with pytest.raises(grpc.RpcError):
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="missing"), texts=["x"]), timeout=30)
        requests = [pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[f"text {i}"]) for i in range(3)]
        list(stub.ClassifyStream(iter(requests), timeout=30, metadata=(("traceparent", TRACEPARENT),)))
        wait_until(lambda: receiver.named("Classify") and len(receiver.named("ClassifyStream")) == 3,
                   "the spans of the refused call and of the stream's three requests")
        refused = receiver.named("Classify")[0]
        assert refused.status.code == refused.status.STATUS_CODE_ERROR
        assert refused.status.message.startswith("NOT_FOUND")
        assert not [s for s in receiver.spans if s.parent_span_id == refused.span_id], "refused before the queue"
        for s in receiver.named("ClassifyStream"):
            assert s.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
            assert s.parent_span_id.hex() == "00f067aa0ba902b7"
        assert len({s.span_id for s in receiver.named("ClassifyStream")}) == 3
    finally:
        proc.stop()
        receiver.close()


def test_a_collector_down_or_slow_costs_the_calls_nothing_and_its_spans_are_counted(api, tmp_path):
    pb, pb_grpc = api
    probe = Receiver()
    down = probe.endpoint
    probe.close()  # nothing listens there now
    for sub in ("down", "slow"):
        (tmp_path / sub).mkdir()
    proc = ServerProcess(STORE, str(tmp_path / "down"), "--otlp-endpoint", down, "--otlp-timeout-seconds", "0.5")
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        for i in range(5):
            assert classify(pb, stub, f"text {i}").results[0].labels
        wait_until(lambda: proc.metrics().get('qvi_otlp_spans_total{outcome="failed"}', 0) >= 5,
                   "the failed exports counted")
    finally:
        proc.stop()

    slow = Receiver(delay=5)
    proc = ServerProcess(STORE, str(tmp_path / "slow"), "--otlp-endpoint", slow.endpoint, "--otlp-queue-spans", "8",
                         "--otlp-timeout-seconds", "1")
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        for i in range(40):  # 6 spans each: far more than the queue holds while the collector dawdles
            assert classify(pb, stub, f"text {i}").results[0].labels
        wait_until(lambda: proc.metrics().get('qvi_otlp_spans_total{outcome="dropped"}', 0) > 0,
                   "spans dropped from the full queue")
    finally:
        proc.stop()
        slow.close()
