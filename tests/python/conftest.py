"""Fixtures for the end-to-end tests: Python stubs generated from proto/, a running qvi-server, and
the virtual environment of the Open Inference Protocol clients."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "model_store"))
SERVER = os.environ.get("QVI_SERVER", os.path.join(REPO, "build", "qvi-server"))
STORE = os.path.join(REPO, "model_store", "store")


def doc_commands(doc, heading, program):
    """The commands of the first ```sh block after `heading` in `doc` (a path under the repo): a line
    starting with `program` starts one, the lines after it (a quoted JSON body or a backslash
    continuation) belong to it; comment lines are left out."""
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    commands = []
    for line in block.splitlines():
        if line.startswith(program + " "):
            commands.append(line)
        elif line.strip() and not line.startswith("#"):
            commands[-1] += "\n" + line
    return commands


def wait_until(predicate, what, seconds=60):
    """Polls predicate until it holds; fails naming what was awaited after `seconds`."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="session")
def api():
    """The qvi.serving.v1 Python modules, generated into a temporary folder from proto/."""
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="qvi_py_stubs_")
    proto = os.path.join(REPO, "proto")
    rc = protoc.main(["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto, "qvi", "serving", "v1", "inference.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    # The model zoo is also a package named qvi (imported by these tests to compare answers); let
    # it hold the generated qvi/serving/v1 too.
    import qvi
    qvi.__path__.append(os.path.join(out, "qvi"))
    from qvi.serving.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402
    yield inference_pb2, inference_pb2_grpc
    shutil.rmtree(out, ignore_errors=True)


INTEROP = os.path.join(REPO, "tests", "python", "interop")


@pytest.fixture(scope="session")
def interop_python():
    """The Python of a virtual environment holding tritonclient and KServe's client, installed from
    tests/python/interop/requirements.lock into build/interop-venv; made again when the lock changes."""
    venv = os.path.join(REPO, "build", "interop-venv")
    lock = os.path.join(INTEROP, "requirements.lock")
    with open(lock, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(venv, "lock.sha256")
    python = os.path.join(venv, "bin", "python")
    if not (os.path.exists(stamp) and open(stamp).read() == digest):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", lock],
                       check=True, timeout=900)
        with open(stamp, "w") as f:
            f.write(digest)
    return python


def oip_calls(python, address, calls):
    """Runs `calls` (see interop/oip_calls.py) with the real OIP clients, a process per client (they
    cannot share one); one result per call, in order."""
    results = [None] * len(calls)
    for client in sorted({c["client"] for c in calls}):
        mine = [i for i, c in enumerate(calls) if c["client"] == client]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"target": address, "calls": [calls[i] for i in mine]}, f)
        try:
            out = subprocess.run([python, os.path.join(INTEROP, "oip_calls.py"), f.name], capture_output=True,
                                 text=True, timeout=300)
        finally:
            os.unlink(f.name)
        assert out.returncode == 0, out.stderr
        answers = json.loads(out.stdout)
        assert len(answers) == len(mine)
        for i, answer in zip(mine, answers):
            results[i] = answer
    return results


@pytest.fixture(scope="session")
def oip_api():
    """The Open Inference Protocol's Python modules (inference.GRPCInferenceService), generated from
    the vendored proto/inference/open_inference_grpc.proto into a temporary folder."""
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="qvi_oip_stubs_")
    proto = os.path.join(REPO, "proto")
    rc = protoc.main(["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto, "inference", "open_inference_grpc.proto")])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    from inference import open_inference_grpc_pb2, open_inference_grpc_pb2_grpc  # noqa: E402
    yield open_inference_grpc_pb2, open_inference_grpc_pb2_grpc
    shutil.rmtree(out, ignore_errors=True)


def _export_inconsistent_model(store):
    """A model whose manifest lists three labels while its logits have two columns: its warm-up
    checks every output against the manifest, so it is FAILED with that reason and never serves."""
    import torch
    from qvi import artifact
    from qvi.models import ModelConfig, build_model
    from qvi.tokenizer import TokenizerConfig, Vocabulary
    torch.manual_seed(0)
    cfg = ModelConfig("cnn_att", 4, 2, g="qvi", emb_dim=8, hidden=8)
    vocab = Vocabulary(["[PAD]", "[UNK]", "a", "b"])
    manifest = artifact.build_manifest("inconsistent", cfg, TokenizerConfig(), vocab, ["x", "y"], "", {})
    manifest["labels"] = ["x", "y", "z"]
    artifact.export(build_model(cfg), manifest, vocab, store, 1)


class Background:
    """`n` threads running `self.run(i)` until the `with` block ends; run() checks `self.stop`."""

    def __init__(self, n):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(n)]

    def run(self, i):
        raise NotImplementedError

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


class Traffic(Background):
    """`classifiers` clients sending Classify (sentiment, version 0) and one sending Tag (ner) in a
    loop until the block ends; records every outcome: the versions that answered each classifying
    client, in order, the tags answered, and every error."""

    def __init__(self, api, channel, classifiers=3):
        self.pb, pb_grpc = api
        self.stub = pb_grpc.InferenceStub(channel)
        self.lock = threading.Lock()
        self.classifiers = classifiers
        self.versions = {c: [] for c in range(classifiers)}  # sentiment versions answered, per client, in order
        self.tagged = 0
        self.errors = []
        super().__init__(classifiers + 1)

    def run(self, c):
        pb = self.pb
        i = 0
        while not self.stop.is_set():
            i += 1
            try:
                if c == self.classifiers:
                    self.stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=[f"Paris {i}"]), timeout=30)
                    with self.lock:
                        self.tagged += 1
                    continue
                r = self.stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"),
                                                          texts=[f"a good film {i}", "dull"]), timeout=30)
                assert len(r.results) == 2
                with self.lock:
                    self.versions[c].append(r.model.version)
            except grpc.RpcError as e:
                with self.lock:
                    self.errors.append((c, e.code(), e.details()))

    def served(self):
        with self.lock:
            return [v for vs in self.versions.values() for v in vs]

    def wait_for_answers_from(self, version, more=20, seconds=60):
        """Until `more` answers came from `version` (bounded by `seconds`)."""
        deadline = time.monotonic() + seconds
        while self.served().count(version) < more:
            assert time.monotonic() < deadline, f"no answers from version {version}; errors {self.errors[:3]}"
            time.sleep(0.01)

    def check(self):
        assert self.errors == [], f"{len(self.errors)} failed requests, e.g. {self.errors[:3]}"
        for c, vs in self.versions.items():
            assert vs, f"client {c} got no answers"
        assert self.tagged > 0, "the other model's client got no answers"


class ServerProcess:
    """qvi-server on a free port over `store`, started and stopped (SIGTERM, exit code 0)."""

    def __init__(self, store, work, *extra_args, plaintext_ready=True, log_pipe=False, cpus=None, port=0):
        """log_pipe: the server's stdout and stderr go to a pipe (self.proc.stdout) that the test reads
        itself, or leaves unread to see what a blocked stderr does; log() is then not available.
        cpus: the set of CPUs the server may run on (its affinity mask), as taskset would give it.
        port: the gRPC port; 0 picks a free one."""
        assert os.path.exists(SERVER), f"{SERVER} is missing: scripts/test.sh builds it"
        self.work = work
        port_file = os.path.join(work, "port")
        metrics_port_file = os.path.join(work, "metrics_port")
        http_port_file = os.path.join(work, "http_port")
        self.log_path = os.path.join(work, "server.log")
        self._log = open(self.log_path, "w")
        # taskset, not preexec_fn: a preexec_fn makes Python fork() rather than vfork(), which runs
        # grpcio's fork handlers in the child; they restart gRPC's poller thread there, the child's
        # close_fds closes its epoll fd, and the child aborts ("Epoll1Poller ... epoll_wait error: Bad
        # file descriptor") before it execs the server -- grpc/grpc#43055, seen once in CI.
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        self.proc = subprocess.Popen([*pin, SERVER, "--model-store", store, "--port", str(port), "--host", "127.0.0.1",
                                      "--port-file", port_file, "--device", "cpu", "--metrics-port", "0",
                                      "--metrics-port-file", metrics_port_file, "--http-port", "0", "--http-port-file",
                                      http_port_file, *extra_args],
                                     stdout=subprocess.PIPE if log_pipe else self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not os.path.exists(port_file):
            assert self.proc.poll() is None, f"qvi-server exited: {self.log()}"
            assert time.monotonic() < deadline, "qvi-server did not start in 120 s"
            time.sleep(0.05)  # waiting on a process, not on a clock
        with open(port_file) as f:
            self.address = f"127.0.0.1:{int(f.read())}"
        with open(metrics_port_file) as f:
            self.metrics_address = f"127.0.0.1:{int(f.read())}"
        # The HTTP port's file is written before the gRPC port's; none when a test turns HTTP off.
        self.http_address = None
        if os.path.exists(http_port_file):
            with open(http_port_file) as f:
                self.http_address = f"127.0.0.1:{int(f.read())}"
        self.channel = None
        if plaintext_ready:  # a TLS server's test makes its own channels
            self.channel = grpc.insecure_channel(self.address)
            grpc.channel_ready_future(self.channel).result(timeout=30)

    def log(self):
        with open(self.log_path, encoding="utf-8") as f:
            return f.read()

    def metrics(self):
        """The server's Prometheus samples now: {'name{labels}': value}, as /metrics writes them."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            body = r.read().decode()
        return {series: float(value) for series, value in
                (line.rsplit(" ", 1) for line in body.splitlines() if line and not line.startswith("#"))}

    def stop(self):
        if self.channel is not None:
            self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.log()
        self._log.close()


@pytest.fixture(scope="session")
def server(server_process):
    """A channel to the session's qvi-server (server_process)."""
    return server_process.channel


@pytest.fixture(scope="session")
def server_process():
    """qvi-server on a free port over a copy of the demo store plus a corrupt version."""
    work = tempfile.mkdtemp(prefix="qvi_e2e_py_")
    store = os.path.join(work, "store")
    shutil.copytree(STORE, store)
    _export_inconsistent_model(store)
    shutil.copytree(os.path.join(STORE, "ner"), os.path.join(store, "misconfigured"))
    with open(os.path.join(store, "misconfigured", "serving.json"), "w") as f:
        f.write('{"max_batch_szie": 8}')
    os.makedirs(os.path.join(store, "ner", "3"))
    with open(os.path.join(store, "ner", "3", "model.pt"), "wb") as f:
        f.write(b"\x00not a model")
    proc = ServerProcess(store, work)
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)
