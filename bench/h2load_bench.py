"""h2load (Debian's nghttp2-client), a load generator this project did not write, against qvi-server: gRPC
Classify as HTTP/2 POSTs of one framed request, HTTP/JSON :classify as HTTP/1.1 POSTs (`--h1`). h2load
counts a gRPC error as an HTTP 200, so every figure here is the server's own, read from its /metrics
over the measured window: OK answers (qvi_requests_total{code="OK"}) and its CPU
(process_cpu_seconds_total). Used by bench/run.py's null section and by bench/emulated_device.py.
"""
import os
import re
import shutil
import subprocess
import sys
import threading
import time

TEXT = ("The film opens slowly but the second half is moving, funny and sharp, with a cast that makes "
        "every scene count")
GRPC_PATH = "/qvi.serving.v1.Inference/Classify"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import api_stubs, metric_sum, metrics_of  # noqa: E402  (proto/'s modules, /metrics)


def executable(build):
    """h2load on PATH, or beside qvi-server (a GPU machine's bundle carries it in build/); None if neither."""
    path = shutil.which("h2load") or os.path.join(build, "h2load")
    return path if os.path.exists(path) else None


def grpc_body(work, model):
    """One Classify call as gRPC frames it on HTTP/2 (a 0 byte, a 4-byte big-endian length, the message),
    encoded by the native API's modules generated from proto/ (qvi_testing.api_stubs)."""
    pb, _ = api_stubs()
    message = pb.ClassifyRequest(model=pb.ModelSpec(name=model), texts=[TEXT]).SerializeToString()
    path = os.path.join(work, "classify.grpc")
    with open(path, "wb") as f:
        f.write(b"\0" + len(message).to_bytes(4, "big") + message)
    return path


def json_body(work):
    """One :classify call's JSON body."""
    path = os.path.join(work, "classify.json")
    with open(path, "w") as f:
        f.write('{"texts": ["' + TEXT + '"]}')
    return path


def command(exe, protocol, url, concurrency, duration, warmup, body):
    """h2load's command line: `concurrency` calls in flight, one client thread. gRPC: HTTP/2 streams, 64
    on each connection; HTTP/JSON: HTTP/1.1, one call at a time on each of `concurrency` connections."""
    timing = ["--warm-up-time", f"{round(warmup * 1000)}ms", "-D", f"{round(duration * 1000)}ms", "-d", body]
    if protocol == "grpc":
        connections = max(1, concurrency // 64)
        return [exe, "-t", "1", "-c", str(connections), "-m", str(max(1, concurrency // connections)), *timing,
                "-H", "content-type: application/grpc", "-H", "te: trailers", url]
    return [exe, "--h1", "-t", "1", "-c", str(concurrency), *timing, "-H", "content-type: application/json", url]


def requests_done(stdout):
    """The requests h2load's report says were done (its one reader); None when it says nothing."""
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done", stdout)
    return int(done[1]) if done else None


def run(cmd, metrics_url, model, warmup, duration, prefix=(), log=print):
    """Runs h2load, reading the server's counters over its measured window (after the warm-up, a little
    inside its end): {"ok_per_s", "server_cpu_us_per_request", "client_done"}."""
    samples = {}

    def sample():
        time.sleep(warmup + 0.2)
        samples["before"] = (time.monotonic(), metrics_of(metrics_url))
        time.sleep(max(duration - 0.4, 0.1))
        samples["after"] = (time.monotonic(), metrics_of(metrics_url))

    log(" ".join([*prefix, *cmd]))
    sampler = threading.Thread(target=sample)
    sampler.start()
    done = subprocess.run([*prefix, *cmd], capture_output=True, text=True)
    sampler.join()
    assert done.returncode == 0, f"h2load failed: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    (t0, before), (t1, after) = samples["before"], samples["after"]
    labels = f'model="{model}"'
    ok = metric_sum(after, "qvi_requests_total", labels, 'code="OK"') - metric_sum(before, "qvi_requests_total", labels,
                                                                           'code="OK"')
    assert ok > 0, "the server answered no call OK in the window (h2load counts gRPC errors as HTTP 200)"
    cpu = metric_sum(after, "process_cpu_seconds_total") - metric_sum(before, "process_cpu_seconds_total")
    return {"ok_per_s": ok / (t1 - t0), "server_cpu_us_per_request": cpu / ok * 1e6,
            "client_done": requests_done(done.stdout)}
