"""What every Python test suite shares (tests/python, and the suites that import it): the paths, a free
port, waiting for a condition, HTTP calls that return status, JSON and headers, and qvi-server run as
a child process on free ports (ServerProcess). conftest.py turns these into pytest fixtures."""
import atexit
import functools
import http.client
import http.server
import re
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import time
import urllib.request

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "model_store"))
SERVER = os.environ.get("QVI_SERVER", os.path.join(REPO, "build", "qvi-server"))
DEMO_STORE = os.path.join(REPO, "model_store", "store")
# The suites are written against the three GloVe demo models. The demo store may also hold the pretrained
# ones (sentiment-minilm, ner-e5: scripts/run.sh trains them after the first answer), so STORE is a
# view of the store with these three alone: a folder of this process whose entries link to them. Read it,
# serve it, copy it (shutil.copytree copies what the links point to); never write into it.
GLOVE_DEMO_MODELS = ("ner", "sentiment", "topics")


def _glove_demo_view():
    view = tempfile.mkdtemp(prefix="qvi_demo_store_")
    atexit.register(shutil.rmtree, view, True)
    for name in GLOVE_DEMO_MODELS:
        if os.path.isdir(os.path.join(DEMO_STORE, name)):
            os.symlink(os.path.join(DEMO_STORE, name), os.path.join(view, name))
    return view


STORE = _glove_demo_view()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process that takes no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, what, seconds=60, interval=0.02):
    """Polls predicate until it holds; fails naming what was awaited after `seconds`. Returns the
    predicate's last (true) value. `what` is a string, or a function giving one (called only on
    failure, for messages that show the state at the end: logs, errors so far)."""
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(interval)


def http_call(address, method, path, body=None, headers=None, timeout=30, raw=False):
    """(status, parsed JSON or None, headers) of one request on a new connection; `body` is bytes, or
    anything else sent as JSON. raw: the body's bytes rather than its JSON."""
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        r = conn.getresponse()
        content = r.read()
        if raw:
            return r.status, content, dict(r.getheaders())
        return r.status, (json.loads(content) if content else None), dict(r.getheaders())
    finally:
        conn.close()


def get_json(address, path, timeout=30):
    """The JSON of a GET that must answer 200."""
    status, body, _ = http_call(address, "GET", path, timeout=timeout)
    assert status == 200, f"GET {path}: {status} {body}"
    return body


def post_json(address, path, body, headers=None, timeout=30):
    """The JSON of a POST of `body` as JSON that must answer 200."""
    status, answer, _ = http_call(address, "POST", path, body,
                                  {"Content-Type": "application/json", **(headers or {})}, timeout=timeout)
    assert status == 200, f"POST {path}: {status} {answer}"
    return answer


def drop_in_server(work):
    """qvi-server over copies of the three GloVe demo models in `work`, `sentiment` the default model of the routes
    that name none (TEI's, vLLM's): the drop-in tests' server, which the caller stops."""
    store = os.path.join(work, "store")
    for name in ("sentiment", "topics", "ner"):
        shutil.copytree(os.path.join(STORE, name), os.path.join(store, name))
    return ServerProcess(store, str(work), "--default-model", "sentiment")


@functools.cache
def tei_stubs():
    """(tei_pb2, tei_pb2_grpc): the modules protoc makes of the vendored proto/tei/v1/tei.proto (TEI's gRPC API),
    generated once per process into a temporary folder removed at exit."""
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="qvi_tei_stubs_")
    atexit.register(shutil.rmtree, out, True)
    proto = os.path.join(REPO, "proto")
    assert protoc.main(["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}",
                        os.path.join(proto, "tei", "v1", "tei.proto")]) == 0, "protoc failed on proto/tei/v1/tei.proto"
    sys.path.insert(0, out)
    from tei.v1 import tei_pb2, tei_pb2_grpc
    return tei_pb2, tei_pb2_grpc


def _openapi30_to_json_schema(node):
    """An OpenAPI 3.0 schema as JSON Schema: `nullable: true` becomes null allowed; examples and defaults (TEI
    writes some as strings) dropped."""
    if isinstance(node, list):
        return [_openapi30_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi30_to_json_schema(v) for k, v in node.items() if k not in ("nullable", "example", "default")}
    if node.get("nullable"):
        if "type" in out:
            out["type"] = [out["type"], "null"]
        else:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


@functools.cache
def _tei_openapi_components():
    with open(os.path.join(REPO, "proto", "tei", "openapi.json")) as f:
        return _openapi30_to_json_schema(json.load(f)["components"])


