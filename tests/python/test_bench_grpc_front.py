"""qvi-bench-grpc-front (bench/bench_grpc_front.cc) and its driver bench/grpc_front_ab.py, which measure
gRPC's own cost per call on its callback API and on its completion-queue API (docs/performance.md):
every configuration answers real gRPC Classify calls (or, --api http, real HTTP POSTs) with its fixed
message, reports its process CPU where qvi-perf reads it, and stops on SIGTERM; the driver measures every
configuration and qvi-server."""
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from qvi_testing import REPO, wait_until

PROGRAM = os.path.join(REPO, "build", "qvi-bench-grpc-front")


@contextlib.contextmanager
def front(tmp_path, *args):
    """The program running with `args`: yields its port once both port files are written; then checks
    that it reports its CPU where qvi-perf reads it and that SIGTERM stops it cleanly."""
    port_file, metrics_file = tmp_path / "port", tmp_path / "metrics"
    proc = subprocess.Popen([PROGRAM, *args, "--port-file", str(port_file), "--metrics-port-file", str(metrics_file)])
    try:
        wait_until(lambda: metrics_file.exists() and port_file.exists(), "the program's port files", seconds=30)
        yield int(port_file.read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_file.read_text().strip()}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        cpu = re.fullmatch(r"process_cpu_seconds_total ([0-9.]+)\n", metrics)
        assert cpu and float(cpu.group(1)) > 0, metrics
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args", [
    ["--api", "callback", "--handoff", "inline"],
    ["--api", "callback", "--handoff", "worker"],
    ["--api", "async", "--threads", "1", "--handoff", "worker"],
    ["--api", "async", "--threads", "2", "--handoff", "inline", "--channel-arg", "grpc.minimal_stack=1"],
], ids=lambda a: " ".join(a))
def test_each_configuration_answers_classify_with_its_fixed_message(tmp_path, api, args):
    pb, pb_grpc = api
    with front(tmp_path, *args) as port:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.InferenceStub(channel)
            request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a text"])
            with ThreadPoolExecutor(16) as pool:  # more calls at once than a batch, so the worker batches
                answers = list(pool.map(lambda _: stub.Classify(request, timeout=30), range(200)))
        assert all(a == answers[0] for a in answers)
        assert [(label.label, label.score) for label in answers[0].results[0].labels] == [
            ("negative", 0.5), ("positive", 0.5)]


@pytest.mark.parametrize("handoff", ["inline", "worker"])
def test_the_http_configuration_answers_every_post_with_qvi_servers_json_shape(tmp_path, handoff):
    """--api http: qvi-server's HTTP server answering every POST with the fixed JSON of a one-text
    :classify answer, over keep-alive connections, from the HTTP thread or a worker."""
    with front(tmp_path, "--api", "http", "--handoff", handoff) as port:
        def post(_):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                answers = []
                for _ in range(20):  # one keep-alive connection, one request after another
                    connection.request("POST", "/v1/models/sentiment:classify", body='{"texts": ["a text"]}',
                                       headers={"Content-Type": "application/json"})
                    response = connection.getresponse()
                    answers.append((response.status, response.getheader("Content-Type"), response.read()))
                return answers
            finally:
                connection.close()

        with ThreadPoolExecutor(8) as pool:
            answers = [a for batch in pool.map(post, range(8)) for a in batch]
        assert len(answers) == 160 and all(a == answers[0] for a in answers)
        status, content_type, body = answers[0]
        assert status == 200 and content_type == "application/json"
        answer = json.loads(body)
        assert answer["model"] == {"name": "sentiment", "version": "1"}
        assert [(x["label"], x["score"]) for x in answer["results"][0]["labels"]] == [("negative", 0.5)]


@pytest.mark.parametrize("arg", ["grpc.minimal_stack", "grpc.minimal_stack=yes", "=1"])
def test_a_channel_argument_that_is_not_name_equals_integer_is_refused(tmp_path, arg):
    out = subprocess.run([PROGRAM, "--channel-arg", arg, "--port-file", str(tmp_path / "p"),
                          "--metrics-port-file", str(tmp_path / "m")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"--channel-arg takes NAME=INTEGER, not {arg}\n"
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("which", ["api", "http"])
def test_the_driver_measures_every_configuration_and_qvi_server(tmp_path, which):
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "grpc_front_ab.py"), "--rounds", "1",
                          "--duration", "0.3", "--warmup", "0.1", "--set", which],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if re.search(r"\s(1|16|64)\s+[\d,]+\s", line)]
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import grpc_front_ab

    labels = [label for label, _ in (grpc_front_ab.CONFIGS if which == "api" else grpc_front_ab.HTTP_CONFIGS)]
    assert sorted((r[:24].strip(), int(r[24:29])) for r in rows) == sorted(
        (label, c) for label in labels for c in (1, 16, 64)), out.stdout
    for row in rows:
        requests_per_s, _, _, us = row[29:].split()[:4]
        assert float(requests_per_s.replace(",", "")) > 0 and float(us) > 0, row
