"""The container image (docker/build.sh cpu, built by scripts/test.sh before this runs) under podman:
- `podman run IMAGE` serves the demo models at once: health SERVING, Classify and Tag through the
  published port equal the host binary's answers, /metrics is scraped, the image's HEALTHCHECK passes;
- qvi-server is PID 1 and not root; there is no compiler, build tree or CUDA library in the image;
- `podman stop` (SIGTERM) drains it: exit code 0 well within the grace period;
- /models is replaced by a volume, and arguments after the image name reach qvi-server;
- the rendered Kubernetes Deployment (deploy/k8s/overlays/cpu) runs under `podman kube play`: the pod
  starts with its security context, its probes pass, and a Classify through its port answers.
Podman runs no gRPC probes itself: the test runs each of the Deployment's probes as the kubelet does
(grpc.health.v1 Check of the probe's service on its port, within failureThreshold x periodSeconds)."""
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from qvi_testing import REPO, STORE, ServerProcess, free_port, wait_until

IMAGE = os.environ.get("QVI_IMAGE", "localhost/qvi-serve:cpu")
PODMAN = ["podman"] + os.environ.get("QVI_PODMAN_FLAGS", "--runtime=runc --cgroup-manager=cgroupfs").split()
# The machine's limits for containers: an explicit file limit and a lowered process limit.
ULIMITS = ["--ulimit", "nofile=16384:16384", "--ulimit", "nproc=4096:4096"]
START_S = 120
TEXTS = ["A smart, funny and moving film.", "What a waste of two hours.", "Ça reste un très beau film 🎬"]
TAG_TEXTS = ["Justin Bieber flew to New York to meet Taylor Swift at Google", "paris in the spring"]

# podman kube play takes no --ulimit: the same limits as containers.conf defaults, for every call.
CONTAINERS_CONF = os.path.join(tempfile.mkdtemp(prefix="qvi_podman_conf_"), "containers.conf")
with open(CONTAINERS_CONF, "w") as _f:
    _f.write('[containers]\ndefault_ulimits = ["nofile=16384:16384", "nproc=4096:4096"]\n')


def podman(*args, timeout=120, check=True):
    return subprocess.run(PODMAN + list(args), capture_output=True, text=True, timeout=timeout, check=check,
                          env={**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF})


def wait_serving(address, service="", deadline_s=START_S, container=None):
    """Polls grpc.health.v1 until `service` reads SERVING; returns the seconds it took."""
    start = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        def serving():
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
                return status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                return False

        def failure():
            logs = podman("logs", container, check=False).stderr if container else ""
            return f"{address} SERVING within {deadline_s} s\n{logs}"
        wait_until(serving, failure, seconds=deadline_s, interval=0.2)
        return time.monotonic() - start


def classify_and_tag(api, address):
    pb, pb_grpc = api
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        options = pb.OutputOptions(top_k=2, attention=True, gates=True)
        c = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS, options=options),
                          timeout=30)
        t = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=TAG_TEXTS,
                                   options=pb.OutputOptions(attention=True)), timeout=30)
        return c, t


def assert_same_answers(got, want):
    (gc, gt), (wc, wt) = got, want
    assert gc.model.version == wc.model.version and gt.model.version == wt.model.version
    for g, w in zip(gc.results, wc.results, strict=True):
        assert [l.label for l in g.labels] == [l.label for l in w.labels]
        assert [l.score for l in g.labels] == pytest.approx([l.score for l in w.labels], abs=1e-5)
        assert [(k.text, k.start, k.end) for k in g.tokens] == [(k.text, k.start, k.end) for k in w.tokens]
        assert [k.attention for k in g.tokens] == pytest.approx([k.attention for k in w.tokens], abs=1e-5)
        assert [k.gate for k in g.tokens] == pytest.approx([k.gate for k in w.tokens], abs=1e-5)
    for g, w in zip(gt.results, wt.results, strict=True):
        assert [(s.label, s.start, s.end, s.text) for s in g.spans] == \
            [(s.label, s.start, s.end, s.text) for s in w.spans]
        assert [k.tag for k in g.tokens] == [k.tag for k in w.tokens]
        assert [s.score for s in g.spans] == pytest.approx([s.score for s in w.spans], abs=1e-5)


