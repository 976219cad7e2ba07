"""The HTTP/JSON port (server/http/): health, models, :classify and :tag against the gRPC answers of the
same server, errors with the HTTP status of their gRPC code, the limits decided before the work they
guard (413 from Content-Length alone, 431, nesting, too many texts, bad UTF-8), keep-alive, a header
sent too slowly, readiness during a drain, metrics, and the curl lines of docs/serving.md run as written."""
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess

import pytest

from qvi_testing import STORE, ServerProcess, doc_commands, http_call, wait_until


@pytest.fixture(scope="module")
def http_address(server_process):
    assert server_process.http_address, "the session's server has no HTTP port"
    return server_process.http_address


def test_health_routes_answer_for_kubernetes_probes(http_address):
    assert http_call(http_address, "GET", "/v2/health/live")[:2] == (200, {"live": True})
    assert http_call(http_address, "GET", "/v2/health/ready")[:2] == (200, {"ready": True})


def test_models_are_listed_and_described(http_address):
    status, body, _ = http_call(http_address, "GET", "/v1/models")
    assert status == 200
    names = {m["name"] for m in body["models"]}
    assert {"sentiment", "ner"} <= names
    status, body, _ = http_call(http_address, "GET", "/v1/models/sentiment")
    assert status == 200 and body["model"]["name"] == "sentiment"
    assert body["model"]["versions"][0]["metadata"]["labels"] == ["negative", "positive"]
    status, body, _ = http_call(http_address, "GET", "/v1/models/sentiment/versions/99")
    assert (status, body) == (404, {"error": "model 'sentiment' has no version 99"})


TEXTS = ["a wonderful, moving film", "dull, lifeless and far too long", "Angela Merkel visited Paris on Monday"]


def test_classify_answers_what_grpc_answers(http_address, server, api):
    pb, pb_grpc = api
    options = {"topK": 2, "attention": True, "gates": True, "tokens": True}
    status, body, headers = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                                 {"texts": TEXTS, "options": options, "requestId": "http-1"})
    assert status == 200, body
    assert headers["X-Request-Id"] == "http-1" and body["requestId"] == "http-1"
    want = pb_grpc.InferenceStub(server).Classify(pb.ClassifyRequest(
        model=pb.ModelSpec(name="sentiment"), texts=TEXTS,
        options=pb.OutputOptions(top_k=2, attention=True, gates=True, tokens=True)), timeout=30)
    assert len(body["results"]) == len(want.results)
    for got, w in zip(body["results"], want.results):
        assert [(s["label"], pytest.approx(s["score"], abs=1e-6)) for s in got["labels"]] == \
            [(s.label, s.score) for s in w.labels]
        assert [t["text"] for t in got["tokens"]] == [t.text for t in w.tokens]
        assert [t["start"] for t in got["tokens"]] == [t.start for t in w.tokens], "zero offsets are written too"
        assert [t["attention"] for t in got["tokens"]] == pytest.approx([t.attention for t in w.tokens], abs=1e-6)
        assert [t["gate"] for t in got["tokens"]] == pytest.approx([t.gate for t in w.tokens], abs=1e-6)


def test_tag_answers_what_grpc_answers(http_address, server, api):
    pb, pb_grpc = api
    status, body, _ = http_call(http_address, "POST", "/v1/models/ner/versions/1:tag", {"texts": TEXTS[2:]})
    assert status == 200, body
    want = pb_grpc.InferenceStub(server).Tag(pb.TagRequest(model=pb.ModelSpec(name="ner", version=1),
                                                           texts=TEXTS[2:]), timeout=30)
    assert [(s["label"], s["start"], s["end"], s["text"]) for s in body["results"][0]["spans"]] == \
        [(s.label, s.start, s.end, s.text) for s in want.results[0].spans]
    assert body["model"] == {"name": "ner", "version": "1"}


