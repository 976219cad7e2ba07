"""The decision log (server/frontend/decision_log.h; docs/observability.md, "The decision log"): sampled JSON lines
of what each call decided, read back here — the caller's labels or spans with their scores, the words that
contributed most when the answer has them, the texts' SHA-256 (and the texts with --decision-log-texts), the
artifact's digest, the request id — rotated at --decision-log-max-bytes with --decision-log-keep files, never a
line split; a model's own rate chooses which calls are logged; the texts masked by the server's own tagger
(--redact-texts-with), never written unmasked; the lines sent to an OTLP collector as log records, decoded
with OpenTelemetry's own package."""
import glob
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from qvi_testing import SERVER, STORE, OtlpReceiver, ServerProcess, masked, metric_sum, wait_until

TEXTS = ["a wonderful , moving film", "terrible acting and a boring plot", "it was fine", "a dull , lifeless mess"]
SENTENCES = ["Angela Merkel met Barack Obama in Berlin on Tuesday .", "Apple opened an office in Paris ."]


def store_copy(work):
    store = os.path.join(work, "store")
    for name in ("sentiment", "ner"):
        os.makedirs(os.path.join(store, name, "1"))
        shutil.copy(os.path.join(STORE, name, "1", "model.pt"), os.path.join(store, name, "1"))
        with open(os.path.join(store, name, "serving.json"), "w") as f:
            json.dump({"format": "torchscript"}, f)
    return store


def lines_of(path):
    out = []
    for file in sorted(glob.glob(path + "*")):
        with open(file, "rb") as f:
            data = f.read()
        assert data.endswith(b"\n"), f"{file}: a line cut at its end"
        out += [json.loads(line) for line in data.decode().splitlines()]
    return out


def sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


def test_each_call_is_logged_with_its_decision_and_the_files_rotate(api, tmp_path):
    pb, pbg = api
    store = store_copy(str(tmp_path))
    log = os.path.join(tmp_path, "decisions.jsonl")
    with ServerProcess(store, str(tmp_path), "--decision-log", log, "--decision-log-max-bytes", "4096",
                       "--decision-log-keep", "2", "--decision-log-texts") as proc:
        stub = pbg.InferenceStub(proc.channel)
        answers = {}
        for i in range(30):
            explain = i % 2 == 0
            rid = f"call-{i}"
            answers[rid] = ("classify", TEXTS, stub.Classify(pb.ClassifyRequest(
                model=pb.ModelSpec(name="sentiment"), texts=TEXTS, request_id=rid,
                options=pb.OutputOptions(top_k=2, tokens=explain, contributions=explain)), timeout=30))
        for i in range(6):
            rid = f"tag-{i}"
            answers[rid] = ("tag", SENTENCES, stub.Tag(pb.TagRequest(
                model=pb.ModelSpec(name="ner"), texts=SENTENCES, request_id=rid), timeout=30))
        wait_until(lambda: metric_sum(proc.metrics(), "qvi_decision_log_lines_total") == len(answers),
                   "every call's line written")
        assert metric_sum(proc.metrics(), "qvi_decision_log_dropped_lines_total") == 0
    files = sorted(glob.glob(log + "*"))
    assert files == [log, log + ".1", log + ".2"], files  # rotated, two older files kept
    assert all(os.path.getsize(f) <= 4096 for f in files)
    lines = lines_of(log)
    assert 0 < len(lines) < len(answers)  # the oldest went with the rotation
    digests = {name: hashlib.sha256(open(os.path.join(store, name, "1", "model.pt"), "rb").read()).hexdigest()
               for name in ("sentiment", "ner")}
    seen = set()
    for line in lines:
        rid = line["request_id"]
        assert rid in answers and rid not in seen, rid
        seen.add(rid)
        kind, texts, answer = answers[rid]
        assert list(line)[:8] == ["time", "model", "version", "artifact_sha256", "key", "request_id", "trace_id",
                                  "latency_ms"]
        assert line["model"] == ("sentiment" if kind == "classify" else "ner") and line["version"] == 1
        assert line["artifact_sha256"] == digests[line["model"]] and line["key"] == "" and line["latency_ms"] > 0
        assert [t["sha256"] for t in line["texts"]] == [sha256(t) for t in texts]
        assert [t["text"] for t in line["texts"]] == texts
        for logged, result in zip(line["texts"], answer.results):
            if kind == "classify":
                assert [(x["label"], x["score"]) for x in logged["labels"]] == \
                    [(s.label, pytest.approx(s.score, abs=1e-6)) for s in result.labels]
                if result.tokens:  # explained: the words that contributed most to the top label
                    best = max(result.tokens, key=lambda t: t.contribution[0])
                    assert logged["top_words"][0] == {"word": best.text,
                                                      "contribution": pytest.approx(best.contribution[0], abs=1e-6)}
                    assert len(logged["top_words"]) == min(5, len(result.tokens))
                else:
                    assert logged["top_words"] == []
            else:
                assert [(x["type"], x["start"], x["end"]) for x in logged["spans"]] == \
                    [(s.label, s.start, s.end) for s in result.spans]
                assert [x["score"] for x in logged["spans"]] == pytest.approx([s.score for s in result.spans],
                                                                              abs=1e-6)


