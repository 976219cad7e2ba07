"""Observability against real components: a real Prometheus (Debian's package) scrapes qvi-server
while clients send traffic, and PromQL through its HTTP API shows a request rate and latency
quantiles for each model; every query of the Grafana dashboard evaluates; the alerting rules load
in Prometheus and pass promtool's checks and unit tests; JSON logs are one object per line.
Bounded: every wait has a deadline and waits on the component's own answers."""
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import grpc
import pytest
import yaml

from qvi_testing import REPO, STORE, ServerProcess, Traffic, free_port, post_json, wait_until

DEPLOY = os.path.join(REPO, "deploy")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
WAIT_S = 90
POD = "qvi-serve-7d9f8-abcde"


@pytest.fixture(scope="module")
def served(api):
    work = tempfile.mkdtemp(prefix="qvi_obs_py_")
    proc = ServerProcess(STORE, work, "--access-log", "--log-format", "json")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def prometheus(served):
    assert PROMETHEUS, "prometheus is missing: scripts/setup.sh installs Debian's package"
    work = tempfile.mkdtemp(prefix="qvi_prom_")
    shutil.copy(os.path.join(DEPLOY, "prometheus", "alerts.yml"), work)
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yml]
scrape_configs:
  - job_name: qvi-serve
    static_configs:
      - targets: ["{served.metrics_address}"]
        # As Kubernetes service discovery labels a pod's series (what prometheus-adapter needs).
        labels: {{namespace: qvi-test, pod: {POD}}}