@pytest.mark.parametrize("method,path,body,status,error", [
    ("GET", "/nope", None, 404, "no route for /nope"),
    ("DELETE", "/v1/models", None, 405, "method DELETE is not allowed on /v1/models; use GET"),
    ("GET", "/v1/models/sentiment:classify", None, 405, "use POST"),
    ("POST", "/v1/models/sentiment:predict", b"{}", 404, "the verbs are :classify and :tag"),
    ("POST", "/v1/models/sentiment/versions/x:classify", b"{}", 400, "version: 'x' is not a positive integer"),
    ("POST", "/v1/models/sentiment:classify", b"{bad", 400, "request body: not valid JSON at byte 2"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["a"', 400, "request body: not valid JSON at byte"),
    ("POST", "/v1/models/sentiment:classify", b'{"textz": ["a"]}', 400, "request body: textz"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["a"], "options": {"topK": 1e99}}', 400,
     "request body: options.top_k: 1e99 is not a whole number within int32"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": []}', 400, "texts: empty"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["\xff\xfe"]}', 400, "ill-formed UTF-8"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["\\ud800"]}', 400, "surrogate"),
    # A Classify body is refused at its first value of the wrong kind, before any depth is reached.
    ("POST", "/v1/models/sentiment:classify", b"[" * 10000, 400, "request body: a JSON object is expected"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ' + b"[" * 10000, 400,
     "request body: texts: a list is not a string"),
    ("POST", "/v2/models/sentiment/infer", b'{"inputs": ' + b"[" * 10000, 400, "JSON nested deeper than 16 levels"),
    ("POST", "/v1/models/sentiment:classify", json.dumps({"texts": [""] * 257}).encode(), 400,
     "texts: more than 256 texts"),
    ("POST", "/v1/models/nope:classify", b'{"texts": ["a"]}', 404, "model 'nope' not found"),
    ("POST", "/v1/models/ner:classify", b'{"texts": ["a"]}', 400, "call Tag, not Classify"),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["a"], "model": {"name": "ner"}}', 400,
     "the body names another model"),
    # The client's own strings are quoted clipped, never whole.
    ("POST", "/v1/models/sentiment:classify", b'{"' + b"k" * 100000 + b'": 1}', 400, "request body: "),
    ("POST", "/v1/models/sentiment:classify", b'{"texts": ["a"' + b" " * 100000 + b"x", 400, "not valid JSON"),
])
def test_errors_are_json_with_the_status_of_their_code(http_address, method, path, body, status, error):
    got, answer, headers = http_call(http_address, method, path, body)
    assert got == status, answer
    assert error in answer["error"], answer
    assert len(answer["error"]) < 600, "an error quotes at most a little of the request"
    if status == 405:
        assert headers["Allow"] in ("GET, OPTIONS", "POST, OPTIONS")


