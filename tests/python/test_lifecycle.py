"""Model lifecycle on a running qvi-server while clients keep sending: a new version dropped into
the store is picked up with zero failed requests, a corrupt model.pt is reported FAILED and nothing
else changes, and removed versions drain before they unload. The server polls its store every
0.1 s; waits are bounded and wait on the server's answers, never on a fixed sleep."""
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import grpc
import pytest

from qvi_testing import SERVER, STORE, ServerProcess, Traffic, wait_until

WAIT_S = 60


@pytest.fixture(scope="module")
def live(api):
    work = tempfile.mkdtemp(prefix="qvi_lifecycle_py_")
    store = os.path.join(work, "store")
    os.makedirs(os.path.join(store, "sentiment"))
    shutil.copytree(os.path.join(STORE, "sentiment", "1"), os.path.join(store, "sentiment", "1"))
    shutil.copytree(os.path.join(STORE, "ner"), os.path.join(store, "ner"))
    proc = ServerProcess(store, work, "--poll-store-seconds", "0.1")
    yield proc, store
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def add_version(store, version, content=None):
    """Stage under a name the server ignores, then rename into place (docs/serving.md)."""
    staging = os.path.join(store, "sentiment", f".{version}.tmp")
    os.makedirs(staging)
    if content is None:
        shutil.copy(os.path.join(STORE, "sentiment", "1", "model.pt"), os.path.join(staging, "model.pt"))
    else:
        with open(os.path.join(staging, "model.pt"), "wb") as f:
            f.write(content)
    os.rename(staging, os.path.join(store, "sentiment", str(version)))


def versions_of(api, channel, model="sentiment"):
    pb, pb_grpc = api
    m = pb_grpc.InferenceStub(channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=model)), timeout=30).model
    return [(v.version, pb.ModelState.Name(v.state), v.reason) for v in m.versions]


def health(channel, service):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=30).status
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


# The three tests run in order on one server: each starts from the state the one before left.

def test_new_version_is_picked_up_under_traffic_with_zero_failures(live, api):
    proc, store = live
    with Traffic(api, proc.channel) as traffic:
        traffic.wait_for_answers_from(1)
        add_version(store, 2)
        traffic.wait_for_answers_from(2)
    traffic.check()
    # The switch is atomic: once a client got version 2, it never got version 1 again.
    for vs in traffic.versions.values():
        if 2 in vs:
            assert 1 not in vs[vs.index(2):]
    wait_until(lambda: [(v, s) for v, s, _ in versions_of(api, proc.channel)] == [(2, "MODEL_STATE_READY")],
               "version 1 to unload")
    log = proc.log()
    assert "model sentiment@1 UNLOADING (replaced by version 2 (version policy latest:1))" in log
    assert "model sentiment@1 unloaded" in log
    assert health(proc.channel, "sentiment") == "SERVING"


def test_corrupt_version_is_failed_and_nothing_else_changes(live, api):
    proc, store = live
    with Traffic(api, proc.channel) as traffic:
        traffic.wait_for_answers_from(2)
        add_version(store, 3, content=b"\x00 not a TorchScript archive")
        wait_until(lambda: versions_of(api, proc.channel)[0][:2] == (3, "MODEL_STATE_FAILED"), "version 3 FAILED")
        traffic.wait_for_answers_from(2, more=traffic.served().count(2) + 20)
    traffic.check()
    states = versions_of(api, proc.channel)
    assert [(v, s) for v, s, _ in states] == [(3, "MODEL_STATE_FAILED"), (2, "MODEL_STATE_READY")]
    assert "cannot read" in states[0][2] and "model.pt" in states[0][2]
    assert set(traffic.served()) == {2}
    assert health(proc.channel, "sentiment") == "SERVING"
    assert [(v, s) for v, s, _ in versions_of(api, proc.channel, "ner")] == [(1, "MODEL_STATE_READY")]


