"""Request priorities end to end (docs/serving.md, "Priorities"): the native `priority` field, OIP's
`priority` parameter as tritonclient sends it, the HTTP header X-Request-Priority, and an API key's default
and highest priority. A model whose (emulated) device holds the first batch until the test lets it go, one
text a batch, and a queue of 3 texts makes the order visible: a high-priority request that finds the queue
full of low-priority ones takes the newest one's place (that one is answered RESOURCE_EXHAUSTED, and
counted), and is served before the low-priority ones that came before it."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import grpc
import pytest

from conftest import oip_calls
from qvi_testing import REPO, STORE, ServerProcess, http_call, wait_until

APP = "app-secret-4c1d"  # infer and read, any priority
BULK = "bulk-secret-9e27"  # infer; low by default, normal at most


def entry(name, key, **fields):
    return {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), "scopes": ["infer", "read"], **fields}


@pytest.fixture(scope="module")
def busy():
    work = tempfile.mkdtemp(prefix="qvi_priorities_")
    store = os.path.join(work, "store")
    null = subprocess.run([sys.executable, "-m", "qvi", "null", "--artifact", os.path.join(STORE, "sentiment", "1",
                           "model.pt"), "--out", os.path.join(store, "fast", "1")],
                          cwd=os.path.join(REPO, "model_store"), capture_output=True, text=True, timeout=120)
    assert null.returncode == 0, null.stderr
    with open(os.path.join(store, "fast", "1", "model.null")) as f:
        twin = json.load(f)
    twin["manifest"]["name"] = "fast"
    with open(os.path.join(store, "fast", "1", "model.null"), "w") as f:
        json.dump(twin, f)
    # A batch stays on the device while work/hold exists (the test makes and removes it: no race with a
    # clock, which a loaded machine lost once under ASan), 0.1 s a batch, one batch at a time (not
    # pipelined), one text a batch, three texts queued at most; an aging longer than the test, so that
    # the order is the priorities' alone.
    os.makedirs(os.path.join(store, "queue", "1"))
    with open(os.path.join(store, "queue", "1", "model.null"), "w") as f:
        json.dump(dict(twin, manifest=dict(twin["manifest"], name="queue"),
                       device_us={"per_batch": 100_000, "asynchronous": False,
                                  "hold_while_file": os.path.join(work, "hold")}), f)
    with open(os.path.join(store, "queue", "serving.json"), "w") as f:
        json.dump({"max_batch_size": 1, "max_queued_texts": 3, "instances": 1, "priority_aging_ms": 600000}, f)
    keys = os.path.join(work, "keys.json")
    with open(keys, "w") as f:
        json.dump({"keys": [entry("app", APP), entry("bulk", BULK, priority="low", max_priority="normal")]}, f)
    proc = ServerProcess(store, work, "--api-keys", keys, "--access-log")
    yield proc
    if os.path.exists(os.path.join(work, "hold")):  # a test that failed holding a batch lets it go
        os.remove(os.path.join(work, "hold"))
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def bearer(key):
    return (("authorization", f"Bearer {key}"),)


def test_a_high_priority_request_takes_a_low_ones_place_and_is_served_before_them(api, busy):
    pb, pbg = api
    stub = pbg.InferenceStub(busy.channel)
    done = []  # request ids in the order their answers came
    lock = threading.Lock()

    def send(request_id, priority):
        future = stub.Classify.future(
            pb.ClassifyRequest(model=pb.ModelSpec(name="queue"), texts=[f"text of {request_id}"], priority=priority,
                               request_id=request_id), metadata=bearer(APP), timeout=60)
        def finished(_):
            with lock:
                done.append(request_id)
        future.add_done_callback(finished)
        return future

    def queued():
        return busy.metrics().get('qvi_queue_texts{model="queue",version="1"}')

    def outcome(future):
        return "pending" if not future.done() else future.exception() or "answered"

    hold = os.path.join(busy.work, "hold")
    open(hold, "w").close()  # low-0 stays on the device until the queue has been seen full
    try:
        lows = {"low-0": send("low-0", pb.PRIORITY_LOW)}
        wait_until(lambda: queued() == 0 or lows["low-0"].done(),
                   lambda: f"low-0 on the device (queued {queued()}, low-0 {outcome(lows['low-0'])})", seconds=30)
        assert not lows["low-0"].done(), f"low-0 ended before it was seen on the device: {outcome(lows['low-0'])}"
        for i in (1, 2, 3):  # one at a time, so that their order in the queue is known
            lows[f"low-{i}"] = send(f"low-{i}", pb.PRIORITY_LOW)
            wait_until(lambda: queued() == i, f"{i} texts queued", seconds=30)
        full = send("low-4", pb.PRIORITY_LOW)
        with pytest.raises(grpc.RpcError) as refused:
            full.result(timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "the model's queue is full (3 texts" in refused.value.details(), refused.value.details()

        high = send("high", pb.PRIORITY_HIGH)
        with pytest.raises(grpc.RpcError) as shed:
            lows["low-3"].result(timeout=30)  # the newest low one
        assert shed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert ("the model's queue was full and a request of a higher priority took this one's place "
                "(priority 3, low); retry with backoff") == shed.value.details()
        assert not lows["low-0"].done(), "low-0 stays on the device while the hold file exists"
    finally:  # whatever failed: the batches go on, and the server can stop
        if os.path.exists(hold):
            os.remove(hold)
    assert high.result(timeout=60).results[0].labels
    for name in ("low-0", "low-1", "low-2"):
        assert lows[name].result(timeout=60).results[0].labels, name
    assert done.index("high") < done.index("low-1") < done.index("low-2"), done
    assert done.index("low-0") < done.index("high"), "the one on the device finished first"

    wait_until(lambda: busy.metrics().get('qvi_queue_shed_texts_total{model="queue",priority="low"}') == 1,
               lambda: f"the shed text counted: {busy.metrics()}", seconds=30)
    wait_until(lambda: "request_id=\"high\"" in busy.log(), "the high request's access line", seconds=30)
    line = next(li for li in busy.log().splitlines() if 'request_id="high"' in li)
    assert "key=app priority=high" in line and "code=OK" in line, line
    line = next(li for li in busy.log().splitlines() if 'request_id="low-3"' in li)
    assert "priority=low" in line and "code=RESOURCE_EXHAUSTED" in line, line


def test_get_model_reports_the_aging_serving_json_set(api, busy):
    pb, pbg = api
    model = pbg.InferenceStub(busy.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="queue")),
                                                     metadata=bearer(APP), timeout=30).model
    assert model.versions[0].metadata.batching.priority_aging_ms == 600000


def test_a_priority_that_is_none_is_refused_naming_the_field(api, busy, interop_python):
    pb, pbg = api
    stub = pbg.InferenceStub(busy.channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="fast"), texts=["fine"], priority=7),
                      metadata=bearer(APP), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("priority: 7 is not a priority; it takes 0 (the default), 1 (high)"), \
        e.value.details()

    headers = {"Authorization": f"Bearer {APP}"}
    status, answer, _ = http_call(busy.http_address, "POST", "/v1/models/fast:classify", {"texts": ["fine"]},
                                  {**headers, "X-Request-Priority": "urgent"})
    assert status == 400 and answer["error"].startswith("X-Request-Priority: 'urgent' is not a priority"), answer
    status, answer, _ = http_call(busy.http_address, "POST", "/v1/models/fast:classify",
                                  {"texts": ["fine"], "priority": "PRIORITY_LOW"}, headers)
    assert status == 200, answer

    infer = {"rpc": "infer", "model": "fast", "texts": ["a moving film"], "outputs": [{"name": "label"}],
             "headers": {"authorization": f"Bearer {APP}"}}
    for client, address in (("triton", busy.address), ("triton_http", busy.http_address)):
        high, bad = oip_calls(interop_python, address, [{"client": client, **infer, "priority": 1},
                                                         {"client": client, **infer, "priority": 9}])
        assert high["ok"], (client, high)
        assert not bad["ok"] and "parameters.priority: 9 is not a priority" in bad["message"], (client, bad)


def test_a_key_sets_its_default_priority_and_may_be_held_below_high(api, busy, interop_python):
    pb, pbg = api
    stub = pbg.InferenceStub(busy.channel)
    answer = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="fast"), texts=["fine"], request_id="bulk-0"),
                           metadata=bearer(BULK), timeout=30)
    assert answer.results[0].labels
    wait_until(lambda: 'request_id="bulk-0"' in busy.log(), "bulk-0's access line", seconds=30)
    line = next(li for li in busy.log().splitlines() if 'request_id="bulk-0"' in li)
    assert "key=bulk priority=low" in line, line

    denied = "priority: API key 'bulk' may ask for normal priority at most, not high"
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="fast"), texts=["fine"], priority=pb.PRIORITY_HIGH),
                      metadata=bearer(BULK), timeout=30)
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, denied)
    status, answer, _ = http_call(busy.http_address, "POST", "/v1/models/fast:classify", {"texts": ["fine"]},
                                  {"Authorization": f"Bearer {BULK}", "X-Request-Priority": "high"})
    assert (status, answer["error"]) == (403, denied)
    status, answer, _ = http_call(busy.http_address, "POST", "/v1/models/fast:classify", {"texts": ["fine"]},
                                  {"Authorization": f"Bearer {BULK}", "X-Request-Priority": "normal"})
    assert status == 200, answer
    infer = {"rpc": "infer", "model": "fast", "texts": ["a moving film"], "outputs": [{"name": "label"}],
             "headers": {"authorization": f"Bearer {BULK}"}, "priority": 1}
    for client, address in (("triton", busy.address), ("triton_http", busy.http_address)):
        (result,) = oip_calls(interop_python, address, [{"client": client, **infer}])
        http = client == "triton_http"
        assert not result["ok"] and str(result["code"]) == ("403" if http else "PERMISSION_DENIED"), (client, result)
        assert denied in result["message"], (client, result)


def test_qvi_client_sends_the_priority_it_is_given(busy):
    base = [os.path.join(REPO, "build", "qvi-client"), "--server", busy.address, "--api-key", BULK, "classify",
            "--model", "fast"]
    out = subprocess.run(base + ["--priority", "high", "A fine film."], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert out.stderr.startswith("error: PERMISSION_DENIED: priority: API key 'bulk' may ask for normal priority at "
                                 "most, not high"), out.stderr
    assert "hint: ask for a lower --priority, or for a key that may ask for this one" in out.stderr
    out = subprocess.run(base + ["--priority", "normal", "A fine film."], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and ("positive" in out.stdout or "negative" in out.stdout), out
    out = subprocess.run(base + ["--priority", "urgent", "A fine film."], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--priority" in out.stderr and "urgent" in out.stderr, out