def raw_exchange(address, data, read_timeout=10):
    """Sends `data` on a new connection and returns what comes back until the server closes it."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_a_body_over_the_limit_is_refused_from_its_content_length_before_it_is_sent(http_address):
    # Only the header goes out: the 413 comes without a byte of the body, and the connection closes.
    answer = raw_exchange(http_address, b"POST /v1/models/sentiment:classify HTTP/1.1\r\nHost: x\r\n"
                                        b"Content-Length: 999999999\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"over the limit of 16777216 bytes (--max-message-bytes)" in answer


def test_a_chunked_body_over_the_limit_is_cut_off(http_address):
    chunk = b"a" * (1 << 20)
    host, port = http_address.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/models/sentiment:classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        answer = b""
        try:
            for _ in range(20):  # 20 MiB, over the 16 MiB limit
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while the rest was on its way
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                answer += data
        except ConnectionResetError:
            pass
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_a_header_over_the_limit_is_431(http_address):
    status, body, _ = http_call(http_address, "GET", "/v2/health/live", headers={"X-Big": "a" * 20000})
    assert status == 431 and "16384 bytes (--http-max-header-bytes)" in body["error"]
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(10000))
    answer = raw_exchange(http_address, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_malformed_http_is_400_and_the_server_stays_up(http_address):
    answer = raw_exchange(http_address, b"NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert http_call(http_address, "GET", "/v2/health/live")[0] == 200


def test_a_keep_alive_connection_answers_request_after_request(http_address):
    host, port = http_address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for i in range(5):
            conn.request("POST", "/v1/models/sentiment:classify", body=json.dumps({"texts": [f"text {i}"]}))
            r = conn.getresponse()
            assert r.status == 200 and r.getheader("Connection", "keep-alive").lower() != "close"
            assert json.loads(r.read())["results"][0]["labels"]
            if i == 0:
                first = conn.sock.getsockname()
            assert conn.sock.getsockname() == first, "the same connection answered"
    finally:
        conn.close()


def test_http_calls_are_counted_in_the_metrics(server_process, http_address):
    def count():
        return sum(v for k, v in server_process.metrics().items()
                   if k.startswith("qvi_requests_total{") and 'method="Classify"' in k and 'model="sentiment"' in k
                   and 'code="INVALID_ARGUMENT"' in k)
    before = count()
    assert http_call(http_address, "POST", "/v1/models/sentiment:classify", {"texts": []})[0] == 400
    wait_until(lambda: count() == before + 1, "the refused HTTP call in qvi_requests_total", seconds=10)


def test_a_slow_header_is_cut_off_and_readiness_follows_the_drain(tmp_path):
    """A header sent a byte at a time is cut off (the connection closed) once
    --http-header-timeout-seconds passed; during the shutdown delay /v2/health/ready says 503 while
    live stays 200."""
    proc = ServerProcess(STORE, str(tmp_path), "--http-header-timeout-seconds", "0.5",
                         "--shutdown-delay-seconds", "30", "--shutdown-grace-seconds", "1")
    try:
        host, port = proc.http_address.split(":")
        request = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(0.1)
            sent, closed = 0, False
            for byte in request:  # one byte each 0.1 s: the whole header would take 4 s
                try:
                    s.sendall(bytes([byte]))
                    sent += 1
                    closed = s.recv(4096) == b""
                except socket.timeout:
                    continue  # nothing from the server yet
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                if closed:
                    break
        assert closed, "the server kept a header trickling for its whole length"
        assert sent < len(request), "cut off before the header was complete"
        assert http_call(proc.http_address, "GET", "/v2/health/live")[0] == 200, "the server goes on"
        proc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: http_call(proc.http_address, "GET", "/v2/health/ready")[0] == 503, "ready 503 in the drain",
                   seconds=20)
        assert http_call(proc.http_address, "GET", "/v2/health/live")[0] == 200
    finally:
        proc.proc.send_signal(signal.SIGTERM)  # the second signal ends the delay
        assert proc.proc.wait(timeout=60) == 0, proc.log()


@pytest.mark.parametrize("command", doc_commands("docs/serving.md", "## HTTP/JSON", "curl") +
                         doc_commands("README.md", "### From curl", "curl"))
def test_the_docs_curl_lines_run_as_written(http_address, command):
    assert "localhost:8501" in command, command
    out = subprocess.run(["bash", "-c", command.replace("localhost:8501", http_address)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert "error" not in answer, answer


# KServe v2 REST: the Open Inference Protocol over HTTP/JSON, planned and answered by the same code as
# OIP over gRPC (test_oip.py covers that code's outputs and parameters in depth).

def infer_body(texts, outputs=None, **parameters):
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    if outputs is not None:
        body["outputs"] = outputs
    if parameters:
        body["parameters"] = parameters
    return body


def test_v2_server_and_model_metadata(http_address):
    status, body, _ = http_call(http_address, "GET", "/v2")
    assert status == 200 and body["name"] == "qvi-serve" and {"classification", "binary_tensor_data"} <= set(body["extensions"])
    status, body, _ = http_call(http_address, "GET", "/v2/models/sentiment")
    assert status == 200, body
    assert body["name"] == "sentiment" and body["versions"] == ["1"]
    assert body["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["probabilities"] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}
    assert json.loads(body["parameters"]["labels"]) == ["negative", "positive"]
    assert http_call(http_address, "GET", "/v2/models/sentiment/versions/1/ready")[:2] == \
        (200, {"name": "sentiment", "ready": True})
    status, body, _ = http_call(http_address, "GET", "/v2/models/sentiment/versions/9/ready")
    assert status == 404 and "has no version 9" in body["error"]


def test_v2_infer_answers_what_classify_answers(http_address):
    texts = TEXTS[:2]
    status, body, headers = http_call(http_address, "POST", "/v2/models/sentiment/infer",
                                 dict(infer_body(texts, [{"name": "probabilities", "parameters": {"classification": 2}},
                                                         {"name": "attention"}, {"name": "token_count"}]), id="v2-1"))
    assert status == 200, body
    assert (body["model_name"], body["model_version"], body["id"]) == ("sentiment", "1", "v2-1")
    assert headers["X-Request-Id"] == "v2-1"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert [o["name"] for o in body["outputs"]] == ["probabilities", "attention", "token_count"]
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                        {"texts": texts, "options": {"topK": 2, "attention": True}})
    probabilities = outputs["probabilities"]
    assert probabilities["datatype"] == "BYTES" and probabilities["shape"] == [2, 2]
    for row, result in enumerate(native["results"]):
        got = [e.split(":") for e in probabilities["data"][2 * row:2 * row + 2]]
        assert [g[2] for g in got] == [s["label"] for s in result["labels"]]
        assert [float(g[0]) for g in got] == pytest.approx([s["score"] for s in result["labels"]], abs=1e-5)
        width = outputs["attention"]["shape"][1]
        n = outputs["token_count"]["data"][row]
        assert n == len(result["tokens"])
        assert outputs["attention"]["data"][row * width:row * width + n] == \
            pytest.approx([t["attention"] for t in result["tokens"]], abs=1e-6)


def test_v2_infer_answers_contributions_as_the_native_route_does(http_address):
    texts = TEXTS[:2]
    status, body, _ = http_call(http_address, "POST", "/v2/models/sentiment/infer",
                                infer_body(texts, contributions=True, top_k=2))
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert list(outputs) == ["label", "probabilities", "token_count", "contribution", "margin", "contribution_rest"]
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                             {"texts": texts, "options": {"topK": 2, "contributions": True}})
    n, k, t = outputs["contribution"]["shape"]
    assert (n, k) == (2, 2) and outputs["contribution"]["datatype"] == "FP32"
    for row, result in enumerate(native["results"]):
        for j, label in enumerate(result["labels"]):
            flat = outputs["contribution"]["data"][(row * k + j) * t:(row * k + j + 1) * t]
            tokens = result["tokens"]
            assert flat[:len(tokens)] == pytest.approx([tok["contribution"][j] for tok in tokens], abs=1e-6)
            assert outputs["margin"]["data"][row * k + j] == pytest.approx(label["margin"], abs=1e-6)
            assert outputs["contribution_rest"]["data"][row * k + j] == pytest.approx(label["contributionRest"], abs=1e-6)
            assert sum(flat) + label["contributionRest"] == pytest.approx(label["margin"], abs=1e-4)


def test_v2_infer_answers_entity_occlusion_as_the_native_route_does(http_address):
    """options.occlusion over HTTP/JSON (spans with probability and occlusion per token) and KServe v2
    REST (entity_occlusion [N, S, T], flat, and the probability in the spans' JSON) agree."""
    texts = ["Angela Merkel visited Paris on Monday"]
    status, native, _ = http_call(http_address, "POST", "/v1/models/ner:tag",
                                  {"texts": texts, "options": {"occlusion": True}})
    assert status == 200, native
    spans = native["results"][0]["spans"]
    n = len(native["results"][0]["tokens"])
    assert spans and all(len(sp["occlusion"]) == n and 0 < sp["probability"] <= 1 for sp in spans), spans
    for sp in spans:  # the entity's own tokens stay: 0 there
        assert all(sp["occlusion"][t] == 0 for t in range(sp.get("tokenStart", 0), sp["tokenEnd"]))
    status, body, _ = http_call(http_address, "POST", "/v2/models/ner/infer", infer_body(texts, occlusion=True))
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["entity_occlusion"]["shape"] == [1, len(spans), n]
    flat = outputs["entity_occlusion"]["data"]
    for j, sp in enumerate(spans):
        assert flat[j * n:(j + 1) * n] == pytest.approx(sp["occlusion"], abs=1e-6)
    assert [sp["probability"] for sp in json.loads(outputs["spans"]["data"][0])] == \
        pytest.approx([sp["probability"] for sp in spans], abs=1e-6)


def test_v2_infer_answers_the_faithfulness_check_as_the_native_route_does(http_address):
    texts = TEXTS[:2]
    status, body, _ = http_call(http_address, "POST", "/v2/models/sentiment/infer",
                                infer_body(texts, faithfulness_top_k=3))
    assert status == 200, body
    outputs = {o["name"]: o for o in body["outputs"]}
    assert [o["name"] for o in body["outputs"]] == ["label", "probabilities", "faithfulness_label",
                                                     "faithfulness_score", "faithfulness_score_without",
                                                     "faithfulness_removed"]
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                             {"texts": texts, "options": {"faithfulness": {"topK": 3}}})
    width = outputs["faithfulness_removed"]["shape"][1]
    assert outputs["faithfulness_removed"]["datatype"] == "INT32"
    for row, result in enumerate(native["results"]):
        f = result["faithfulness"]
        assert outputs["faithfulness_label"]["data"][row] == f["label"]
        assert outputs["faithfulness_score"]["data"][row] == pytest.approx(f["score"], abs=1e-6)
        assert outputs["faithfulness_score_without"]["data"][row] == pytest.approx(f["scoreWithout"], abs=1e-6)
        removed = outputs["faithfulness_removed"]["data"][row * width:(row + 1) * width]
        assert removed == f["removed"] + [-1] * (width - len(f["removed"]))
    status, body, _ = http_call(http_address, "POST", "/v2/models/sentiment/infer",
                                infer_body(texts, faithfulness_top_k=33))
    assert status == 400 and "parameters.faithfulness_top_k: 33 is outside [0, 32]" in body["error"], body


