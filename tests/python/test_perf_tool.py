"""qvi-perf against the real server: closed and open loop steps report answers, latency
percentiles in order, the server's queue/compute split from its metrics, and errors by status code.
Checks what it reports, never how fast anything is."""
import json
import os
import subprocess

from qvi_testing import REPO

PERF = os.path.join(REPO, "build", "qvi-perf")


def run(server_process, tmp_path, *args):
    out = tmp_path / "perf.json"
    proc = subprocess.run([PERF, "--server", server_process.address, "--duration", "0.5", "--warmup", "0.1",
                           "--json", str(out), *args], capture_output=True, text=True, timeout=120)
    return proc, json.loads(out.read_text())


def test_closed_and_open_loop_report_latency_and_the_server_split(server_process, tmp_path):
    proc, doc = run(server_process, tmp_path, "--model", "sentiment", "--concurrency", "1,4", "--rate", "40",
                    "--texts-per-request", "2", "--metrics", f"http://{server_process.metrics_address}/metrics")
    assert proc.returncode == 0, proc.stderr
    assert [(s["mode"], s["load"]) for s in doc["steps"]] == [("closed", 1), ("closed", 4), ("open", 40)]
    for s in doc["steps"]:
        assert s["ok"] > 0 and s["errors"] == {}
        assert s["texts_per_s"] == 2 * s["requests_per_s"]
        assert 0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] <= s["p999_ms"]
        assert s["server_queue_ms"] >= 0 and s["server_compute_ms"] > 0 and s["server_batch_size"] >= 1
    assert "p99.9 ms" in proc.stdout  # the human table


def test_errors_are_counted_by_code(server_process, tmp_path):
    proc, doc = run(server_process, tmp_path, "--model", "no-such-model", "--concurrency", "2")
    assert proc.returncode == 1  # nothing answered OK
    [step] = doc["steps"]
    assert step["ok"] == 0 and step["errors"].get("NOT_FOUND", 0) > 0


def test_threads_channels_and_cpu_per_request(server_process, tmp_path):
    """Several completion-queue threads over several connections answer every call; each step reports
    the CPU per request of qvi-perf itself and, from the server's process_cpu_seconds_total, of the
    server, and the server's voluntary context switches per request (its threads' hand-offs)."""
    proc, doc = run(server_process, tmp_path, "--model", "sentiment", "--concurrency", "8", "--threads", "3",
                    "--channels", "5", "--metrics", f"http://{server_process.metrics_address}/metrics")
    assert proc.returncode == 0, proc.stderr
    [step] = doc["steps"]
    assert step["ok"] > 0 and step["errors"] == {}
    assert step["client_cores"] > 0 and step["client_cpu_us_per_request"] > 0
    assert step["server_cores"] > 0 and step["server_cpu_us_per_request"] > 0
    # Every answered call passes from a gRPC thread to an instance thread at least at low load, but
    # batching shares the hand-offs: more than none, far fewer than a thousand per request.
    assert 0 < step["server_switches_per_request"] < 1000
    assert "srv µs/r" in proc.stdout and "srv sw/r" in proc.stdout


def test_the_open_inference_protocol_path_is_driven_and_counted_as_modelinfer(server_process, tmp_path):
    """--protocol oip sends the same texts as ModelInfer calls; the server counts them under
    method="ModelInfer", and a tagger is driven the same way (the model's task picks Tag)."""
    def counted(model):
        return sum(v for k, v in server_process.metrics().items()
                   if k.startswith("qvi_requests_total{") and 'method="ModelInfer"' in k and f'model="{model}"' in k
                   and 'code="OK"' in k)

    before = counted("sentiment"), counted("ner")
    proc, doc = run(server_process, tmp_path, "--protocol", "oip", "--model", "sentiment", "--concurrency", "4",
                    "--texts-per-request", "3", "--attention", "--gates")
    assert proc.returncode == 0, proc.stderr
    [step] = doc["steps"]
    assert doc["protocol"] == "oip" and step["ok"] > 0 and step["errors"] == {}
    assert counted("sentiment") >= before[0] + step["ok"]
    proc, doc = run(server_process, tmp_path, "--protocol", "oip", "--model", "ner", "--concurrency", "2")
    assert proc.returncode == 0, proc.stderr
    assert doc["steps"][0]["ok"] > 0 and doc["steps"][0]["errors"] == {}
    assert counted("ner") >= before[1] + doc["steps"][0]["ok"]
