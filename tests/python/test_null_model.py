"""The null backend (server/core/model/null_model.h), which bench/run.py --null measures the serving path
with: `python -m qvi null` writes a demo model's manifest and vocabulary into model.null, and the server
answers from it with no math -- every label equally likely, α uniform over a text's tokens, every gate
0.5, no entities -- through every API, with the real model's tokens, shapes and limits. A model.null that
is not one fails its version with the reason, and the server serves on."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from qvi_testing import REPO, STORE, ServerProcess, get_json, metric_sum, post_json, wait_until

MODEL_STORE = os.path.join(REPO, "model_store")


@pytest.fixture(scope="module")
def null_server(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("qvi_null"))
    store = os.path.join(work, "store")
    for name in ("sentiment", "ner"):
        out = subprocess.run([sys.executable, "-m", "qvi", "null", "--artifact",
                              os.path.join(STORE, name, "1", "model.pt"), "--out", os.path.join(store, name, "1")],
                             cwd=MODEL_STORE, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == os.path.join(store, name, "1", "model.null")
    os.makedirs(os.path.join(store, "broken", "1"))
    with open(os.path.join(store, "broken", "1", "model.null"), "w") as f:
        f.write('{"manifest": "not an object"}')
    # The classifier's twin on an emulated device, and one whose device time is out of range.
    with open(os.path.join(store, "sentiment", "1", "model.null")) as f:
        twin = json.load(f)
    for name, device in (("emulated", {"per_batch": 500, "per_text": 20}), ("bad_device", {"per_batch": -1}),
                         ("unpipelined", {"per_batch": 500, "per_text": 20, "asynchronous": False}),
                         ("bad_mode", {"asynchronous": "yes"}), ("bad_hold", {"hold_while_file": 3})):
        os.makedirs(os.path.join(store, name, "1"))
        with open(os.path.join(store, name, "1", "model.null"), "w") as f:
            json.dump(dict(twin, manifest=dict(twin["manifest"], name=name), device_us=device), f)
    proc = ServerProcess(store, work)
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_the_null_classifier_answers_with_the_real_models_tokens_and_no_math(null_server):
    address = null_server.http_address
    text = "A gorgeous, moving film."
    answer = post_json(address, "/v1/models/sentiment:classify", {"texts": [text], "options": {
        "topK": 2, "attention": True, "gates": True, "layers": {"gates": True, "attentionMaps": True}}})
    result = answer["results"][0]
    assert [round(label["score"], 6) for label in result["labels"]] == [0.5, 0.5]
    tokens = result["tokens"]
    assert [t["text"] for t in tokens] == ["A", "gorgeous", ",", "moving", "film", "."]
    assert all(t["attention"] == pytest.approx(1 / 6) and t["gate"] == 0.5 for t in tokens)
    layers = result["layers"]
    md = get_json(address, "/v1/models/sentiment")["model"]["versions"][0]["metadata"]
    assert md["format"] == "null" and len(layers) == md["layers"] * md["heads"]
    assert all(m["attention"] == pytest.approx([1 / 6] * 36) and m["gates"] == [0.5] * 6 for m in layers)


def test_the_null_tagger_finds_nothing_through_every_api(null_server):
    address = null_server.http_address
    answer = post_json(address, "/v1/models/ner:tag", {"texts": ["Barack Obama flew to Paris"]})
    result = answer["results"][0]
    assert result["spans"] == [] and [t["tag"] for t in result["tokens"]] == ["O"] * 5
    infer = post_json(address, "/v2/models/ner/infer", {"inputs": [
        {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["Ada Lovelace"]}]})
    outputs = {o["name"]: o for o in infer["outputs"]}
    assert outputs["spans"]["data"] == ["[]"] and outputs["tags"]["data"] == ["O", "O"]


def test_a_broken_null_model_fails_its_version_alone(null_server):
    models = {m["name"]: m["versions"][0] for m in get_json(null_server.http_address, "/v1/models")["models"]}
    assert models["broken"]["state"] == "MODEL_STATE_FAILED"
    assert 'a null model is a JSON object {"manifest": {...}, "vocab": [tokens]}' in models["broken"]["reason"]
    assert models["sentiment"]["state"] == models["ner"]["state"] == "MODEL_STATE_READY"


def test_an_emulated_device_holds_each_batch_and_reports_its_time(null_server):
    """model.null's device_us: each batch costs per_batch + per_text x its texts of device time, counted
    in qvi_device_busy_seconds_total; a model without it reports none."""
    address = null_server.http_address
    for texts in (["one"], ["one", "two", "three"], ["a"] * 7):
        assert len(post_json(address, "/v1/models/emulated:classify", {"texts": texts})["results"]) == len(texts)
    post_json(address, "/v1/models/sentiment:classify", {"texts": ["plain"]})
    m = null_server.metrics()
    v = 'model="emulated",version="1"'
    batches, texts = m[f"qvi_batch_size_count{{{v}}}"], m[f"qvi_batch_size_sum{{{v}}}"]
    assert texts == 11 and batches >= 3
    assert m[f"qvi_device_busy_seconds_total{{{v}}}"] == pytest.approx(500e-6 * batches + 20e-6 * texts, rel=1e-9)
    assert m['qvi_device_busy_seconds_total{model="sentiment",version="1"}'] == 0


def test_a_big_batch_is_answered_in_chunks_on_the_answer_threads(null_server):
    """The server's answer threads make a big batch's answers in chunks of at least 16 texts
    (ModelRunner): one request of 40 texts runs as batches of 32 and 8, and the 32 are answered in two
    shares, each observed in qvi_answer_duration_seconds; the request is answered once, whole."""
    address = null_server.http_address
    v = 'model="emulated",version="1"'
    before = null_server.metrics()
    texts = [f"text {i}" for i in range(40)]
    assert len(post_json(address, "/v1/models/emulated:classify", {"texts": texts})["results"]) == 40
    # A share is observed once its answers are made, so the last one may be counted just after the
    # request's answer went out: wait for the count, then check it is no more than that.
    after = {}

    def grew(name):
        return after.get(f"{name}{{{v}}}", 0) - before.get(f"{name}{{{v}}}", 0)

    def shares_counted():
        after.clear()
        after.update(null_server.metrics())
        return grew("qvi_answer_duration_seconds_count") >= 3

    wait_until(shares_counted, lambda: f"three shares of answers; counted {grew('qvi_answer_duration_seconds_count')}")
    assert grew("qvi_batch_size_count") == 2 and grew("qvi_batch_size_sum") == 40
    assert grew("qvi_answer_duration_seconds_count") == 3, "the batch of 32 in two shares, the batch of 8 in one"
    assert grew("qvi_answer_wait_seconds_count") == 3


def test_a_device_time_out_of_range_fails_its_version_naming_the_field(null_server):
    models = {m["name"]: m["versions"][0] for m in get_json(null_server.http_address, "/v1/models")["models"]}
    assert models["bad_device"]["state"] == "MODEL_STATE_FAILED"
    assert "device_us.per_batch must be a number of microseconds from 0 to 10000000" in models["bad_device"]["reason"]
    assert models["bad_mode"]["state"] == "MODEL_STATE_FAILED"
    assert "device_us.asynchronous must be true or false" in models["bad_mode"]["reason"]
    assert models["bad_hold"]["state"] == "MODEL_STATE_FAILED"
    assert "device_us.hold_while_file must be a file's path" in models["bad_hold"]["reason"]


def test_a_device_that_cannot_queue_work_answers_the_same_and_counts_the_same_time(null_server):
    """"asynchronous": false: the runner collects each batch before launching the next (no pipeline);
    the answers and the device time per batch are those of the pipelined twin."""
    address = null_server.http_address
    texts = ["one", "two three"]
    pipelined = post_json(address, "/v1/models/emulated:classify", {"texts": texts})["results"]
    unpipelined = post_json(address, "/v1/models/unpipelined:classify", {"texts": texts})["results"]
    assert unpipelined == pipelined
    m = null_server.metrics()
    v = 'model="unpipelined",version="1"'
    batches, sent = m[f"qvi_batch_size_count{{{v}}}"], m[f"qvi_batch_size_sum{{{v}}}"]
    assert sent == 2
    assert m[f"qvi_device_busy_seconds_total{{{v}}}"] == pytest.approx(500e-6 * batches + 20e-6 * sent, rel=1e-9)


def thread_policies(pid):
    """{thread name: set of scheduling policies} of a process (field 41 of /proc/PID/task/TID/stat)."""
    policies = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            stat = f.read()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        policy = int(stat[stat.rindex(")") + 2:].split()[38])  # fields 3.. after the name; 41 is policy
        policies.setdefault(name, set()).add(policy)
    return policies


SCHED_OTHER, SCHED_BATCH = 0, 3


def test_every_thread_but_the_http_ones_runs_under_sched_batch_unless_turned_off(null_server, tmp_path):
    # --sched-batch (on by default): gRPC's, the instances' and every other thread under SCHED_BATCH,
    # the HTTP threads back under the default (server/core/sched/cpu_policy.h says why).
    policies = thread_policies(null_server.proc.pid)
    assert policies.pop("qvi-http") == {SCHED_OTHER}
    assert {"qvi-instance", "qvi-request", "nexting_thread"} <= set(policies), policies
    assert set().union(*policies.values()) == {SCHED_BATCH}, policies
    off = ServerProcess(os.path.join(null_server.work, "store"), str(tmp_path), "--sched-batch=false")
    try:
        assert set().union(*thread_policies(off.proc.pid).values()) == {SCHED_OTHER}
    finally:
        off.stop()


def test_the_null_benchmark_reports_each_steps_median_round_with_every_round_beside_it():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import null_bench

    def run(*us):
        return {"label": "x", "steps": [{"load": load, "server_cpu_us_per_request": u, "requests_per_s": 1e6 / u,
                                         "p50_ms": 0.1, "p99_ms": 0.2}
                                        for load, u in zip((1, 64), us)]}

    merged = null_bench.median_round([run(100.0, 30.0), run(90.0, 50.0), run(120.0, 20.0)])
    assert [s["server_cpu_us_per_request"] for s in merged["steps"]] == [100.0, 30.0]
    assert [s["rounds_us"] for s in merged["steps"]] == [[100.0, 90.0, 120.0], [30.0, 50.0, 20.0]]
    # Each row is one round's step whole (its requests/s with its CPU), the lower middle of an even count,
    # and a round the server's CPU could not be read for is shown but not chosen.
    assert merged["steps"][1]["requests_per_s"] == 1e6 / 30.0
    even = null_bench.median_round([run(100.0, 30.0), run(90.0, 50.0)])
    assert [s["server_cpu_us_per_request"] for s in even["steps"]] == [90.0, 30.0]
    unread = run(80.0, 40.0)
    unread["steps"][0]["server_cpu_us_per_request"] = None
    partial = null_bench.median_round([unread, run(95.0, 45.0)])
    assert partial["steps"][0]["server_cpu_us_per_request"] == 95.0
    assert partial["steps"][0]["rounds_us"] == [None, 95.0]
    counted = run(100.0, 30.0)
    counted["steps"][1]["server_switches_per_request"] = 0.25
    table = null_bench.null_markdown(
        {"server_cores": [0], "client_cores": [1], "rounds": 2,
         "protocols": {"gRPC Classify": null_bench.median_round([counted, run(90.0, 50.0)])}}, "cmd")
    # The concurrency-64 row is the round that counted 0.25 context switches a request; the other round
    # (at 1, the median) counted none, shown as "–".
    assert "| gRPC Classify | 64 | 33,333 | 0.00 | 30.0 | 30.0, 50.0 | 33,333 | 0.25 | 0.100 | 0.200 |" in table
    assert "| gRPC Classify | 1 | 11,111 | 0.00 | 90.0 | 100.0, 90.0 | 11,111 | – |" in table


def test_the_emulated_device_benchmark_takes_every_figure_from_one_window():
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import emulated_device

    before = {"time": 100.0, "ok": 1000, "cpu": 5.0, "busy": 1.0, "batches": 10, "texts": 1000, "instance_cpu": 2.0,
              "answer_cpu": 1.0}
    after = {"time": 110.0, "ok": 201000, "cpu": 15.0, "busy": 4.0, "batches": 4010, "texts": 201000,
             "instance_cpu": 5.2, "answer_cpu": 3.0}
    w = emulated_device.window(before, after)
    assert w["texts_per_s"] == 20000 and w["device_busy"] == pytest.approx(0.3) and w["mean_batch"] == 50
    assert w["server_cpu_us_per_request"] == pytest.approx(50) and w["instance_cpu_us_per_batch"] == pytest.approx(800)
    assert w["instance_cpu_us_per_text"] == pytest.approx(16)
    assert w["answer_cpu_us_per_text"] == pytest.approx(10)
    sample = {'qvi_requests_total{code="OK",model="m",version="1"}': 3.0,  # as qvi_testing.parse_metrics reads them
              'qvi_requests_total{code="NOT_FOUND",model="m",version="1"}': 2.0,
              'qvi_requests_total{code="OK",model="other",version="1"}': 7.0}
    assert metric_sum(sample, "qvi_requests_total", 'model="m"', 'code="OK"') == 3.0