def _export_disagreeing_model(store):
    """A Transformer classifier whose forward_without_maps leaves out the gates β that forward returns:
    were it served, answers from batches without maps would silently lose their gates."""
    import torch
    from qvi import artifact
    from qvi.models import ModelConfig, TransformerClassifier
    from qvi.tokenizer import TokenizerConfig, Vocabulary
    from typing import Dict

    class Disagreeing(TransformerClassifier):
        @torch.jit.export
        def forward_without_maps(self, token_ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
            out = self._run(token_ids, mask, "none")
            out.pop("gates")
            return out

    torch.manual_seed(0)
    cfg = ModelConfig("transformer", 4, 2, g="qvi", emb_dim=8, hidden=8, heads=2, ffn=8)
    vocab = Vocabulary(["[PAD]", "[UNK]", "a", "b"])
    manifest = artifact.build_manifest("disagreeing", cfg, TokenizerConfig(), vocab, ["x", "y"], "", {})
    # Exported beside the store, then moved in whole: the server must not see a half-made folder.
    staging = tempfile.mkdtemp(prefix="qvi_disagreeing_")
    artifact.export(Disagreeing(cfg), manifest, vocab, staging, 1)
    shutil.move(os.path.join(staging, "disagreeing"), os.path.join(store, "disagreeing"))
    shutil.rmtree(staging)


def test_a_model_whose_two_forwards_disagree_is_failed_with_the_reason(live, api):
    proc, store = live
    _export_disagreeing_model(store)

    def states():
        try:
            return [(v, s) for v, s, _ in versions_of(api, proc.channel, "disagreeing")]
        except grpc.RpcError as e:  # NOT_FOUND until the server's next look at the store
            assert e.code() == grpc.StatusCode.NOT_FOUND, e
            return []
    wait_until(lambda: states() == [(1, "MODEL_STATE_FAILED")], "disagreeing@1 FAILED")
    reason = versions_of(api, proc.channel, "disagreeing")[0][2]
    assert "the forward without maps returns" in reason and "gates" in reason, reason
    assert health(proc.channel, "sentiment") == "SERVING"  # the other models are untouched


def test_removed_versions_drain_and_the_older_one_returns(live, api):
    proc, store = live
    with Traffic(api, proc.channel) as traffic:
        traffic.wait_for_answers_from(2)
        shutil.rmtree(os.path.join(store, "sentiment", "3"))
        shutil.rmtree(os.path.join(store, "sentiment", "2"))
        traffic.wait_for_answers_from(1)
    traffic.check()  # requests in flight on version 2 when it was removed were answered
    wait_until(lambda: [(v, s) for v, s, _ in versions_of(api, proc.channel)] == [(1, "MODEL_STATE_READY")],
               "version 2 to unload")
    log = proc.log()
    assert "model sentiment@2 UNLOADING (removed from the store)" in log
    assert "model sentiment@2 unloaded" in log


def _export_stalling_model(store):
    """A small classifier whose forward pass never ends (in a test's time) once its batch holds the
    word "stall"; the warm-up at load, made of unknown tokens, runs normally."""
    import torch
    from qvi import artifact
    from qvi.models import ModelConfig, build_model
    from qvi.tokenizer import TokenizerConfig, Vocabulary

    class Stalling(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, trigger: int):
            super().__init__()
            self.inner = inner
            self.trigger = trigger

        def forward(self, token_ids: torch.Tensor, mask: torch.Tensor):
            out = self.inner(token_ids, mask)
            if bool((token_ids == self.trigger).any()):
                x = torch.full((64, 64), 0.01)
                for _ in range(100_000_000):  # about 20 minutes of one core
                    x = torch.tanh(x @ x)
                out["logits"] = out["logits"] + x.sum() * 0
            return out

    torch.manual_seed(0)
    vocab = Vocabulary(["[PAD]", "[UNK]", "stall", "fine"])
    cfg = ModelConfig("cnn_att", len(vocab), 2, g="qvi", emb_dim=8, hidden=8)
    manifest = artifact.build_manifest("stall", cfg, TokenizerConfig(), vocab, ["x", "y"], "", {})
    artifact.export(Stalling(build_model(cfg), vocab.id("stall")), manifest, vocab, store, 1)


def _wait_for_metric(proc, series, value):
    wait_until(lambda: proc.metrics().get(series) == value, f"{series} == {value}", seconds=WAIT_S, interval=0.05)


def test_shutdown_does_not_wait_for_a_hung_model_beyond_the_grace_period(api):
    """SIGTERM while a forward pass never ends: gRPC gives the call the grace period (1 s) and cancels
    it, the drain gets 2 s more, then the process exits 1 and says why, instead of hanging."""
    pb, pb_grpc = api
    work = tempfile.mkdtemp(prefix="qvi_hung_py_")
    store = os.path.join(work, "store")
    _export_stalling_model(store)
    proc = ServerProcess(store, work, "--shutdown-grace-seconds", "1")
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        assert stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="stall"), texts=["fine"]), timeout=30)
        # The call leaves qvi_requests_in_flight when gRPC is done with it, a little after the client has
        # its answer: wait for 0 first, or the gauge's 1 below could still be this call, and the signal
        # would come before the stalling call reached the server.
        _wait_for_metric(proc, "qvi_requests_in_flight", 0)
        outcome = {}

        def hung_call():
            try:
                stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="stall"), texts=["stall"]), timeout=120)
                outcome["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                outcome["code"] = e.code()

        caller = threading.Thread(target=hung_call)
        caller.start()
        # Wait until the stalling call is in flight (the first has left the gauge) and its text is not queued.
        def stalled():
            values = proc.metrics()
            return values.get("qvi_requests_in_flight") == 1 and \
                values.get('qvi_queue_texts{model="stall",version="1"}') == 0
        wait_until(stalled, "the stalling call in flight, its text out of the queue", seconds=WAIT_S, interval=0.05)
        start = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        code = proc.proc.wait(timeout=60)
        took = time.monotonic() - start
        caller.join(timeout=60)
        assert not caller.is_alive()
        assert code == 1, proc.log()
        assert took < 15, f"exit took {took:.1f} s"
        assert "shutdown had not finished 2 s after the grace period ended" in proc.log()
        assert outcome["code"] in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), outcome
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _add_hanging_model(store, name="hang"):
    """A model whose model.pt is a FIFO nobody writes to: opening it blocks for ever, as a load from a
    stuck network file system would. Staged and renamed into place like any version."""
    staging = os.path.join(store, name, ".1.tmp")
    os.makedirs(staging)
    os.mkfifo(os.path.join(staging, "model.pt"))
    os.rename(staging, os.path.join(store, name, "1"))