def tei_schema_errors(name, instance):
    """What of `instance` TEI's own OpenAPI document (proto/tei/openapi.json, vendored from TEI 1.9.3) refuses
    under its schema `name` (e.g. "PredictResponse"): a list of messages, empty when it validates."""
    import jsonschema
    schema = {"$ref": f"#/components/schemas/{name}", "components": _tei_openapi_components()}
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


@functools.cache
def api_stubs():
    """(inference_pb2, inference_pb2_grpc): the native API's modules, generated from proto/ once per process
    into a temporary folder (removed at exit), as the package `qvi_api` rather than under the proto's path
    qvi/serving/v1: the model zoo's package is also named qvi, and a process that imports both (a test
    comparing answers, bench/run.py) found one of them missing (`No module named 'qvi.demo'`). The
    descriptors keep the proto's file name and package, so the messages and the wire are the same ones."""
    from grpc_tools import protoc
    out = tempfile.mkdtemp(prefix="qvi_api_stubs_")
    atexit.register(shutil.rmtree, out, True)
    proto, name = os.path.join(REPO, "proto"), os.path.join("qvi", "serving", "v1", "inference.proto")
    assert protoc.main(["protoc", f"-I{proto}", f"--python_out={out}", f"--grpc_python_out={out}",
                        os.path.join(proto, name)]) == 0, f"protoc failed on proto/{name}"
    package = os.path.join(out, "qvi_api")
    os.makedirs(package)
    open(os.path.join(package, "__init__.py"), "w").close()
    generated = os.path.join(out, "qvi", "serving", "v1")
    shutil.copy(os.path.join(generated, "inference_pb2.py"), package)
    with open(os.path.join(generated, "inference_pb2_grpc.py")) as f:
        text = f.read()
    absolute = "from qvi.serving.v1 import inference_pb2"
    assert absolute in text, "the generated gRPC module's import of its messages was not found"
    with open(os.path.join(package, "inference_pb2_grpc.py"), "w") as f:
        f.write(text.replace(absolute, "from qvi_api import inference_pb2"))
    sys.path.insert(0, out)
    from qvi_api import inference_pb2, inference_pb2_grpc
    return inference_pb2, inference_pb2_grpc


def metrics_text(address, timeout=10):
    """The text of http://ADDRESS/metrics (`address` may be that whole URL)."""
    url = address if address.startswith("http") else f"http://{address}/metrics"
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def parse_metrics(text):
    """Prometheus' text format as /metrics writes it: {'name{labels}': value}, comments left out. The one
    reader of /metrics for tests, bench/ and scripts/."""
    return {series: float(value) for series, value in
            (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))}


def metrics_of(address, timeout=10):
    """The samples of http://ADDRESS/metrics (or of that URL) now (parse_metrics)."""
    return parse_metrics(metrics_text(address, timeout))


def metric_sum(samples, name, *parts):
    """The sum of `name`'s series (parse_metrics' keys) whose labels hold every one of `parts`
    ('code="OK"', say); 0 when there is none."""
    return sum(v for series, v in samples.items()
               if series.partition("{")[0] == name and all(p in series.partition("{")[2] for p in parts))


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
        wait_until(lambda: self.served().count(version) >= more,
                   lambda: f"answers from version {version}; errors {self.errors[:3]}", seconds=seconds, interval=0.01)

    def check(self):
        assert self.errors == [], f"{len(self.errors)} failed requests, e.g. {self.errors[:3]}"
        for c, vs in self.versions.items():
            assert vs, f"client {c} got no answers"
        assert self.tagged > 0, "the other model's client got no answers"


def masked(text, spans, types=("PER", "LOC", "ORG")):
    """`text` with its entities of `types` replaced by "[TYPE]", from a Tag answer's spans (code points): what
    --redact-texts-with should keep of it."""
    out, at = "", 0
    for s in sorted(spans, key=lambda s: s.start):
        if s.label in types and s.start >= at:
            out += text[at:s.start] + f"[{s.label}]"
            at = s.end
    return out + text[at:]