def test_v2_infer_tags_with_the_spans_tag_answers(http_address):
    status, body, _ = http_call(http_address, "POST", "/v2/models/ner/infer", infer_body(TEXTS[2:]))
    assert status == 200, body
    spans = json.loads({o["name"]: o for o in body["outputs"]}["spans"]["data"][0])
    _, native, _ = http_call(http_address, "POST", "/v1/models/ner:tag", {"texts": TEXTS[2:]})
    assert [(s["label"], s["start"], s["end"], s["text"]) for s in spans] == \
        [(s["label"], s["start"], s["end"], s["text"]) for s in native["results"][0]["spans"]]


@pytest.mark.parametrize("body,status,error", [
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, 400,
     "inputs[0].datatype: 'FP32'; the input \"text\" is BYTES"),
    ({"inputs": [{"name": "txt", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}, 400, "'txt' is not an input"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [1]}]}, 400, "inputs[0].data[0]"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}, 400,
     "inputs[0].data: is missing (or, with the binary-data extension, parameters.binary_data_size)"),
    ({"inputz": []}, 400, "inputz: is not a field of an inference request"),
    (dict(infer_body(["a"]), parameters={"top_k": 1.5}), 400, "parameters.top_k: must be a boolean, an integer"),
    (infer_body(["a"], [{"name": "spans"}]), 400, "spans"),
    (dict(infer_body(["a"]), parameters={"p" * 100000: 1.5}), 400, "must be a boolean, an integer"),
])
def test_v2_infer_errors_name_the_field(http_address, body, status, error):
    got, answer, _ = http_call(http_address, "POST", "/v2/models/sentiment/infer", body)
    assert got == status, answer
    assert error in answer["error"], answer
    assert len(answer["error"]) < 600, "an error quotes at most a little of the request"