def metrics(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {series: float(value) for series, value in
            (line.rsplit(" ", 1) for line in body.splitlines() if line and not line.startswith("#"))}


class Container:
    """`podman run -d IMAGE ARGS` with its gRPC and metrics ports published on loopback."""

    def __init__(self, *args, volumes=()):
        assert shutil.which("podman"), "podman is missing: scripts/setup.sh installs it"
        assert podman("image", "exists", IMAGE, check=False).returncode == 0, \
            f"{IMAGE} is missing: docker/build.sh cpu builds it (scripts/test.sh does)"
        self.name = f"qvi-test-{uuid.uuid4().hex[:8]}"
        mounts = [a for v in volumes for a in ("-v", v)]
        podman("run", "-d", "--name", self.name, *ULIMITS, "-p", "127.0.0.1::8500", "-p", "127.0.0.1::8502",
               *mounts, IMAGE, *args)
        self.address = podman("port", self.name, "8500").stdout.strip().splitlines()[0]
        self.metrics_address = podman("port", self.name, "8502").stdout.strip().splitlines()[0]

    def logs(self):
        out = podman("logs", self.name, check=False)
        return out.stdout + out.stderr

    def remove(self):
        podman("rm", "-f", "-t", "0", self.name, check=False)


@pytest.fixture(scope="module")
def host_answers(api):
    """The host binary's answers to the same calls, over the same demo models."""
    work = tempfile.mkdtemp(prefix="qvi_image_ref_")
    proc = ServerProcess(STORE, work)
    try:
        yield classify_and_tag(api, proc.address)
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def container():
    c = Container()
    yield c
    c.remove()


def test_image_serves_the_demo_models_like_the_host_binary(container, api, host_answers):
    wait_serving(container.address, container=container.name)
    for model in ("sentiment", "ner"):
        wait_serving(container.address, model)
    assert_same_answers(classify_and_tag(api, container.address), host_answers)
    # A call is counted when gRPC is done with it, a moment after the client has its answer.
    def counted_ok(method, model):
        return sum(v for s, v in metrics(container.metrics_address).items()
                   if s.startswith("qvi_requests_total{") and 'code="OK"' in s
                   and f'method="{method}"' in s and f'model="{model}"' in s)
    wait_until(lambda: counted_ok("Classify", "sentiment") >= 1, "an OK Classify of sentiment in /metrics")
    wait_until(lambda: counted_ok("Tag", "ner") >= 1, "an OK Tag of ner in /metrics")
    # The image's server runs on jemalloc, as the host build does (its library is in the image).
    in_use = metrics(container.metrics_address).get('qvi_malloc_bytes{allocator="jemalloc",state="in_use"}', 0)
    assert in_use > 10 * 2**20, "qvi-server in the image does not run on jemalloc"
    # The CPU image has no CUDA backend, and says so.
    assert "CUDA: off (this LibTorch is CPU-only" in container.logs()
    # It serves the demo models from their AOTInductor packages (the portable x86-64-v3 build),
    # whose libtorch.so the image provides.
    pb, pb_grpc = api
    with grpc.insecure_channel(container.address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for model in ("sentiment", "ner"):
            info = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=model)), timeout=10).model
            assert [(v.metadata.format, v.metadata.format_note) for v in info.versions] == [("pt2", "")], info