class OtlpReceiver:
    """An OTLP/HTTP receiver on a free port (self.endpoint): decodes every POST's body as `request_type` (an
    opentelemetry-proto message class: OpenTelemetry's own package, not the server's copies); `delay` seconds
    before answering (a slow collector)."""

    def __init__(self, request_type, delay=0.0):
        self.requests, self.paths, self.delay = [], [], delay
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(receiver.delay)
                request = request_type()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.requests.append(request)
                    receiver.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def received(self):
        with self.lock:
            return list(self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class ServerProcess:
    """qvi-server on a free port over `store`, started and stopped (SIGTERM, exit code 0). The tests' and the
    benchmarks' one way to run it; also a context manager that stops it."""

    def __init__(self, store, work, *extra_args, plaintext_ready=True, log_pipe=False, cpus=None, port=0,
                 server=None, device="cpu", http=True, name="server", startup_seconds=120):
        """log_pipe: the server's stdout and stderr go to a pipe (self.proc.stdout) that the test reads
        itself, or leaves unread to see what a blocked stderr does; log() is then not available.
        cpus: the set of CPUs the server may run on (its affinity mask), as taskset would give it.
        port: the gRPC port; 0 picks a free one. server: the binary (QVI_SERVER, else build/qvi-server).
        device: --device. http: False turns the HTTP port off. name: its files in `work` are name.log,
        name.port, ... (several servers may share a folder one after another)."""
        server = server or SERVER
        assert os.path.exists(server), f"{server} is missing: scripts/test.sh builds it"
        self.work = work
        files = {k: os.path.join(work, f"{name}.{k}") for k in ("port", "metrics_port", "http_port")}
        for path in files.values():  # one left by an earlier server would be read as this one's
            if os.path.exists(path):
                os.remove(path)
        port_file, metrics_port_file, http_port_file = files["port"], files["metrics_port"], files["http_port"]
        self.log_path = os.path.join(work, f"{name}.log")
        self._log = open(self.log_path, "w")
        # taskset, not preexec_fn: a preexec_fn makes Python fork() rather than vfork(), which runs
        # grpcio's fork handlers in the child; they restart gRPC's poller thread there, the child's
        # close_fds closes its epoll fd, and the child aborts ("Epoll1Poller ... epoll_wait error: Bad
        # file descriptor") before it execs the server -- grpc/grpc#43055, seen once in CI.
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        http_args = ["--http-port", "0", "--http-port-file", http_port_file] if http else ["--http-port", "-1"]
        self.proc = subprocess.Popen([*pin, server, "--model-store", store, "--port", str(port), "--host", "127.0.0.1",
                                      "--port-file", port_file, "--device", device, "--metrics-port", "0",
                                      "--metrics-port-file", metrics_port_file, *http_args, *extra_args],
                                     stdout=subprocess.PIPE if log_pipe else self._log, stderr=subprocess.STDOUT)

        def started():
            assert self.proc.poll() is None, f"qvi-server exited: {self.log() if not log_pipe else ''}"
            return os.path.exists(port_file)
        wait_until(started, f"qvi-server to write its port file ({startup_seconds} s)", seconds=startup_seconds,
                   interval=0.05)
        with open(port_file) as f:
            self.port = int(f.read())
        self.address = f"127.0.0.1:{self.port}"
        with open(metrics_port_file) as f:
            self.metrics_address = f"127.0.0.1:{int(f.read())}"
        self.metrics_url = f"http://{self.metrics_address}/metrics"
        # The HTTP port's file is written before the gRPC port's; none when HTTP is off.
        self.http_address = None
        if os.path.exists(http_port_file):
            with open(http_port_file) as f:
                self.http_address = f"127.0.0.1:{int(f.read())}"
        self.channel = None
        if plaintext_ready:  # a TLS server's test makes its own channels
            self.channel = grpc.insecure_channel(self.address)
            grpc.channel_ready_future(self.channel).result(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.stop()

    def log(self):
        with open(self.log_path, encoding="utf-8") as f:
            return f.read()

    def metrics(self):
        """The server's Prometheus samples now: {'name{labels}': value}, as /metrics writes them."""
        return metrics_of(self.metrics_address)

    def stop(self):
        if self.channel is not None:
            self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0, self.log()
        self._log.close()


def null_twin(store, name, **extra):
    """A null twin of the demo classifier (no math) named `name` in `store`."""
    out = os.path.join(store, name, "1")
    done = subprocess.run([sys.executable, "-m", "qvi", "null", "--artifact", os.path.join(STORE, "sentiment", "1",
                           "model.pt"), "--out", out], cwd=os.path.join(REPO, "model_store"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(out, "model.null")) as f:
        twin = json.load(f)
    with open(os.path.join(out, "model.null"), "w") as f:
        json.dump(dict(twin, manifest=dict(twin["manifest"], name=name), **extra), f)