def test_a_timeout_header_sets_the_calls_deadline(tmp_path):
    """X-Request-Timeout-Ms is an HTTP call's deadline, as grpc-timeout is a gRPC call's: a text still
    queued when it passes is answered 504 and never reaches the model; a bad value is 400 naming it."""
    store = os.path.join(tmp_path, "store")
    shutil.copytree(os.path.join(STORE, "sentiment"), os.path.join(store, "sentiment"))
    # A batch forms only after 3 s (or when 32 texts wait): one text waits that long in the queue.
    with open(os.path.join(store, "sentiment", "serving.json"), "w") as f:
        f.write('{"max_queue_delay_ms": 3000, "batch_when_idle": false}')
    proc = ServerProcess(store, str(tmp_path))
    try:
        address = proc.http_address
        for path, body in (("/v1/models/sentiment:classify", {"texts": ["fine"]}),
                           ("/v2/models/sentiment/infer", infer_body(["fine"]))):
            status, answer, _ = http_call(address, "POST", path, body, {"X-Request-Timeout-Ms": "200"})
            assert status == 504 and "deadline" in answer["error"], (path, status, answer)
            status, answer, _ = http_call(address, "POST", path, body, {"X-Request-Timeout-Ms": "60000"})
            assert status == 200, answer
            for bad in ("0", "-5", "1.5", "soon", "99999999999"):
                status, answer, _ = http_call(address, "POST", path, body, {"X-Request-Timeout-Ms": bad})
                assert status == 400 and answer["error"].startswith(f"X-Request-Timeout-Ms: '{bad}' is not a whole "
                                                                   "number of milliseconds from 1 to 86400000"), answer
        batches = proc.metrics().get('qvi_batch_size_count{model="sentiment",version="1"}', 0)
        assert batches == 2, f"{batches} batches: only the two calls with time to spare reach the model"
    finally:
        proc.stop()


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}


