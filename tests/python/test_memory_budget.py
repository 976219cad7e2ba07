"""The memory budget (--device-memory-budget), idle unloading (--unload-idle-after) and loads on demand
(--load-on-demand), end to end (docs/serving.md "Memory budget"). The models are null twins whose
serving.json states their footprint (`memory_bytes`), so that what fits is exact; the measured footprint
of real models is checked in the C++ tests and shown by qvi_model_memory_bytes."""
import json
import os
import shutil
import tempfile

import grpc
import pytest

from conftest import oip_calls
from qvi_testing import ServerProcess, http_call, null_twin, wait_until

MIB = 1 << 20


def twin(store, name, mib):
    null_twin(store, name)
    with open(os.path.join(store, name, "serving.json"), "w") as f:
        json.dump({"memory_bytes": mib * MIB}, f)


def classify(api, proc, model, timeout=30):
    pb, pbg = api
    return pbg.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name=model), texts=["A fine film."]), timeout=timeout)


def refusal(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


@pytest.fixture(scope="module")
def budget():
    work = tempfile.mkdtemp(prefix="qvi_budget_")
    store = os.path.join(work, "store")
    for name in ("alpha", "beta", "gamma"):
        twin(store, name, 40)
    twin(store, "huge", 200)
    proc = ServerProcess(store, work, "--model-control", "explicit", "--load-model", "alpha", "--load-model", "beta",
                         "--device-memory-budget", "100MiB")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_a_load_over_the_budget_unloads_the_least_recently_used_idle_model(api, budget, interop_python):
    assert classify(api, budget, "beta").results
    assert classify(api, budget, "alpha").results  # alpha asked for last: beta is the least recently used
    (loaded,) = oip_calls(interop_python, budget.address, [{"client": "triton", "rpc": "load_model",
                                                            "model": "gamma"}])
    assert loaded["ok"], loaded
    assert classify(api, budget, "gamma").results and classify(api, budget, "alpha").results
    why = ("unloaded to make room for 'gamma' within the memory budget of cpu (the least recently used idle "
           "model)")
    code, details = refusal(lambda: classify(api, budget, "beta"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details.startswith(f"model 'beta' is not loaded: {why}; "), details
    status, body, _ = http_call(budget.http_address, "POST", "/v1/models/beta:classify", {"texts": ["A fine film."]},
                                {"Content-Type": "application/json"})
    assert status == 503 and why in json.dumps(body), (status, body)

    def index():
        (listed,) = oip_calls(interop_python, budget.http_address, [{"client": "triton_http",
                                                                     "rpc": "repository_index"}])
        assert listed["ok"], listed
        return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in listed["value"]}

    wait_until(lambda: index().get("beta") == ("UNAVAILABLE", why), "beta listed as resting, with why", seconds=30)
    m = budget.metrics()
    assert m['qvi_model_memory_bytes{device="cpu",model="gamma",version="1"}'] == 40 * MIB, m
    assert 'qvi_model_memory_bytes{device="cpu",model="beta",version="1"}' not in m
    assert m['qvi_model_evictions_total{model="beta",reason="budget"}'] == 1
    assert m['qvi_model_loads_total{model="gamma",reason="admin"}'] == 1
    assert m['qvi_model_loads_total{model="alpha",reason="poll"}'] == 1
    assert "model beta: unloaded (budget); it rests until asked for" in budget.log()


def test_a_model_the_budget_cannot_hold_is_refused_and_unloads_nothing(api, budget, interop_python):
    for client, address, code in (("triton", budget.address, "RESOURCE_EXHAUSTED"),
                                  ("triton_http", budget.http_address, "429")):
        (huge,) = oip_calls(interop_python, address, [{"client": client, "rpc": "load_model", "model": "huge"}])
        assert not huge["ok"] and str(huge["code"]) == code, huge
        assert ("model 'huge' did not load: model 'huge' needs about 200.0 MiB of cpu and the memory budget "
                "(100.0 MiB, --device-memory-budget) has ") in huge["message"], huge
        assert huge["message"].endswith("; it needs more than the whole budget"), huge
    assert classify(api, budget, "alpha").results and classify(api, budget, "gamma").results, "nothing was unloaded"


@pytest.fixture(scope="module")
def on_demand():
    work = tempfile.mkdtemp(prefix="qvi_demand_")
    store = os.path.join(work, "store")
    null_twin(store, "alpha")
    proc = ServerProcess(store, work, "--load-on-demand", "--unload-idle-after", "1s")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_an_idle_model_unloads_and_a_request_of_each_protocol_loads_it_again(api, on_demand, interop_python):
    """Poll mode: alpha is loaded at start, unloaded after a second without requests, and brought back
    by the next request, whichever protocol it comes by; each waits for the load and is answered."""
    def evictions():
        return on_demand.metrics().get('qvi_model_evictions_total{model="alpha",reason="idle"}', 0)

    def native_grpc():
        assert classify(api, on_demand, "alpha").results

    def triton(client, address):
        def call():
            (answer,) = oip_calls(interop_python, address, [{"client": client, "rpc": "infer", "model": "alpha",
                                                             "texts": ["A fine film."], "timeout": 60}])
            assert answer["ok"], answer
        return call

    def native_http():
        status, body, _ = http_call(on_demand.http_address, "POST", "/v1/models/alpha:classify",
                                    {"texts": ["A fine film."]}, {"Content-Type": "application/json"})
        assert status == 200 and body["results"], (status, body)

    calls = [native_grpc, triton("triton", on_demand.address), triton("triton_http", on_demand.http_address),
             native_http]
    for n, call in enumerate(calls, start=1):
        wait_until(lambda: evictions() >= n, f"alpha unloaded when idle ({n})", seconds=30)
        call()
    m = on_demand.metrics()
    assert m['qvi_model_loads_total{model="alpha",reason="demand"}'] == len(calls), m
    assert m['qvi_model_loads_total{model="alpha",reason="poll"}'] == 1
    assert "model alpha: unloaded (idle); it rests until asked for" in on_demand.log()


@pytest.fixture(scope="module")
def crowded():
    """Three models and a budget that holds one and a half of them, each loaded when a request asks."""
    work = tempfile.mkdtemp(prefix="qvi_crowded_")
    store = os.path.join(work, "store")
    for name in ("alpha", "beta", "gamma"):
        twin(store, name, 40)
    proc = ServerProcess(store, work, "--model-control", "explicit", "--load-on-demand", "--device-memory-budget",
                         "60MiB")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_busy_tenants_under_the_budget_are_all_answered(api, crowded):
    """Eight clients on one shared channel, each calling one of the models back to back, and one client alternating over the
    three without a pause: only one model fits at a time, so each load waits for the model in the way to finish its
    requests and takes its place. Every call is answered OK within its deadline -- none 'not loaded', none refused
    because no model was idle (docs/serving.md, "Memory budget")."""
    import threading
    failures = []

    def tenant(model, calls):
        for _ in range(calls):
            try:
                assert classify(api, crowded, model, timeout=30).results
            except Exception as e:  # noqa: BLE001 -- every failure is reported
                failures.append((model, getattr(e, "details", lambda: repr(e))()))

    threads = [threading.Thread(target=tenant, args=(("alpha", "beta", "gamma")[i % 3], 10)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for n in range(30):  # one client, one call at a time, over the three in turn
        model = ("alpha", "beta", "gamma")[n % 3]
        assert classify(api, crowded, model, timeout=30).results, (n, model)
    m = crowded.metrics()
    evicted = sum(m.get(f'qvi_model_evictions_total{{model="{name}",reason="budget"}}', 0)
                  for name in ("alpha", "beta", "gamma"))
    assert evicted >= 29, m  # the alternating client alone swaps on every call
    assert sum(1 for k in m if k.startswith("qvi_model_memory_bytes{")) <= 1, "never more than the budget holds"
