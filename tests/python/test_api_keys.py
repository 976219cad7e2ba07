"""API keys with scopes (--api-keys) end to end, with real clients: grpcio on the native API, tritonclient
(gRPC and HTTP) on OIP, plain HTTP on the JSON routes. Each call but the probes needs a key with its scope:
no key or an unknown one is UNAUTHENTICATED / 401 (with WWW-Authenticate: Bearer), a key without the scope
PERMISSION_DENIED / 403 naming the key and the scope, and no refusal repeats the key. The access log and
/metrics name the key, never the key itself. A changed file is read again on SIGHUP; a bad one keeps the
keys in use; a bad file at start-up stops the server with the field named."""
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile

import grpc
import pytest

from conftest import oip_calls
from qvi_testing import REPO, SERVER, STORE, ServerProcess, http_call, wait_until

SEARCH = "search-secret-0f3a9"  # infer and read
READER = "reader-secret-77c1e"  # read only
ADMIN = "admin-secret-5be20"  # admin only
ROTATED = "rotated-secret-a41d"
SLOW = "slow-secret-19b2c"  # one request per 100 s
FEW = "few-secret-c3d0e"  # 3 texts a second
THRIFTY = "thrifty-secret-7a0f4"  # tokens: one per 100 s, charged after each answer


def entry(name, key, scopes, limits=None):
    e = {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), "scopes": scopes}
    if limits:
        e["limits"] = limits
    return e


# Limits no test can refill by waiting: a second call is refused however slow the machine.
LIMITED = (entry("slow", SLOW, ["infer", "read"], {"requests_per_second": 0.01}),
           entry("few", FEW, ["infer"], {"texts_per_second": 3}),
           entry("thrifty", THRIFTY, ["infer"], {"tokens_per_second": 0.01}))


def write_keys(path, *entries):
    with open(path + ".tmp", "w") as f:
        json.dump({"keys": list(entries)}, f)
    os.replace(path + ".tmp", path)  # as a Secret's update lands: whole


@pytest.fixture(scope="module")
def keyed():
    work = tempfile.mkdtemp(prefix="qvi_keys_py_")
    keys = os.path.join(work, "keys.json")
    write_keys(keys, entry("search", SEARCH, ["infer", "read"]), entry("reader", READER, ["read"]),
               entry("ops", ADMIN, ["admin"]), *LIMITED)
    # A reload interval longer than the test: only SIGHUP reads the file again here.
    proc = ServerProcess(STORE, work, "--api-keys", keys, "--api-keys-reload-seconds", "3600", "--access-log")
    proc.keys = keys
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def bearer(key):
    return (("authorization", f"Bearer {key}"),)


def classify(api, channel, key=None):
    pb, pbg = api
    return pbg.InferenceStub(channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]),
        metadata=bearer(key) if key else None, timeout=30)