def test_a_thousand_idle_keep_alive_connections_hold_no_threads(tmp_path):
    """1,000 connections that opened and sent nothing (as idle keep-alive clients do): the server's
    thread count does not move, its RSS stays under 100 MB more than before, and requests on a new
    connection are still answered."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1000 + 200
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the descriptor limit ({hard}) is below {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # the server inherits it
    proc = ServerProcess(STORE, str(tmp_path))
    sockets = []
    try:
        host, port = proc.http_address.split(":")
        assert http_call(proc.http_address, "GET", "/v2/health/ready")[0] == 200
        before = proc_status(proc.proc.pid)
        for _ in range(1000):
            sockets.append(socket.create_connection((host, int(port)), timeout=10))
        # The server has taken them all once a request behind them is answered.
        status, body, _ = http_call(proc.http_address, "POST", "/v1/models/sentiment:classify", {"texts": ["a film"]})
        assert status == 200, body
        after = proc_status(proc.proc.pid)
        assert int(after["Threads"]) == int(before["Threads"]), (before["Threads"], after["Threads"])
        grown_kb = int(after["VmRSS"].split()[0]) - int(before["VmRSS"].split()[0])
        assert grown_kb < 100 * 1024, f"RSS grew {grown_kb} kB for 1,000 idle connections"
        fds = len(os.listdir(f"/proc/{proc.proc.pid}/fd"))
        assert fds >= 1000, f"the server holds {fds} descriptors: the connections were not all accepted"
    finally:
        for s in sockets:
            s.close()
        proc.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_cors_lets_the_allowed_origins_call_and_refuses_the_others_preflight(http_address, tmp_path):
    # The session's server allows no origin: a browser's preflight is refused, and nothing says CORS.
    status, body, headers = http_call(http_address, "OPTIONS", "/v1/models/sentiment:classify",
                                 headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
    assert status == 403 and "origin 'http://app.example' is not allowed (--http-cors-allow-origin)" in body["error"]
    assert "Access-Control-Allow-Origin" not in headers
    proc = ServerProcess(STORE, str(tmp_path), "--http-cors-allow-origin", "http://app.example")
    try:
        address = proc.http_address
        preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type"}
        status, body, headers = http_call(address, "OPTIONS", "/v1/models/sentiment:classify", headers=preflight)
        assert status == 204 and body is None
        assert headers["Access-Control-Allow-Origin"] == "http://app.example" and headers["Vary"] == "Origin"
        assert headers["Access-Control-Allow-Methods"] == "POST, OPTIONS"
        assert headers["Access-Control-Allow-Headers"] == "content-type"
        status, body, headers = http_call(address, "POST", "/v1/models/sentiment:classify", {"texts": ["a film"]},
                                     headers={"Origin": "http://app.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://app.example"
        assert headers["Access-Control-Expose-Headers"] == "X-Request-Id"
        status, _, headers = http_call(address, "GET", "/v2/health/live", headers={"Origin": "http://evil.example"})
        assert status == 200 and "Access-Control-Allow-Origin" not in headers, "no CORS for another origin"
        status, body, _ = http_call(address, "OPTIONS", "/v2/health/ready", headers={"Origin": "http://evil.example"})
        assert status == 403 and "http://evil.example" in body["error"]
        status, _, headers = http_call(address, "OPTIONS", "/v2/health/ready")
        assert status == 204 and headers["Allow"] == "GET, OPTIONS"
        assert http_call(address, "OPTIONS", "/nope", headers={"Origin": "http://app.example"})[0] == 404
    finally:
        proc.stop()


def _validator(doc, schema):
    """A JSON Schema (2020-12, as OpenAPI 3.1 uses) validator of `schema`, its $refs into the document."""
    from jsonschema import Draft202012Validator
    return Draft202012Validator({**schema, "components": doc["components"]})


def test_every_route_of_the_openapi_document_answers_as_its_schemas_say(http_address):
    """GET /openapi.json (OpenAPI 3.1): each path, with the demo models and version 1 put in, answers 200
    to its method, with a body its 200 schema accepts; the requests sent are valid under the request
    schemas, and a request with a wrong type is not (the C++ test checks that every route is in the
    document and every $ref resolves)."""
    status, doc, _ = http_call(http_address, "GET", "/openapi.json")
    assert status == 200 and doc["openapi"] == "3.1.0"
    assert len(doc["paths"]) >= 28
    checked = 0
    for path, operations in doc["paths"].items():
        if path.startswith("/v2/repository/models/"):
            # Model control: this server's is poll, so a load or unload is refused as documented.
            got, answer, _ = http_call(http_address, "POST", path.replace("{model}", "sentiment"), {})
            assert got == 400 and "model control is 'poll'" in answer["error"], (path, answer)
            _validator(doc, operations["post"]["responses"]["default"]["content"]["application/json"]["schema"]
                       ).validate(answer)
            continue
        model = "ner" if path.endswith(":tag") else "sentiment"
        target = path.replace("{model}", model).replace("{version}", "1")
        for method, operation in operations.items():
            body = None
            if method == "post" and path.startswith("/v2/repository/"):
                body = {"ready": True}
                assert operation["requestBody"]["required"] is False  # the body is optional
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "post" and "tei.PredictRequest" in json.dumps(operation["requestBody"]):  # TEI's
                # one text (a flat list back) on the bare paths, InferenceClient's body (a list of lists) on others
                body = {"inputs": "Anna went", "truncate": True} if target in ("/", "/predict") else \
                    {"inputs": "Anna went", "parameters": {"top_k": 2}}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "post" and "tei.TokenizeRequest" in json.dumps(operation["requestBody"]):
                body = {"inputs": ["Anna went"], "add_special_tokens": True}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "post" and "tei.DecodeRequest" in json.dumps(operation["requestBody"]):
                # The demo models read words: /decode refuses them in TEI's documented error form
                # (test_hf_import.py decodes with sub-word models).
                body = {"ids": [[5, 6]], "skip_special_tokens": True}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
                got, answer, _ = http_call(http_address, "POST", target, body)
                assert got == 422 and "reads words" in answer["error"], (target, answer)
                _validator(doc, operation["responses"]["default"]["content"]["application/json"]["schema"]
                           ).validate(answer)
                continue
            elif method == "post" and "openai.PoolingRequest" in json.dumps(operation["requestBody"]):
                body = {"model": "ner", "input": ["Anna went to Paris"], "task": "token_classify"}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "post" and "openai.ClassifyRequest" in json.dumps(operation["requestBody"]):
                body = {"model": "sentiment", "input": ["Anna went"]}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "put":  # an admin's shadow candidate (a version the store lacks: compared with none)
                body = {"version": 2, "fraction": 0.1}
                _validator(doc, operation["requestBody"]["content"]["application/json"]["schema"]).validate(body)
            elif method == "post":
                assert operation["requestBody"]["required"] is True
                body = infer_body(["Anna went to Paris"]) if target.endswith("/infer") else \
                    {"texts": ["Anna went"], "options": {"attention": True, "tokens": True, "topK": 2}}
                request_schema = operation["requestBody"]["content"]["application/json"]["schema"]
                _validator(doc, request_schema).validate(body)
            if target == "/" and method == "get":  # the page: HTML, not JSON
                host, port = http_address.split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request("GET", "/")
                r = conn.getresponse()
                assert r.status == 200 and r.getheader("Content-Type").startswith("text/html")
                r.read()
                conn.close()
                continue
            got, answer, _ = http_call(http_address, method.upper(), target, body)
            assert got == 200, (method, target, answer)
            schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
            _validator(doc, schema).validate(answer)
            checked += 1
    assert checked >= 25
    classify = doc["paths"]["/v1/models/{model}:classify"]["post"]["requestBody"]["content"]["application/json"]
    bad = {"texts": "not a list", "options": {"topK": "two"}}
    errors = list(_validator(doc, classify["schema"]).iter_errors(bad))
    assert len(errors) == 2, errors


def test_kserves_rest_client_calls_the_v2_routes(interop_python, http_address):
    """KServe's own InferenceRESTClient (protocol v2), a client nobody here wrote: health, readiness,
    and inference with the classification extension, against the native answer; an unknown model is 404."""
    from conftest import oip_calls
    calls = [{"client": "kserve_rest", "rpc": "live"},
             {"client": "kserve_rest", "rpc": "ready"},
             {"client": "kserve_rest", "rpc": "model_ready", "model": "sentiment"},
             {"client": "kserve_rest", "rpc": "infer", "model": "sentiment", "texts": TEXTS[:2], "id": "rest-1",
              "outputs": [{"name": "probabilities", "parameters": {"classification": 2}}]},
             {"client": "kserve_rest", "rpc": "infer", "model": "nope", "texts": ["a"]}]
    live, ready, model_ready, infer, unknown = oip_calls(interop_python, http_address, calls)
    assert [r["value"] for r in (live, ready, model_ready)] == [True, True, True]
    assert infer["ok"], infer
    got = infer["value"]
    assert (got["model_name"], got["id"]) == ("sentiment", "rest-1")
    probabilities = got["outputs"]["probabilities"]
    assert probabilities["shape"] == [2, 2]
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify", {"texts": TEXTS[:2], "options": {"topK": 2}})
    assert [e.split(":")[2] for e in probabilities["data"][0]] == [s["label"] for s in native["results"][0]["labels"]]
    assert (unknown["ok"], unknown["code"]) == (False, 404) and "model 'nope' not found" in unknown["message"]


def test_tritonclients_http_client_calls_the_v2_routes_in_binary_and_json(interop_python, http_address):
    """tritonclient.http, a client nobody here wrote, with its defaults: inputs and outputs in the
    binary-data extension (and, asked with binary_data=False, in JSON): the same answers as the native
    route, and as each other."""
    from conftest import oip_calls
    th = "triton_http"
    classify = {"client": th, "rpc": "infer", "model": "sentiment", "texts": TEXTS[:2], "id": "th-1",
                "outputs": [{"name": "probabilities", "class_count": 2}, {"name": "attention"}]}
    calls = [{"client": th, "rpc": "live"}, {"client": th, "rpc": "ready"},
             {"client": th, "rpc": "server_metadata"},
             {"client": th, "rpc": "model_metadata", "model": "sentiment"},
             {"client": th, "rpc": "model_ready", "model": "sentiment"},
             classify, dict(classify, binary=False),
             {"client": th, "rpc": "infer", "model": "ner", "texts": ["Ada Lovelace lived in London"]},
             {"client": th, "rpc": "infer", "model": "nope", "texts": ["a"]}]
    live, ready, server, metadata, model_ready, binary, text, ner, unknown = oip_calls(interop_python, http_address,
                                                                                          calls)
    assert [r["value"] for r in (live, ready, model_ready)] == [True, True, True]
    assert server["value"]["name"] == "qvi-serve" and metadata["value"]["name"] == "sentiment"
    assert binary["ok"] and text["ok"], (binary, text)
    assert binary["value"] == text["value"], "the binary and the JSON answers differ"
    got = binary["value"]
    assert (got["model_name"], got["id"]) == ("sentiment", "th-1")
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                        {"texts": TEXTS[:2], "options": {"topK": 2, "attention": True, "tokens": True}})
    probabilities = got["outputs"]["probabilities"]
    assert probabilities["shape"] == [2, 2]
    assert [e.split(":")[2] for e in probabilities["data"][0]] == [s["label"] for s in native["results"][0]["labels"]]
    attention = got["outputs"]["attention"]
    alphas = [t["attention"] for t in native["results"][0]["tokens"]]
    assert attention["data"][0][:len(alphas)] == pytest.approx(alphas, abs=1e-6)
    assert ner["ok"], ner
    assert (unknown["ok"], unknown["code"]) == (False, "404") and "model 'nope' not found" in unknown["message"]


def _binary_body(header, raw):
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def _bytes_tensor(texts):
    """BYTES elements as the binary-data extension writes them: a 4-byte little-endian length, the bytes."""
    return b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)


def test_the_binary_data_extension_by_hand(http_address):
    """Triton's binary-data extension, spelled out: the texts after the JSON header, the probabilities
    (FP32, little-endian) after the answer's JSON, where Inference-Header-Content-Length says."""
    raw = _bytes_tensor(TEXTS[:2])
    body, headers = _binary_body({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                                              "parameters": {"binary_data_size": len(raw)}}],
                                  "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}},
                                              {"name": "labels", "parameters": {"binary_data": False}}]}, raw)
    host, port = http_address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/models/sentiment/infer", body=body, headers=headers)
    r = conn.getresponse()
    answer = r.read()
    conn.close()
    assert r.status == 200, answer
    assert r.getheader("Content-Type") == "application/octet-stream"
    n = int(r.getheader("Inference-Header-Content-Length"))
    head = json.loads(answer[:n])
    probabilities, labels = head["outputs"]
    assert "data" not in probabilities and probabilities["parameters"]["binary_data_size"] == 2 * 2 * 4
    values = struct.unpack("<4f", answer[n:])
    assert len(answer) == n + 16 and all(0 <= v <= 1 for v in values)
    _, native, _ = http_call(http_address, "POST", "/v1/models/sentiment:classify",
                        {"texts": TEXTS[:2], "options": {"topK": 2}})
    assert labels["data"] == [native["results"][i]["labels"][0]["label"] for i in range(2)]
    assert [max(values[0:2]), max(values[2:4])] == \
        pytest.approx([native["results"][i]["labels"][0]["score"] for i in range(2)], abs=1e-6)