""")
    port = free_port()
    log = open(os.path.join(work, "prometheus.log"), "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    def ready():
        assert proc.poll() is None, open(log.name).read()
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    wait_until(ready, "prometheus to become ready", seconds=WAIT_S, interval=0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=30)
    log.close()
    shutil.rmtree(work, ignore_errors=True)


def api_get(base, path, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def query(base, expr):
    return api_get(base, "/api/v1/query", query=expr)["result"]


def per_model(result):
    return {r["metric"].get("model"): float(r["value"][1]) for r in result}


def test_prometheus_sees_request_rate_and_latency_per_model(served, prometheus, api):
    rate = "sum by (model) (rate(qvi_requests_total[30s]))"
    p99 = "histogram_quantile(0.99, sum by (model, le) (rate(qvi_request_duration_seconds_bucket[30s])))"
    p50_queue = "histogram_quantile(0.5, sum by (model, le) (rate(qvi_queue_duration_seconds_bucket[30s])))"
    with Traffic(api, served.channel, classifiers=2):
        def latencies():
            rates, lat, queue = per_model(query(prometheus, rate)), per_model(query(prometheus, p99)), \
                per_model(query(prometheus, p50_queue))
            ready = all(rates.get(m, 0) > 0 and math.isfinite(lat.get(m, math.nan)) and lat[m] > 0
                        and math.isfinite(queue.get(m, math.nan)) for m in ("sentiment", "ner"))
            return lat if ready else None
        lat = wait_until(latencies, "a request rate, p99 latency and queue wait per model", seconds=WAIT_S,
                         interval=0.5)
    for m in ("sentiment", "ner"):
        assert 0 < lat[m] < 10, lat  # seconds; inside the histogram's range
    targets = api_get(prometheus, "/api/v1/targets")["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets


def test_tokens_and_each_answers_size_and_time_are_counted_by_the_explanations_asked(served, api):
    """qvi_tokens_total grows by the texts' tokens; an answer with α and β lands in its own series of
    qvi_answer_size_bytes and qvi_answer_make_seconds, larger than a plain one."""
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(served.channel)
    before = served.metrics()
    plain = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a fine film"]), timeout=30)
    explained = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a fine film"],
                                                 options=pb.OutputOptions(attention=True, gates=True)), timeout=30)
    tokens = plain.results[0].num_tokens + explained.results[0].num_tokens

    def grew(series):
        return served.metrics().get(series, 0) - before.get(series, 0)

    wait_until(lambda: grew('qvi_tokens_total{model="sentiment",version="1"}') >= tokens,
               "the two texts' tokens counted", seconds=30)
    assert grew('qvi_tokens_total{model="sentiment",version="1"}') == tokens
    plain_series, explained_series = ('{explain="none",model="sentiment"}',
                                      '{explain="attention+gates",model="sentiment"}')
    wait_until(lambda: grew(f"qvi_answer_size_bytes_count{explained_series}") == 1, "the answer counted", seconds=30)
    assert grew(f"qvi_answer_make_seconds_count{explained_series}") == 1
    assert grew(f"qvi_answer_size_bytes_count{plain_series}") >= 1
    assert grew(f"qvi_answer_size_bytes_sum{explained_series}") > explained.ByteSize() * 0.5
    assert grew(f"qvi_answer_size_bytes_sum{explained_series}") > 2 * plain.ByteSize()


def test_prometheus_adapter_rules_give_the_autoscaler_a_value_per_pod(served, prometheus, api):
    """deploy/k8s/autoscaling: each rule's seriesQuery finds our series, and its metricsQuery, filled in
    as prometheus-adapter fills it for a pods query, returns one finite value for the pod."""
    with open(os.path.join(DEPLOY, "k8s", "autoscaling", "prometheus-adapter-values.yaml")) as f:
        rules = yaml.safe_load(f)["rules"]["custom"]
    names = {r["name"]["as"] for r in rules}
    assert "qvi_requests_in_flight" in names  # what deploy/k8s/base/hpa.yaml scales on
    with Traffic(api, served.channel, classifiers=2):
        deadline = time.monotonic() + WAIT_S
        pending = list(rules)
        while pending:
            rule = pending[0]
            series = rule["seriesQuery"].split("{")[0]
            concrete = (rule["metricsQuery"].replace("<<.Series>>", series)
                        .replace("<<.LabelMatchers>>", f'namespace="qvi-test",pod=~"{POD}"')
                        .replace("<<.GroupBy>>", "pod"))
            found = query(prometheus, rule["seriesQuery"])
            result = query(prometheus, concrete)  # raises unless Prometheus accepted the query
            if found and result:
                assert [r["metric"]["pod"] for r in result] == [POD], result
                value = float(result[0]["value"][1])
                assert math.isfinite(value) and value >= 0, (rule["name"]["as"], value)
                pending.pop(0)
                continue
            assert time.monotonic() < deadline, f"{rule['name']['as']}: no value yet ({concrete})"
            time.sleep(0.5)


def test_every_dashboard_query_evaluates(served, prometheus):
    with open(os.path.join(DEPLOY, "grafana", "qvi-serve.json")) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        concrete = expr.replace("$__rate_interval", "30s").replace("$model", ".*")
        result = query(prometheus, concrete)  # raises unless Prometheus accepted it
        assert isinstance(result, list), expr
    # The series the dashboard draws exist for the demo models.
    assert {"sentiment", "ner"} <= set(per_model(query(prometheus, "qvi_model_state == 1")))
    # State by device: docs/observability.md's join of qvi_model_state with qvi_model_info.
    joined = query(prometheus, "(qvi_model_state == 1) * on (model, version) group_left (device) qvi_model_info")
    by_model = {r["metric"]["model"]: (r["metric"]["state"], r["metric"]["device"]) for r in joined}
    assert by_model.get("sentiment") == ("ready", "cpu") and by_model.get("ner") == ("ready", "cpu"), joined


def test_alert_rules_load_and_pass_their_unit_tests(prometheus):
    groups = api_get(prometheus, "/api/v1/rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert {"QviHighErrorRate", "QviHighP99Latency", "QviModelNotReady", "QviModelVersionFailed"} <= set(rules)
    assert all(r["health"] == "ok" for r in rules.values()), rules
    folder = os.path.join(DEPLOY, "prometheus")
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"],
                 ["check", "config", "prometheus.yml"]):
        out = subprocess.run([PROMTOOL, *args], cwd=folder, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr


def test_json_logs_are_one_object_per_line(served, api):
    pb, pb_grpc = api
    pb_grpc.InferenceStub(served.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine", "a \"quoted\"\nline"],
                           request_id="json-log-1"), timeout=30)
    wait_until(lambda: '"json-log-1"' in served.log(), "the access lines", seconds=WAIT_S)
    records = [json.loads(line) for line in served.log().splitlines() if line.strip()]
    assert all({"time", "level"} <= set(r) for r in records)
    assert any("msg" in r and "READY" in r["msg"] for r in records)
    access = [r for r in records if r.get("request_id") == "json-log-1"]
    assert len(access) == 1, access
    a = access[0]
    assert (a["logger"], a["method"], a["model"], a["version"], a["texts"], a["code"]) == \
        ("access", "Classify", "sentiment", 1, 2, "OK")
    assert a["tokens"] >= 5 and a["ms"] >= a["compute_ms"] > 0 and a["queue_ms"] >= 0


def _access_records(proc, request_ids):
    wait_until(lambda: all(f'"{r}"' in proc.log() for r in request_ids), "the access lines", seconds=WAIT_S)
    records = [json.loads(line) for line in proc.log().splitlines() if line.strip()]
    return {r["request_id"]: r for r in records if r.get("request_id") in request_ids}


TIMINGS = ("prepare_ms", "forward_ms", "postprocess_ms", "serialize_ms")


def test_a_traceparent_puts_its_trace_id_and_the_timings_in_the_access_line(served, api, oip_api):
    """W3C Trace Context over gRPC metadata: a call with a valid traceparent is logged under its
    trace id with where its time went, on both APIs; an invalid one is ignored, as the
    specification says; without one (and --trace-rate 0) the line has neither."""
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(served.channel)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine", "a dull film"],
                                     request_id="trace-1"),
                  metadata=[("traceparent", f"00-{trace}-00f067aa0ba902b7-01")], timeout=30)
    stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=["Ada Lovelace lived in London"],
                           request_id="trace-2"),
             metadata=[("traceparent", f"00-{trace.upper()}-00f067aa0ba902b7-01")], timeout=30)
    stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"], request_id="trace-3"),
                  timeout=30)
    opb, opbg = oip_api
    opbg.GRPCInferenceServiceStub(served.channel).ModelInfer(opb.ModelInferRequest(
        model_name="sentiment", id="trace-4", inputs=[opb.ModelInferRequest.InferInputTensor(
            name="text", datatype="BYTES", shape=[1], contents=opb.InferTensorContents(bytes_contents=[b"fine"]))]),
        metadata=[("traceparent", f"00-{trace}-00f067aa0ba902b7-00")], timeout=30)
    records = _access_records(served, ["trace-1", "trace-2", "trace-3", "trace-4"])
    for traced in ("trace-1", "trace-4"):
        a = records[traced]
        assert a["trace_id"] == trace, a
        assert all(a[k] >= 0 for k in TIMINGS), a
        assert a["forward_ms"] > 0 and a["forward_ms"] + a["postprocess_ms"] == pytest.approx(a["compute_ms"], abs=0.01)
    # One text, one batch: its phases follow one another inside the call's time.
    a = records["trace-4"]
    assert a["prepare_ms"] + a["queue_ms"] + a["compute_ms"] + a["serialize_ms"] <= a["ms"] + 0.01, a
    for untraced in ("trace-2", "trace-3"):  # an invalid header (upper case), and none
        assert "trace_id" not in records[untraced] and "forward_ms" not in records[untraced], records[untraced]


def test_a_traceparent_header_traces_http_calls_too(served):
    """The same trace context on the HTTP port: a traceparent header logs :classify and KServe v2's
    infer under its trace id with their timings; an invalid one (a zero trace id) is ignored."""
    trace = "0af7651916cd43dd8448eb211c80319c"
    post_json(served.http_address, "/v1/models/sentiment:classify", {"texts": ["fine"], "requestId": "http-trace-1"},
               {"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
    post_json(served.http_address, "/v2/models/ner/infer",
               {"id": "http-trace-2", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                                  "data": ["Ada Lovelace lived in London"]}]},
               {"traceparent": f"00-{trace}-b7ad6b7169203331-00"})
    post_json(served.http_address, "/v1/models/sentiment:classify", {"texts": ["fine"], "requestId": "http-trace-3"},
               {"traceparent": f"00-{'0' * 32}-b7ad6b7169203331-01"})
    records = _access_records(served, ["http-trace-1", "http-trace-2", "http-trace-3"])
    for traced, method in (("http-trace-1", "Classify"), ("http-trace-2", "ModelInfer")):
        a = records[traced]
        assert a["trace_id"] == trace and a["method"] == method, a
        assert all(a[k] >= 0 for k in TIMINGS) and a["forward_ms"] > 0, a
    assert "trace_id" not in records["http-trace-3"], records["http-trace-3"]


def test_trace_rate_one_traces_every_call_under_a_fresh_trace_id(api):
    pb, pb_grpc = api
    work = tempfile.mkdtemp(prefix="qvi_trace_py_")
    proc = ServerProcess(STORE, work, "--access-log", "--log-format", "json", "--trace-rate", "1")
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        for i in range(3):
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"],
                                             request_id=f"rate-{i}"), timeout=30)
        records = _access_records(proc, ["rate-0", "rate-1", "rate-2"])
        ids = {r["trace_id"] for r in records.values()}
        assert len(ids) == 3 and all(len(i) == 32 and int(i, 16) for i in ids), ids
        assert all(all(k in r for k in TIMINGS) for r in records.values()), records
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_modelinfer_is_logged_and_counted_like_classify(served, oip_api):
    """The Open Inference Protocol's ModelInfer has its access-log line and its metrics, under
    method "ModelInfer", with the version that answered; a refused one is logged with its code."""
    pb, pbg = oip_api
    stub = pbg.GRPCInferenceServiceStub(served.channel)
    texts = [b"fine", b"a dull film"]
    request = pb.ModelInferRequest(model_name="sentiment", id="oip-log-1", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[2],
                                              contents=pb.InferTensorContents(bytes_contents=texts))])
    stub.ModelInfer(request, timeout=30)
    request.id = "oip-log-2"
    request.outputs.add(name="spans")
    with pytest.raises(grpc.RpcError):
        stub.ModelInfer(request, timeout=30)
    # Both lines: a call's line is queued when it is recorded, which can come after its answer reached
    # the client, so the refused call's line may be written before the first one's (seen under ASan).
    wait_until(lambda: all(f'"oip-log-{i}"' in served.log() for i in (1, 2)), "the access lines", seconds=WAIT_S)
    records = [json.loads(line) for line in served.log().splitlines() if line.strip()]
    [ok] = [r for r in records if r.get("request_id") == "oip-log-1"]
    assert (ok["logger"], ok["method"], ok["model"], ok["version"], ok["texts"], ok["code"]) == \
        ("access", "ModelInfer", "sentiment", 1, 2, "OK")
    assert ok["tokens"] >= 4 and ok["compute_ms"] > 0
    [refused] = [r for r in records if r.get("request_id") == "oip-log-2"]
    assert (refused["method"], refused["code"]) == ("ModelInfer", "INVALID_ARGUMENT")
    metrics = served.metrics()
    assert metrics['qvi_requests_total{code="OK",method="ModelInfer",model="sentiment",version="1"}'] >= 1
    assert metrics['qvi_requests_total{code="INVALID_ARGUMENT",method="ModelInfer",model="sentiment",version="0"}'] >= 1


def test_the_server_runs_on_the_allocator_it_links_and_reports_it(served):
    """qvi-server links jemalloc (CMake QVI_JEMALLOC; sanitizer builds run on the sanitizer's
    allocator instead): its metrics name the allocator the process really runs on, its start-up log
    says it, and jemalloc's background thread, which returns aged dirty pages (the server's
    malloc_conf), is running."""
    binary = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", served.proc.args[0]], capture_output=True,
                            text=True, check=True).stdout
    if "libjemalloc" in binary:
        expected = "jemalloc"
    elif "libasan" in binary or "__sanitizer_get_current_allocated_bytes" in binary:
        expected = "sanitizer"
    else:
        expected = "glibc"
    samples = served.metrics()
    in_use = samples.get(f'qvi_malloc_bytes{{allocator="{expected}",state="in_use"}}', 0)
    assert in_use > 10 * 2**20, {k: v for k, v in samples.items() if k.startswith("qvi_malloc")}
    assert f'qvi_malloc_bytes{{allocator="{expected}",state="free"}}' in samples
    assert f"memory allocator: {expected}" in served.log()
    if expected == "jemalloc":
        tasks = f"/proc/{served.proc.pid}/task"
        names = [open(os.path.join(tasks, t, "comm")).read().strip() for t in os.listdir(tasks)]
        assert any(n.startswith("jemalloc_bg_thd") for n in names), names
