"""qvi-bench-grpc-front (bench/bench_grpc_front.cc) and its driver bench/grpc_front_ab.py, which measure
gRPC's own cost per call on its callback API and on its completion-queue API (docs/performance.md):
every configuration answers real gRPC Classify calls with its fixed message, reports its process CPU
where qvi-perf reads it, and stops on SIGTERM; the driver measures every configuration and qvi-server."""
import os
import re
import signal
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from conftest import REPO, wait_until

PROGRAM = os.path.join(REPO, "build", "qvi-bench-grpc-front")


@pytest.mark.parametrize("args", [
    ["--api", "callback", "--handoff", "inline"],
    ["--api", "callback", "--handoff", "worker"],
    ["--api", "async", "--threads", "1", "--handoff", "worker"],
    ["--api", "async", "--threads", "2", "--handoff", "inline", "--channel-arg", "grpc.minimal_stack=1"],
], ids=lambda a: " ".join(a))
def test_each_configuration_answers_classify_with_its_fixed_message(tmp_path, api, args):
    pb, pb_grpc = api
    port_file, metrics_file = tmp_path / "port", tmp_path / "metrics"
    proc = subprocess.Popen([PROGRAM, *args, "--port-file", str(port_file), "--metrics-port-file", str(metrics_file)])
    try:
        wait_until(lambda: metrics_file.exists() and port_file.exists(), "the program's port files", seconds=30)
        with grpc.insecure_channel(f"127.0.0.1:{port_file.read_text().strip()}") as channel:
            stub = pb_grpc.InferenceStub(channel)
            request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a text"])
            with ThreadPoolExecutor(16) as pool:  # more calls at once than a batch, so the worker batches
                answers = list(pool.map(lambda _: stub.Classify(request, timeout=30), range(200)))
        assert all(a == answers[0] for a in answers)
        assert [(label.label, label.score) for label in answers[0].results[0].labels] == [
            ("negative", 0.5), ("positive", 0.5)]
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


@pytest.mark.parametrize("arg", ["grpc.minimal_stack", "grpc.minimal_stack=yes", "=1"])
def test_a_channel_argument_that_is_not_name_equals_integer_is_refused(tmp_path, arg):
    out = subprocess.run([PROGRAM, "--channel-arg", arg, "--port-file", str(tmp_path / "p"),
                          "--metrics-port-file", str(tmp_path / "m")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"--channel-arg takes NAME=INTEGER, not {arg}\n"
    assert not (tmp_path / "p").exists()


def test_the_driver_measures_every_configuration_and_qvi_server(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "grpc_front_ab.py"), "--rounds", "1",
                          "--duration", "0.3", "--warmup", "0.1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if re.search(r"\s(1|16|64)\s+[\d,]+\s", line)]
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import grpc_front_ab

    labels = [label for label, _ in grpc_front_ab.CONFIGS]
    assert sorted((r[:24].strip(), int(r[24:29])) for r in rows) == sorted(
        (label, c) for label in labels for c in (1, 16, 64)), out.stdout
    for row in rows:
        requests_per_s, _, _, us = row[29:].split()[:4]
        assert float(requests_per_s.replace(",", "")) > 0 and float(us) > 0, row