@pytest.mark.parametrize("header,raw,length,error", [
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 99}}]},
     _bytes_tensor(["a"]), None, "inputs[0].parameters.binary_data_size: 99 bytes, but 5 bytes of binary data are left"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 5}}]},
     _bytes_tensor(["a"]) + b"extra", None, "request body: 5 bytes follow the JSON header"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": -1}}]},
     b"", None, "binary_data_size: must be a non-negative integer"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]}, b"", None,
     "inputs[0].data: is missing (or, with the binary-data extension, parameters.binary_data_size)"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "outputs": [{"name": "probabilities", "parameters": {"binary_data": "yes"}}]}, b"", None,
     "outputs[0].parameters.binary_data: must be a boolean"),
    ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}],
      "parameters": {"binary_data_output": 1}}, b"", None, "parameters.binary_data_output: must be a boolean"),
    ({"inputs": []}, b"", "12345678", "Inference-Header-Content-Length: '12345678' is not a length within the body"),
    ({"inputs": []}, b"", "ten", "Inference-Header-Content-Length: 'ten' is not a length"),
])
def test_binary_data_errors_name_the_field(http_address, header, raw, length, error):
    body, headers = _binary_body(header, raw)
    if length is not None:
        headers["Inference-Header-Content-Length"] = length
    status, answer, _ = http_call(http_address, "POST", "/v2/models/sentiment/infer", body, headers)
    assert status == 400 and error in answer["error"], answer