def refusal(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_the_native_api_wants_a_key_with_the_calls_scope(api, keyed):
    pb, pbg = api
    assert classify(api, keyed.channel, SEARCH).results[0].labels[0].label in ("negative", "positive")

    code, message = refusal(lambda: classify(api, keyed.channel))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization: Bearer <key>" in message
    code, message = refusal(lambda: classify(api, keyed.channel, "not-a-key"))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "not-a-key" not in message
    code, message = refusal(lambda: classify(api, keyed.channel, READER))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert message == "the API key 'reader' lacks the scope 'infer' this call needs (it has: read)"
    assert READER not in message

    stub = pbg.InferenceStub(keyed.channel)
    listed = stub.ListModels(pb.ListModelsRequest(), metadata=bearer(READER), timeout=30)
    assert {m.name for m in listed.models} >= {"sentiment", "ner", "topics"}
    code, message = refusal(lambda: stub.ListModels(pb.ListModelsRequest(), metadata=bearer(ADMIN), timeout=30))
    assert (code, message) == (grpc.StatusCode.PERMISSION_DENIED,
                               "the API key 'ops' lacks the scope 'read' this call needs (it has: admin)")
    code, _ = refusal(lambda: stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="ner")), timeout=30))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_the_probes_need_no_key(keyed):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    health = health_pb2_grpc.HealthStub(keyed.channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/sentiment/ready"):
        status, _, _ = http_call(keyed.http_address, "GET", path)
        assert status == 200, path
    assert "qvi_requests_in_flight" in keyed.metrics(), "/metrics needs no key"


def test_tritonclient_sends_its_key_as_metadata_and_as_a_header(interop_python, keyed):
    infer = {"rpc": "infer", "model": "sentiment", "texts": ["a moving film"], "outputs": [{"name": "label"}]}
    for client, address in (("triton", keyed.address), ("triton_http", keyed.http_address)):
        calls = [
            {"client": client, "rpc": "live"},
            {"client": client, "rpc": "model_ready", "model": "sentiment"},
            {"client": client, **infer, "headers": {"authorization": f"Bearer {SEARCH}"}},
            {"client": client, **infer},
            {"client": client, **infer, "headers": {"authorization": f"Bearer {READER}"}},
            {"client": client, "rpc": "model_metadata", "model": "ner",
             "headers": {"authorization": f"Bearer {READER}"}},
            {"client": client, "rpc": "model_metadata", "model": "ner"},
        ]
        live, ready, ok, none, reader, metadata, no_metadata = oip_calls(interop_python, address, calls)
        assert live == {"ok": True, "value": True} and ready == {"ok": True, "value": True}, client
        assert ok["ok"] and ok["value"]["outputs"]["label"]["data"][0] in ("negative", "positive"), (client, ok)
        http = client == "triton_http"
        assert not none["ok"] and str(none["code"]) == ("401" if http else "UNAUTHENTICATED"), (client, none)
        assert not reader["ok"] and str(reader["code"]) == ("403" if http else "PERMISSION_DENIED"), (client, reader)
        assert "lacks the scope 'infer'" in reader["message"], reader
        assert metadata["ok"], (client, metadata)
        assert not no_metadata["ok"], (client, no_metadata)


def test_the_http_routes_want_a_key_and_say_so(keyed):
    body = {"texts": ["A fine film."]}
    status, answer, headers = http_call(keyed.http_address, "POST", "/v1/models/sentiment:classify", body)
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer", (status, answer, headers)
    assert "authorization: Bearer <key>" in answer["error"]
    status, answer, _ = http_call(keyed.http_address, "POST", "/v1/models/sentiment:classify", body,
                                  {"Authorization": f"Bearer {READER}"})
    assert status == 403 and "lacks the scope 'infer'" in answer["error"]
    status, answer, _ = http_call(keyed.http_address, "POST", "/v1/models/sentiment:classify", body,
                                  {"Authorization": f"bearer {SEARCH}"})
    assert status == 200 and answer["results"][0]["labels"][0]["label"], answer
    status, answer, _ = http_call(keyed.http_address, "GET", "/v1/models")
    assert status == 401
    status, answer, _ = http_call(keyed.http_address, "GET", "/v1/models", headers={"Authorization": f"Bearer {READER}"})
    assert status == 200 and answer["models"]
    # A shadow candidate is an admin's to name (docs/serving.md, "Shadow versions"); reading it is the read scope's.
    status, answer, _ = http_call(keyed.http_address, "PUT", "/v1/models/sentiment/shadow",
                                  {"version": 2, "fraction": 0.1}, {"Authorization": f"Bearer {READER}"})
    assert status == 403 and "lacks the scope 'admin'" in answer["error"], answer
    status, answer, _ = http_call(keyed.http_address, "GET", "/v1/models/sentiment/shadow",
                                  headers={"Authorization": f"Bearer {READER}"})
    assert status == 200 and answer["comparisons"] == [], answer
    status, _, _ = http_call(keyed.http_address, "GET", "/v2/models/ner", headers={"Authorization": "Basic eDp5"})
    assert status == 401
    # TEI's routes want the same keys (TEI's Authorization: Bearer), and refuse in TEI's form
    status, answer, headers = http_call(keyed.http_address, "POST", "/models/sentiment/predict", {"inputs": "Fine."})
    assert status == 401 and headers.get("WWW-Authenticate") == "Bearer" and answer["error_type"] == "Backend"
    status, answer, _ = http_call(keyed.http_address, "POST", "/models/sentiment/predict", {"inputs": "Fine."},
                                  {"Authorization": f"Bearer {READER}"})
    assert status == 403 and "lacks the scope 'infer'" in answer["error"], answer
    status, answer, _ = http_call(keyed.http_address, "POST", "/models/sentiment/predict", {"inputs": "Fine."},
                                  {"Authorization": f"Bearer {SEARCH}"})
    assert status == 200 and answer[0]["label"] in ("positive", "negative"), answer
    assert http_call(keyed.http_address, "GET", "/models/sentiment/info")[0] == 401
    assert http_call(keyed.http_address, "GET", "/models/sentiment/info",
                     headers={"Authorization": f"Bearer {READER}"})[0] == 200
    # The page and the OpenAPI document are served without a key: the page asks for one.
    status, page, _ = http_call(keyed.http_address, "GET", "/", raw=True)
    assert status == 200 and b'id="api-key"' in page
    assert http_call(keyed.http_address, "GET", "/openapi.json")[0] == 200


def test_the_access_log_and_the_metrics_name_the_key_never_the_key_itself(api, keyed):
    classify(api, keyed.channel, SEARCH)
    refusal(lambda: classify(api, keyed.channel, "wrong-key-123"))
    refusal(lambda: classify(api, keyed.channel, READER))

    def counted():
        m = keyed.metrics()
        return (m.get('qvi_key_requests_total{code="OK",key="search"}', 0) >= 1 and
                m.get('qvi_key_requests_total{code="UNAUTHENTICATED",key="_none"}', 0) >= 1 and
                m.get('qvi_key_requests_total{code="PERMISSION_DENIED",key="reader"}', 0) >= 1)
    wait_until(counted, lambda: f"the key counts on /metrics: {keyed.metrics()}", seconds=30)
    wait_until(lambda: re.search(r"method=Classify .* key=reader\b", keyed.log()), "the access lines of the calls",
               seconds=30)
    lines = [line for line in keyed.log().splitlines() if "method=Classify" in line]
    assert any("key=search" in line and "code=OK" in line for line in lines), lines
    assert any("key=_none" in line and "code=UNAUTHENTICATED" in line for line in lines), lines
    log = keyed.log()
    for secret in (SEARCH, READER, "wrong-key-123"):
        assert secret not in log


def test_sighup_reads_the_file_again_and_a_bad_file_keeps_the_keys_in_use(api, keyed):
    # Rotation: a new key for search; the old one withdrawn.
    write_keys(keyed.keys, entry("search", ROTATED, ["infer", "read"]), entry("reader", READER, ["read"]))
    keyed.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "API keys reloaded" in keyed.log(), "the reload's log line", seconds=30)
    assert classify(api, keyed.channel, ROTATED).results
    assert refusal(lambda: classify(api, keyed.channel, SEARCH))[0] == grpc.StatusCode.UNAUTHENTICATED

    with open(keyed.keys, "w") as f:
        f.write('{"keys": [{"name": "search", "sha256": "abc", "scopes": ["infer"]}]}')
    keyed.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "was refused" in keyed.log(), "the refused reload's log line", seconds=30)
    assert "keys[0] (search).sha256 must be 64 hex digits" in keyed.log()
    assert classify(api, keyed.channel, ROTATED).results, "the keys in use stay"
    assert keyed.metrics().get("qvi_api_keys_reload_failures_total") == 1
    assert keyed.proc.poll() is None, "SIGHUP does not stop the server"
    write_keys(keyed.keys, entry("search", SEARCH, ["infer", "read"]), entry("reader", READER, ["read"]),
               entry("ops", ADMIN, ["admin"]), *LIMITED)
    keyed.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: keyed.log().count("API keys reloaded") == 2, "the second reload", seconds=30)
    assert classify(api, keyed.channel, SEARCH).results


