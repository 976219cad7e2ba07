"""Model control over the wire (--model-control explicit; docs/serving.md "Model control"): OIP's
repository extension as tritonclient calls it over gRPC and HTTP (get_model_repository_index, load_model,
unload_model), behind the `admin` scope. Only the models loaded are served; the index shows the whole
store; an unload takes a model out of service while what it holds is answered by it; refusals name why."""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import grpc
import pytest

from conftest import oip_calls
from qvi_testing import SERVER, ServerProcess, http_call, null_twin, wait_until

OPS = "ops-secret-5e1a"  # admin
APP = "app-secret-0b9c"  # infer and read


def keys_file(work):
    path = os.path.join(work, "keys.json")
    with open(path, "w") as f:
        json.dump({"keys": [
            {"name": "ops", "sha256": hashlib.sha256(OPS.encode()).hexdigest(), "scopes": ["admin"]},
            {"name": "app", "sha256": hashlib.sha256(APP.encode()).hexdigest(), "scopes": ["infer", "read"]}]}, f)
    return path


@pytest.fixture(scope="module")
def explicit():
    work = tempfile.mkdtemp(prefix="qvi_control_")
    store = os.path.join(work, "store")
    null_twin(store, "alpha")
    null_twin(store, "beta")
    # 2 s a batch, one text a batch: requests are still in flight when the model is unloaded.
    null_twin(store, "slow", device_us={"per_batch": 2_000_000, "asynchronous": False})
    with open(os.path.join(store, "slow", "serving.json"), "w") as f:
        json.dump({"max_batch_size": 1, "instances": 1}, f)
    os.makedirs(os.path.join(store, "broken", "1"))
    with open(os.path.join(store, "broken", "1", "model.null"), "w") as f:
        f.write('{"manifest": "not an object"}')
    proc = ServerProcess(store, work, "--model-control", "explicit", "--load-model", "alpha", "--load-model", "slow",
                         "--api-keys", keys_file(work))
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def bearer(key):
    return (("authorization", f"Bearer {key}"),)


def classify(api, proc, model):
    pb, pbg = api
    return pbg.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name=model), texts=["A fine film."]), metadata=bearer(APP), timeout=30)