def _store_with_sentiment(work):
    store = os.path.join(work, "store")
    os.makedirs(os.path.join(store, "sentiment"))
    shutil.copytree(os.path.join(STORE, "sentiment", "1"), os.path.join(store, "sentiment", "1"))
    return store


def _states(api, channel, model):
    """[(version, state)] of a model, [] while the server does not know it yet."""
    try:
        return [(v, s) for v, s, _ in versions_of(api, channel, model)]
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return []
        raise


def _sigterm_and_time(proc):
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - start


def test_sigterm_during_startup_exits_at_once_abandoning_a_hung_load():
    """A load that never returns holds start-up (until --model-load-timeout-seconds); SIGTERM then
    ends the process in seconds, exit 0, naming the abandoned load, instead of after the timeout."""
    work = tempfile.mkdtemp(prefix="qvi_hung_start_py_")
    try:
        store = _store_with_sentiment(work)
        _add_hanging_model(store)
        log_path = os.path.join(work, "server.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([SERVER, "--model-store", store, "--port", "0", "--host", "127.0.0.1",
                                     "--port-file", os.path.join(work, "port"), "--device", "cpu",
                                     "--metrics-port", "-1", "--http-port", "-1"], stdout=log, stderr=subprocess.STDOUT)
        try:
            def read_log():
                with open(log_path, encoding="utf-8") as f:
                    return f.read()
            wait_until(lambda: "model hang@1 loading" in read_log() and "model sentiment@1 READY" in read_log(),
                       "the hung load to begin and the other model to load")
            code, took = _sigterm_and_time(proc)
            text = read_log()
            assert code == 0, text
            assert took < 10, f"exit took {took:.1f} s: {text}"
            assert "received signal 15 during start-up: abandoning model loads, not serving" in text
            assert "model hang@1 FAILED: loading abandoned: the server is shutting down" in text
            assert "not waiting for 1 abandoned model load(s) still running: hang@1 (running for" in text
            assert not os.path.exists(os.path.join(work, "port")), "it never served"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_hung_load_holds_up_no_rollout_and_shutdown_does_not_wait_for_it(api):
    """While one model's load hangs, another model's new version rolls out within the poll interval;
    SIGTERM then drains and exits 0 in seconds, naming the load it did not wait for."""
    work = tempfile.mkdtemp(prefix="qvi_hung_load_py_")
    store = _store_with_sentiment(work)
    proc = ServerProcess(store, work, "--poll-store-seconds", "0.1")
    try:
        _add_hanging_model(store)
        wait_until(lambda: _states(api, proc.channel, "hang") == [(1, "MODEL_STATE_LOADING")],
                   "the hung load to begin")
        add_version(store, 2)
        wait_until(lambda: (2, "MODEL_STATE_READY") in _states(api, proc.channel, "sentiment"),
                   "version 2 of the other model to be READY while the load hangs")
        assert _states(api, proc.channel, "hang") == [(1, "MODEL_STATE_LOADING")]
        proc.channel.close()
        code, took = _sigterm_and_time(proc.proc)
        log = proc.log()
        assert code == 0, log
        assert took < 10, f"exit took {took:.1f} s: {log}"
        assert "not waiting for 1 abandoned model load(s) still running: hang@1 (running for" in log
        assert "a hung model?" not in log, "no call or batch was hung"
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def test_max_connection_age_makes_clients_reconnect(api):
    """--max-connection-age-seconds: the server sends GOAWAY to a connection older than the age, so
    the client's channel goes IDLE and its next call opens a new connection (where a load balancer
    can pick another replica). Waits on the channel's own state changes, bounded."""
    pb, pb_grpc = api
    work = tempfile.mkdtemp(prefix="qvi_conn_age_py_")
    proc = ServerProcess(STORE, work, "--max-connection-age-seconds", "1",
                         "--max-connection-age-grace-seconds", "1")
    try:
        states, changed = [], threading.Condition()

        def record(state):
            with changed:
                states.append(state)
                changed.notify_all()

        channel = grpc.insecure_channel(proc.address)
        stub = pb_grpc.InferenceStub(channel)
        request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"])
        stub.Classify(request, timeout=10)
        channel.subscribe(record, try_to_connect=False)
        with changed:
            assert changed.wait_for(lambda: grpc.ChannelConnectivity.READY in states, timeout=WAIT_S), states
            ready_at = states.index(grpc.ChannelConnectivity.READY)
            # About 1 s (+-10% jitter) later the server ends the connection.
            assert changed.wait_for(lambda: grpc.ChannelConnectivity.IDLE in states[ready_at:], timeout=WAIT_S), \
                states
        assert stub.Classify(request, timeout=10).results[0].labels
        channel.close()
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("flag,field", [("--port", "address"), ("--metrics-port", "metrics_address")])
def test_a_second_server_on_a_port_in_use_is_refused_naming_the_flag(live, flag, field, tmp_path):
    """gRPC and cpp-httplib set SO_REUSEPORT by default, with which a second server would bind the same
    port and silently take part of the first one's traffic; it must refuse to start instead."""
    proc, _ = live
    port = getattr(proc, field).rsplit(":", 1)[1]
    ports = {"--port": "0", "--metrics-port": "0", "--http-port": "0", flag: port}
    second = subprocess.run([SERVER, "--model-store", str(tmp_path), "--host", "127.0.0.1", "--device", "cpu",
                             *[x for kv in ports.items() for x in kv]], capture_output=True, text=True, timeout=120)
    assert second.returncode != 0, second.stderr
    assert f"127.0.0.1:{port} ({flag}): is another process listening there?" in second.stderr + second.stdout, \
        second.stderr[-2000:]


def test_run_sh_passes_its_flags_to_the_server_over_its_own_defaults(tmp_path):
    """scripts/run.sh --port N (its own usage line) used to give qvi-server --port twice."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    port_file = tmp_path / "port"
    proc = subprocess.Popen(["scripts/run.sh", "--port=0", "--host", "127.0.0.1", "--port-file", str(port_file),
                             "--metrics-port", "0", "--http-port", "0", "--device", "cpu"], cwd=root,
                            env=dict(os.environ, QVI_SKIP_SETUP="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: port_file.exists() or proc.poll() is not None, "run.sh's server to start", seconds=120)
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        channel = grpc.insecure_channel(f"127.0.0.1:{int(port_file.read_text())}")
        grpc.channel_ready_future(channel).result(timeout=30)
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