def test_a_key_over_its_request_rate_is_told_when_to_retry(api, keyed):
    pb, pbg = api
    request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"])
    stub = pbg.InferenceStub(keyed.channel)
    stub.Classify(request, metadata=bearer(SLOW), timeout=30)
    call = stub.Classify.with_call
    with pytest.raises(grpc.RpcError) as e:
        call(request, metadata=bearer(SLOW), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert e.value.details().startswith("the API key 'slow' has a limit of 0.01 requests a second, used up for now; "
                                         "retry in "), e.value.details()
    pushback = dict(e.value.trailing_metadata())["grpc-retry-pushback-ms"]
    assert 90_000 < int(pushback) <= 100_000, pushback
    # The same bucket for every call of the key: ListModels too, and over HTTP with Retry-After.
    code, _ = refusal(lambda: stub.ListModels(pb.ListModelsRequest(), metadata=bearer(SLOW), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    status, answer, headers = http_call(keyed.http_address, "POST", "/v1/models/sentiment:classify",
                                        {"texts": ["fine"]}, {"Authorization": f"Bearer {SLOW}"})
    assert status == 429 and "limit of 0.01 requests" in answer["error"], (status, answer)
    assert 90 < int(headers["Retry-After"]) <= 100, headers
    # Other keys are not held back by it.
    assert classify(api, keyed.channel, SEARCH).results
    wait_until(lambda: keyed.metrics().get('qvi_key_limited_total{key="slow",limit="requests"}', 0) >= 3,
               lambda: f"the refusals on /metrics: {keyed.metrics()}", seconds=30)


def test_texts_are_limited_per_request_size_and_tokens_after_the_answer(api, keyed):
    pb, pbg = api
    stub = pbg.InferenceStub(keyed.channel)
    texts = lambda n: pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"] * n)
    code, message = refusal(lambda: stub.Classify(texts(4), metadata=bearer(FEW), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message == ("the API key 'few' has a limit of 3 texts a second, with a burst smaller than this request; "
                       "send fewer texts per request")
    assert len(stub.Classify(texts(3), metadata=bearer(FEW), timeout=30).results) == 3
    code, message = refusal(lambda: stub.Classify(texts(3), metadata=bearer(FEW), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry in" in message, message

    stub.Classify(texts(2), metadata=bearer(THRIFTY), timeout=30)  # its tokens are charged after the answer
    code, message = refusal(lambda: stub.Classify(texts(1), metadata=bearer(THRIFTY), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 0.01 tokens a second" in message, message


def test_a_bad_key_file_stops_the_server_at_start_naming_the_field():
    work = tempfile.mkdtemp(prefix="qvi_keys_bad_")
    try:
        keys = os.path.join(work, "keys.json")
        write_keys(keys, {"name": "app", "sha256": hashlib.sha256(b"x").hexdigest(), "scopes": ["infer", "write"]})
        out = subprocess.run([SERVER, "--model-store", STORE, "--port", "0", "--metrics-port", "0", "--http-port", "0",
                              "--device", "cpu", "--api-keys", keys], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out
        assert f'--api-keys {keys}: keys[0] (app).scopes has "write", which is none of' in out.stderr, out.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)


def raw_http(address, method, path, body, headers):
    """(status, JSON) of a request whose headers go as listed, repeats included (http.client's request()
    takes a dict, which cannot repeat one)."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, path)
        data = json.dumps(body).encode()
        for name, value in [*headers, ("Content-Type", "application/json"), ("Content-Length", str(len(data)))]:
            conn.putheader(name, value)
        conn.endheaders(data)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        conn.close()


def test_a_repeated_authorization_is_refused_whichever_comes_first(api, keyed):
    """A proxy that appends its own Authorization beside the client's must not have the first one win:
    UNAUTHENTICATED over gRPC, 400 over HTTP, naming the problem, never a value."""
    for first, second in ((SEARCH, "bogus-value-1"), ("bogus-value-2", SEARCH), (SEARCH, SEARCH)):
        metadata = (("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}"))
        pb, pbg = api
        code, message = refusal(lambda: pbg.InferenceStub(keyed.channel).Classify(
            pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]), metadata=metadata,
            timeout=30))
        assert code == grpc.StatusCode.UNAUTHENTICATED, (first, second, code, message)
        assert message == "the call carries the authorization header more than once; send it once"
        status, answer = raw_http(keyed.http_address, "POST", "/v1/models/sentiment:classify",
                                  {"texts": ["A fine film."]},
                                  [("Authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}")])
        assert status == 400, (first, second, status, answer)
        assert answer["error"] == "the request carries the Authorization header more than once; send it once"
    # One header, as ever: answered.
    assert classify(api, keyed.channel, SEARCH).results[0].labels


def test_oversized_metadata_fails_its_own_call_and_no_other_on_the_connection(api, keyed):
    """A call whose metadata is over --max-metadata-bytes (8 KiB) is refused alone, RESOURCE_EXHAUSTED naming the
    limit; a stream in flight on the same channel (one HTTP/2 connection) goes on. gRPC 1.51's transport would reset
    the connection -- every call on it -- were its own limit not set far above (256 KiB; docs/security.md)."""
    import queue
    pb, pbg = api
    stub = pbg.InferenceStub(keyed.channel)
    outbox = queue.Queue()

    def requests():
        while (request := outbox.get()) is not None:
            yield request

    stream = stub.ClassifyStream(requests(), metadata=bearer(SEARCH), timeout=120)
    for i, padding in enumerate((8 * 1024, 10 * 1024, 16 * 1024, 100 * 1024)):
        outbox.put(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]))
        assert next(stream).index == i  # the stream is in flight on the connection
        metadata = bearer(SEARCH) + (("x-padding", "p" * padding),)
        code, message = refusal(lambda: stub.Classify(
            pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]), metadata=metadata,
            timeout=30))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (padding, code, message)
        assert message == ("the call's metadata is over the limit of 8192 bytes (--max-metadata-bytes; each entry "
                           "counts its key, its value and 32); send less"), message
    outbox.put(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]))
    last = next(stream)
    assert last.index == 4 and last.WhichOneof("answer") == "response", last
    outbox.put(None)
    assert list(stream) == []
    # Just under the limit, key included: answered, on the same connection as ever.
    fits = 8192 - (len("authorization") + len(f"Bearer {SEARCH}") + 32) - (len("x-padding") + 32) - 200
    assert stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]),
                         metadata=bearer(SEARCH) + (("x-padding", "p" * fits),), timeout=30).results


def test_an_empty_key_file_is_refused_unless_a_locked_server_is_meant(api):
    work = tempfile.mkdtemp(prefix="qvi_keys_empty_")
    try:
        keys = os.path.join(work, "keys.json")
        write_keys(keys)
        out = subprocess.run([SERVER, "--model-store", STORE, "--port", "0", "--metrics-port", "0", "--http-port", "0",
                              "--device", "cpu", "--api-keys", keys], capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, out
        assert (f"--api-keys {keys}: keys is empty, which would refuse every call but the probes; to lock the server "
                "on purpose, start it with --api-keys-allow-empty") in out.stderr, out.stderr
        locked = ServerProcess(STORE, work, "--api-keys", keys, "--api-keys-allow-empty")
        try:
            code, _ = refusal(lambda: classify(api, locked.channel, SEARCH))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        finally:
            locked.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_qvi_client_sends_the_key_from_the_environment_or_its_flag(keyed):
    client = os.path.join(REPO, "build", "qvi-client")
    base = [client, "--server", keyed.address, "classify", "--model", "sentiment", "A fine film."]
    env = {k: v for k, v in os.environ.items() if k != "QVI_API_KEY"}
    out = subprocess.run(base, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1, out
    assert out.stderr.startswith("error: UNAUTHENTICATED: this server wants an API key"), out.stderr
    assert "hint: give the key with --api-key KEY, or in the environment as QVI_API_KEY" in out.stderr
    out = subprocess.run(base, capture_output=True, text=True, timeout=60, env={**env, "QVI_API_KEY": SEARCH})
    assert out.returncode == 0 and ("positive" in out.stdout or "negative" in out.stdout), out
    out = subprocess.run(base + ["--api-key", READER], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "error: PERMISSION_DENIED: the API key 'reader' lacks the scope 'infer'" in out.stderr
    assert "hint: ask whoever runs the server for a key with that scope" in out.stderr