def refusal(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def admin(client, rpc, **fields):
    return {"client": client, "rpc": rpc, "headers": {"authorization": f"Bearer {OPS}"}, **fields}


def index_of(interop_python, proc, client="triton"):
    address = proc.address if client == "triton" else proc.http_address
    (index,) = oip_calls(interop_python, address, [admin(client, "repository_index")])
    assert index["ok"], index
    return {(m["name"], m.get("version", "")): (m.get("state", ""), m.get("reason", "")) for m in index["value"]}


def test_only_the_loaded_models_serve_and_the_index_shows_the_whole_store(api, explicit, interop_python):
    assert classify(api, explicit, "alpha").results
    code, details = refusal(lambda: classify(api, explicit, "beta"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert details == ("model 'beta' is not loaded: the server's model control is explicit, and an admin loads it "
                       "(OIP RepositoryModelLoad, POST /v2/repository/models/beta/load)")
    for client in ("triton", "triton_http"):
        index = index_of(interop_python, explicit, client)
        assert index[("alpha", "1")] == ("READY", ""), (client, index)
        assert index[("beta", "")] == ("UNAVAILABLE", "not loaded"), (client, index)
        assert index[("broken", "")] == ("UNAVAILABLE", "not loaded"), (client, index)
    status, ready, _ = http_call(explicit.http_address, "POST", "/v2/repository/index", {"ready": True},
                                 {"Authorization": f"Bearer {OPS}"})
    assert status == 200 and {m["name"] for m in ready} == {"alpha", "slow"}, ready


def test_tritonclient_loads_and_unloads_over_grpc_and_http(api, explicit, interop_python):
    (loaded,) = oip_calls(interop_python, explicit.address, [admin("triton", "load_model", model="beta")])
    assert loaded["ok"], loaded
    assert classify(api, explicit, "beta").results
    (unloaded,) = oip_calls(interop_python, explicit.http_address, [admin("triton_http", "unload_model", model="beta")])
    assert unloaded["ok"], unloaded
    assert refusal(lambda: classify(api, explicit, "beta"))[0] == grpc.StatusCode.UNAVAILABLE
    wait_until(lambda: ("beta", "") in index_of(interop_python, explicit), "beta gone from the served models",
               seconds=30)
    (again,) = oip_calls(interop_python, explicit.http_address, [admin("triton_http", "load_model", model="beta")])
    assert again["ok"], again
    assert classify(api, explicit, "beta").results


def test_kserves_grpc_stub_loads_and_unloads_with_its_own_messages(api, explicit, interop_python):
    """KServe's grpc_predict_v2.proto puts the model's name in field 1, where Triton's has repository_name;
    the server reads a request with field 1 alone as KServe's, and answers with KServe's fields."""
    auth = {"authorization": f"Bearer {OPS}"}
    loaded, unloaded = oip_calls(interop_python, explicit.address, [
        {"client": "kserve", "rpc": "load_model", "model": "beta", "headers": auth},
        {"client": "kserve", "rpc": "unload_model", "model": "beta", "headers": auth}])
    assert loaded == {"ok": True, "value": {"model_name": "beta", "loaded": True}}, loaded
    assert unloaded == {"ok": True, "value": {"model_name": "beta", "unloaded": True}}, unloaded
    assert refusal(lambda: classify(api, explicit, "beta"))[0] == grpc.StatusCode.UNAVAILABLE


def test_a_load_that_cannot_serve_says_why(explicit, interop_python):
    for client, address in (("triton", explicit.address), ("triton_http", explicit.http_address)):
        broken, unknown, configured = oip_calls(interop_python, address, [
            admin(client, "load_model", model="broken"), admin(client, "load_model", model="nope"),
            admin(client, "load_model", model="beta", config='{"max_batch_size": 4}')])
        assert not broken["ok"] and "model 'broken' did not load: version 1 FAILED: " in broken["message"], broken
        assert not unknown["ok"] and "model 'nope' is not in the model store" in unknown["message"], unknown
        assert "the store holds: alpha, beta, broken, slow" in unknown["message"], unknown
        assert not configured["ok"], configured
        assert "parameters.config: a load takes the model from its folder" in configured["message"], configured


def test_model_control_needs_the_admin_scope(explicit, interop_python):
    for client, address in (("triton", explicit.address), ("triton_http", explicit.http_address)):
        app, anonymous = oip_calls(interop_python, address, [
            {"client": client, "rpc": "unload_model", "model": "alpha",
             "headers": {"authorization": f"Bearer {APP}"}},
            {"client": client, "rpc": "repository_index"}])
        http = client == "triton_http"
        assert not app["ok"] and "the API key 'app' lacks the scope 'admin'" in app["message"], app
        assert str(app["code"]) == ("403" if http else "PERMISSION_DENIED"), app
        assert not anonymous["ok"] and str(anonymous["code"]) == ("401" if http else "UNAUTHENTICATED"), anonymous
    assert index_of(interop_python, explicit)[("alpha", "1")][0] == "READY", "nothing was unloaded"


def test_requests_in_flight_when_their_model_is_unloaded_are_answered_by_it(api, explicit, interop_python):
    pb, pbg = api
    stub = pbg.InferenceStub(explicit.channel)
    request = pb.ClassifyRequest(model=pb.ModelSpec(name="slow"), texts=["A fine film."])
    first = stub.Classify.future(request, metadata=bearer(APP), timeout=60)
    second = stub.Classify.future(request, metadata=bearer(APP), timeout=60)
    # The second waits in the queue only once the first is on the (emulated) device.
    wait_until(lambda: explicit.metrics().get('qvi_queue_texts{model="slow",version="1"}') == 1,
               "one request on the device and one queued", seconds=30)
    (unloaded,) = oip_calls(interop_python, explicit.address, [admin("triton", "unload_model", model="slow")])
    assert unloaded["ok"], unloaded
    assert refusal(lambda: classify(api, explicit, "slow"))[0] == grpc.StatusCode.UNAVAILABLE
    for future in (first, second):
        answer = future.result(timeout=60)
        assert answer.model.version == 1 and answer.results[0].labels
    assert "RepositoryModelUnload 'slow' (key ops): OK" in explicit.log()


def test_poll_mode_refuses_loads_and_a_bad_load_model_stops_the_server(interop_python, tmp_path):
    store = str(tmp_path / "store")
    null_twin(store, "alpha")
    proc = ServerProcess(store, str(tmp_path))
    try:
        index, load = oip_calls(interop_python, proc.address, [{"client": "triton", "rpc": "repository_index"},
                                                               {"client": "triton", "rpc": "load_model",
                                                                "model": "alpha"}])
        assert index["ok"] and index["value"] == [{"name": "alpha", "version": "1", "state": "READY"}], index
        assert not load["ok"] and load["code"] == "FAILED_PRECONDITION", load
        assert "start it with --model-control explicit" in load["message"], load
    finally:
        proc.stop()
    out = subprocess.run([SERVER, "--model-store", store, "--port", "0", "--http-port", "-1", "--metrics-port", "-1",
                          "--device", "cpu", "--model-control", "explicit", "--load-model", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"--load-model 'nope': the model store {store} has no such model; it holds: alpha" in out.stderr, out.stderr
