"""What the benchmarks share (bench/run.py and the studies beside it): the paths, the demo classifier they
measure, a log line, waiting for a server's port file, stopping a process, and one qvi-perf run. A module of
its own so that no benchmark imports another's program (bench/run.py is one)."""
import json
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(REPO, "build")
PY = sys.executable
MODEL = "sentiment"
MODEL_DIR = os.path.join(REPO, "model_store", "store", MODEL, "1")
MODEL_PT = os.path.join(MODEL_DIR, "model.pt")

# qvi-server as the tests run it (tests/python/qvi_testing.py): one launcher for tests, benchmarks and scripts.
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import ServerProcess  # noqa: E402,F401


def serve(store, work, name, *flags, device="cpu", cpus=None, http=True, build=BUILD):
    """qvi-server of `build` on `store` with `flags`, its files (name.log, name.port, ...) in `work`: a
    ServerProcess, which the caller stops (a `with` block)."""
    return ServerProcess(store, work, *flags, server=os.path.join(build, "qvi-server"), device=device, cpus=cpus,
                         http=http, name=name, plaintext_ready=False, startup_seconds=180)


def log(msg):
    print(f"[bench] {msg}", flush=True)


def wait_for_file(path, proc, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in {timeout} s")
        time.sleep(0.1)
    with open(path) as f:
        return int(f.read())


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def perf(work, label, args, common, prefix=()):
    out = os.path.join(work, f"{label}.json")
    cmd = [*prefix, os.path.join(BUILD, "qvi-perf"), *args, *common, "--json", out, "--label", label]
    log(" ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd))
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)