def test_a_models_own_rate_chooses_what_is_logged_and_texts_stay_out_by_default(api, tmp_path):
    pb, pbg = api
    store = store_copy(str(tmp_path))
    log = os.path.join(tmp_path, "decisions.jsonl")
    with ServerProcess(store, str(tmp_path), "--decision-log", log, "--decision-log-rate", "0",
                       "--decision-log-model-rate", "ner=1") as proc:
        stub = pbg.InferenceStub(proc.channel)
        for _ in range(5):
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS), timeout=30)
            stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=SENTENCES), timeout=30)
        wait_until(lambda: metric_sum(proc.metrics(), "qvi_decision_log_lines_total") == 5, "the tagger's lines")
    lines = lines_of(log)
    assert len(lines) == 5 and {line["model"] for line in lines} == {"ner"}
    assert all("text" not in t and len(t["sha256"]) == 64 for line in lines for t in line["texts"])


def test_a_bad_rate_or_path_stops_the_server_naming_the_flag(tmp_path):
    store = store_copy(str(tmp_path))
    for args, message in ((["--decision-log", os.path.join(tmp_path, "d.jsonl"), "--decision-log-model-rate",
                            "ner=2"], "--decision-log-model-rate: 'ner=2' is not NAME=RATE"),
                          (["--decision-log", os.path.join(tmp_path, "no", "such", "dir", "d.jsonl")],
                           "--decision-log: cannot open"),
                          (["--decision-log-otlp-endpoint", "https://collector:4318"],
                           "--decision-log-otlp-endpoint: 'https://collector:4318' is not http://host:port")):
        out = subprocess.run([SERVER, "--model-store", store, "--port", "0", "--metrics-port", "-1",
                              "--http-port", "-1", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and message in out.stdout + out.stderr, out.stderr[-2000:]


def test_texts_are_written_with_the_taggers_entities_masked_or_not_at_all(api, tmp_path):
    pb, pbg = api
    store = store_copy(str(tmp_path))
    log = os.path.join(tmp_path, "decisions.jsonl")
    long_text = "Paris " * 1200  # past the tagger's max_tokens: it cannot vouch for the tail
    with ServerProcess(store, str(tmp_path), "--decision-log", log, "--decision-log-texts",
                       "--redact-texts-with", "ner", "--redact-types", "PER,LOC") as proc:
        stub = pbg.InferenceStub(proc.channel)
        tagged = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=SENTENCES), timeout=30)
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=SENTENCES, request_id="c"),
                      timeout=30)
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[long_text], request_id="long"),
                      timeout=30)
        explained = stub.Classify(pb.ClassifyRequest(
            model=pb.ModelSpec(name="sentiment"), texts=SENTENCES, request_id="x",
            options=pb.OutputOptions(tokens=True, contributions=True)), timeout=30)
        wait_until(lambda: metric_sum(proc.metrics(), "qvi_decision_log_lines_total") == 4, "four lines")
        assert metric_sum(proc.metrics(), "qvi_decision_log_redaction_failures_total") == 1
        # The redactions are the server's own requests, not callers' traffic: the tagger's drift window holds the
        # texts of the one Tag call above alone.
        assert metric_sum(proc.metrics(), "qvi_drift_window", 'model="ner"', 'what="texts"') == len(SENTENCES)
    lines = {line["request_id"]: line for line in lines_of(log)}
    expected = [masked(t, r.spans, ("PER", "LOC")) for t, r in zip(SENTENCES, tagged.results)]
    assert "[PER]" in expected[0] and "[LOC]" in expected[0] and "Apple" in expected[1], expected  # ORG is kept
    assert [t["text"] for t in lines["c"]["texts"]] == expected
    assert lines["c"]["redacted_with"] == "ner" and "redaction_error" not in lines["c"]
    assert [t["sha256"] for t in lines["c"]["texts"]] == [sha256(t) for t in SENTENCES]  # of the text as sent
    assert lines["long"]["texts"][0]["text"] is None
    assert "longer than the redaction model 'ner' reads" in lines["long"]["redaction_error"]
    # A top word inside a masked entity is masked as the entity is.
    for text, answer, tagged_text, entry in zip(SENTENCES, explained.results, tagged.results, lines["x"]["texts"]):
        masked_words = {t.text for t in answer.tokens
                        if any(s.label in ("PER", "LOC") and s.start <= t.start < s.end for s in tagged_text.spans)}
        assert entry["top_words"], entry
        for w in entry["top_words"]:
            assert w["word"] not in masked_words, (w, masked_words)
    assert any(w["word"] in ("[PER]", "[LOC]") for e in lines["x"]["texts"] for w in e["top_words"]), lines["x"]
    assert "Merkel" not in open(log).read()
    # A type the tagger does not have fails the redaction, naming the types it has.
    with ServerProcess(store, str(tmp_path), "--decision-log", log + ".typo", "--decision-log-texts",
                       "--redact-texts-with", "ner", "--redact-types", "PERSON", name="typo") as proc:
        pbg.InferenceStub(proc.channel).Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"),
                                                                    texts=SENTENCES), timeout=30)
        wait_until(lambda: metric_sum(proc.metrics(), "qvi_decision_log_lines_total") == 1, "the line")
    typo = lines_of(log + ".typo")[0]
    assert "--redact-types: 'PERSON' is not one of 'ner''s entity types" in typo["redaction_error"], typo
    assert [t["text"] for t in typo["texts"]] == [None, None]