def test_image_healthcheck_runs_qvi_client_and_passes(container):
    wait_serving(container.address, container=container.name)
    check = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Healthcheck"]
    assert check["Test"][:2] == ["CMD", "/opt/qvi/bin/qvi-client"], check
    result = podman("healthcheck", "run", container.name, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_qvi_server_is_pid_1_and_not_root(container):
    wait_serving(container.address, container=container.name)
    rows = [line.split() for line in podman("top", container.name, "pid", "user", "args").stdout.splitlines()[1:]]
    server = [r for r in rows if len(r) > 2 and r[2].endswith("qvi-server")]
    assert server and server[0][0] == "1", rows
    assert server[0][1] not in ("root", "0"), rows
    assert podman("exec", container.name, "id", "-u").stdout.strip() == "10001"


def test_image_has_labels_and_no_build_tools(container):
    labels = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Config"]["Labels"]
    for key in ("org.opencontainers.image.version", "org.opencontainers.image.revision",
                "org.opencontainers.image.source"):
        assert labels.get(key) not in (None, "", "unknown"), (key, labels)
    listing = podman("run", "--rm", *ULIMITS, "--entrypoint", "sh", IMAGE, "-c",
                     "ls /usr/bin /usr/local/bin; ls -d /src /build /opt/qvi/site/nvidia/cu13/lib/* "
                     "/opt/qvi/site/torch/lib/* 2>&1", check=False).stdout.split()
    for tool in ("gcc", "g++", "cc", "c++", "cmake", "ninja", "pip", "pip3", "python3"):
        assert tool not in listing, f"{tool} is in the runtime image"
    assert "/src" not in listing and "/build" not in listing
    libraries = {os.path.basename(p) for p in listing if p.startswith("/opt/qvi/site/")}
    # libtorch.so is the image's own (docker/collect.sh): it names libtorch_cpu.so alone, for the
    # AOTInductor packages that link it; the wheel's would need libtorch_cuda.so.
    assert libraries == {"libtorch_cpu.so", "libc10.so", "libgomp.so.1", "libcudart.so.13", "libcupti.so.13",
                         "libtorch.so"}
    needed = podman("run", "--rm", *ULIMITS, "--entrypoint", "sh", IMAGE, "-c",
                    "ldd /opt/qvi/site/torch/lib/libtorch.so", check=False).stdout
    assert "libtorch_cpu.so" in needed and "libtorch_cuda" not in needed, needed


def test_models_volume_and_extra_arguments(api, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(os.path.join(STORE, "sentiment"), store / "sentiment")
    os.chmod(tmp_path, 0o755)
    c = Container("--log-format", "json", "--access-log", volumes=[f"{store}:/models:ro"])
    try:
        wait_serving(c.address, "sentiment", container=c.name)
        pb, pb_grpc = api
        with grpc.insecure_channel(c.address) as channel:
            stub = pb_grpc.InferenceStub(channel)
            assert [m.name for m in stub.ListModels(pb.ListModelsRequest(), timeout=10).models] == ["sentiment"]
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"]), timeout=10)
        lines = [json.loads(line) for line in c.logs().splitlines() if line.strip()]
        assert any(line.get("logger") == "access" and line.get("model") == "sentiment" for line in lines), lines
    finally:
        c.remove()


def test_podman_stop_drains_and_exits_0_within_the_grace_period(api):
    c = Container("--shutdown-grace-seconds", "20")
    try:
        wait_serving(c.address, "sentiment", container=c.name)
        classify_and_tag(api, c.address)
        start = time.monotonic()
        podman("stop", "-t", "30", c.name, timeout=60)
        elapsed = time.monotonic() - start
        state = json.loads(podman("inspect", c.name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, c.logs()
        assert elapsed < 20, f"stop took {elapsed:.1f} s"
        assert "received signal 15" in c.logs() and "stopped" in c.logs()
    finally:
        c.remove()


def kube_play_manifest(work, volume):
    """The rendered overlays/cpu Deployment and its ConfigMap, as podman kube play takes them: one
    replica, the local image, ports published on free loopback ports (hostPort: podman publishes
    only those), the model store claim pointed at a podman volume of this test."""
    out = subprocess.run([os.path.join(REPO, ".venv", "bin", "kubectl"), "kustomize",
                          os.path.join(REPO, "deploy", "k8s", "overlays", "cpu")],
                         check=True, capture_output=True, text=True, timeout=60).stdout
    objects = [o for o in yaml.safe_load_all(out) if o and o["kind"] in ("Deployment", "ConfigMap")]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["metadata"]["name"] = f"qvi-kube-{uuid.uuid4().hex[:6]}"
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == IMAGE, container["image"]
    container["imagePullPolicy"] = "Never"
    ports = {}
    for p in container["ports"]:
        p["hostPort"], p["hostIP"] = free_port(), "127.0.0.1"
        ports[p["name"]] = p["hostPort"]
    for v in pod["volumes"]:
        if "persistentVolumeClaim" in v:
            v["persistentVolumeClaim"]["claimName"] = volume
    path = os.path.join(work, "pod.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(objects, f)
    return path, deployment, ports


def test_rendered_deployment_runs_under_podman_kube_play(api, tmp_path):
    volume = f"qvi-store-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", volume)
    manifest = None
    try:
        # Publish the demo models into the store volume, as deploy/k8s/demo-models does on a cluster.
        podman("run", "--rm", *ULIMITS, "--user", "0", "-v", f"{volume}:/store", "--entrypoint", "cp", IMAGE,
               "-R", "/models/.", "/store/")
        manifest, deployment, ports = kube_play_manifest(str(tmp_path), volume)
        played = podman("kube", "play", manifest, timeout=180, check=False)
        assert played.returncode == 0, played.stdout + played.stderr
        name = deployment["metadata"]["name"]
        ctr = next(c["Names"][0] for c in json.loads(podman("ps", "-a", "--format", "json").stdout)
                   if c["Names"][0].startswith(f"{name}-pod") and not c.get("IsInfra"))
        info = json.loads(podman("inspect", ctr).stdout)[0]
        assert info["State"]["Running"], info["State"]
        assert info["Config"]["User"].split(":")[0] == "10001"
        assert info["HostConfig"]["ReadonlyRootfs"] is True
        assert info["HostConfig"]["CapDrop"] and "CAP_NET_RAW" in info["HostConfig"]["CapDrop"]
        # The probes, in the kubelet's order: startup, then readiness and liveness.
        spec = deployment["spec"]["template"]["spec"]["containers"][0]
        address = f"127.0.0.1:{ports['grpc']}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = spec[probe]
            assert p["grpc"]["port"] == spec["ports"][0]["containerPort"]
            wait_serving(address, p["grpc"].get("service", ""), container=ctr,
                         deadline_s=p["periodSeconds"] * p["failureThreshold"])
        pb, pb_grpc = api
        with grpc.insecure_channel(address) as channel:
            reply = pb_grpc.InferenceStub(channel).Classify(
                pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=TEXTS[:1]), timeout=30)
        assert reply.results[0].labels[0].label in ("positive", "negative")
        assert "qvi_requests_in_flight" in "".join(metrics(f"127.0.0.1:{ports['metrics']}"))
    finally:
        if manifest:
            podman("kube", "down", manifest, timeout=120, check=False)
        podman("volume", "rm", "-f", volume, check=False)