def test_each_line_is_an_otlp_log_record_beside_the_file_or_alone(api, tmp_path):
    logs_pb2 = pytest.importorskip("opentelemetry.proto.collector.logs.v1.logs_service_pb2")
    pb, pbg = api
    store = store_copy(str(tmp_path))
    log = os.path.join(tmp_path, "decisions.jsonl")
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    receiver = OtlpReceiver(logs_pb2.ExportLogsServiceRequest)
    try:
        with ServerProcess(store, str(tmp_path), "--decision-log", log, "--decision-log-otlp-endpoint",
                           receiver.endpoint, "--otlp-resource-attributes", "deployment.environment=test") as proc:
            stub = pbg.InferenceStub(proc.channel)
            for i in range(4):
                stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS,
                                                 request_id=f"r{i}"), timeout=30,
                              metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
            stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=SENTENCES, request_id="t"), timeout=30)

            def records():
                return [(rl, lr) for r in receiver.received() for rl in r.resource_logs for sl in rl.scope_logs
                        for lr in sl.log_records]
            wait_until(lambda: len(records()) == 5, "five log records")
            assert metric_sum(proc.metrics(), "qvi_decision_log_otlp_exported_total") == 5
        lines = {line["request_id"]: line for line in lines_of(log)}
        assert set(receiver.paths) == {"/v1/logs"}
        for resource, record in records():
            line = json.loads(record.body.string_value)
            assert line == lines[line["request_id"]]  # the file's line, digest and all
            assert record.event_name == "qvi.decision" and record.time_unix_nano > 0
            attributes = {kv.key: kv.value for kv in record.attributes}
            assert attributes["qvi.model"].string_value == line["model"]
            assert attributes["qvi.version"].int_value == line["version"]
            assert attributes["qvi.request_id"].string_value == line["request_id"]
            assert record.trace_id.hex() == line["trace_id"], line
            resource_attributes = {kv.key: kv.value.string_value for kv in resource.resource.attributes}
            assert resource_attributes == {"service.name": "qvi-server", "deployment.environment": "test"}
        assert lines["r0"]["trace_id"] == trace_id
        # Alone: no file, the records still go out.
        before = len(records())
        with ServerProcess(store, str(tmp_path), "--decision-log-otlp-endpoint", receiver.endpoint,
                           name="alone") as proc:
            pbg.InferenceStub(proc.channel).Classify(
                pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS), timeout=30)
            wait_until(lambda: len(records()) == before + 1, "the record of the server without a file")
    finally:
        receiver.close()
