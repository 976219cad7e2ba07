"""deploy/kserve/: the ClusterServingRuntime and the InferenceService example, checked offline:
- both validate against KServe's own CRD schemas (v0.20.0, vendored in deploy/kserve/crds and
  checked byte for byte against the upstream blobs), strictly: an unknown field fails, as
  `kubectl apply --validate=strict` would fail it, and a deliberate typo does fail;
- what they promise each other and deploy/k8s holds: the model format and protocol match, gRPC is
  on the port named h2c, the probes are deploy/k8s's, Prometheus is pointed at the metrics port;
- the real qvi-server started with the runtime's arguments (its /mnt/models a copy of the demo
  store) serves the Open Inference Protocol and passes the probes' health check."""
import copy
import gzip
import hashlib
import json
import os
import shutil
import tomllib

import jsonschema
import pytest
import yaml

from qvi_testing import REPO, STORE, ServerProcess
from test_deploy_manifests import K8S, render, server_container

KSERVE = os.path.join(REPO, "deploy", "kserve")
KSERVE_VERSION = "v0.20.0"
CRDS = {  # file -> the upstream git blob id at KSERVE_VERSION (deploy/kserve/crds/README.md)
    "serving.kserve.io_clusterservingruntimes.yaml.gz": "1ce0a2e5b3d7c05192f7c817eff4d614a80cb432",
    "serving.kserve.io_inferenceservices.yaml.gz": "1e37d05b7a741eb40b9eb01c378dc9dc80eab3d9",
}


def strict(schema):
    """An OpenAPI v3 schema of a CRD as a JSON schema that refuses unknown fields: the API server
    prunes them silently, and kubectl's strict validation refuses them."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(schema)
    return schema


@pytest.fixture(scope="module")
def crds():
    """(group, kind) -> {version: validator} of every version the CRDs serve."""
    out = {}
    for name, blob in CRDS.items():
        with gzip.open(os.path.join(KSERVE, "crds", name), "rb") as f:
            data = f.read()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, f"{name} is not KServe {KSERVE_VERSION}'s"
        crd = yaml.safe_load(data)
        spec = crd["spec"]
        out[(spec["group"], spec["names"]["kind"])] = {
            v["name"]: jsonschema.Draft7Validator(strict(v["schema"]["openAPIV3Schema"]))
            for v in spec["versions"] if v.get("served")}
    return out


def load(name):
    with open(os.path.join(KSERVE, name)) as f:
        return yaml.safe_load(f)


def validate(crds, obj):
    group, version = obj["apiVersion"].split("/")
    versions = crds[(group, obj["kind"])]
    assert version in versions, f"{obj['kind']} {version} is not served by KServe {KSERVE_VERSION}"
    body = {k: v for k, v in obj.items() if k != "metadata"}  # metadata is the API server's ObjectMeta
    assert obj["metadata"]["name"]
    versions[version].validate(body)


@pytest.fixture(scope="module")
def runtime():
    return load("cluster-serving-runtime.yaml")


@pytest.fixture(scope="module")
def isvc():
    return load("inference-service.yaml")


@pytest.fixture(scope="module")
def runtime_rest():
    return load("cluster-serving-runtime-rest.yaml")


@pytest.fixture(scope="module")
def isvc_rest():
    return load("inference-service-rest.yaml")


def test_both_validate_against_kserves_crd_schemas(crds, runtime, isvc, runtime_rest, isvc_rest):
    validate(crds, runtime)
    validate(crds, isvc)
    validate(crds, runtime_rest)
    validate(crds, isvc_rest)


def test_the_validation_catches_a_typo(crds, runtime, isvc):
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["model"]["protocolVersions"] = "grpc-v2"  # the runtime's spelling, in the wrong place
    with pytest.raises(jsonschema.ValidationError, match="protocolVersions"):
        validate(crds, bad)
    bad = copy.deepcopy(runtime)
    bad["spec"]["containers"][0]["ports"][0]["containerport"] = 8500
    with pytest.raises(jsonschema.ValidationError, match="containerport"):
        validate(crds, bad)
    bad = copy.deepcopy(runtime)
    bad["spec"]["supportedModelFormats"][0]["priority"] = 0
    with pytest.raises(jsonschema.ValidationError, match="minimum"):
        validate(crds, bad)


def test_the_inference_service_runs_on_the_runtime_over_grpc_v2(runtime, isvc):
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"] == ["grpc-v2"]
    [container] = runtime["spec"]["containers"]
    assert container["name"] == "kserve-container"
    [port] = container["ports"]
    assert port["name"] == "h2c"
    with open(os.path.join(REPO, "docker", "qvi-server.toml"), "rb") as f:
        image_config = tomllib.load(f)
    assert port["containerPort"] == image_config["port"]
    assert "--model-store=/mnt/models" in container["args"]  # where KServe's storage initializer puts the model
    annotations = runtime["spec"]["annotations"]
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    assert annotations["prometheus.kserve.io/port"] == str(image_config["metrics-port"])
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] > sleep + image_config["shutdown-grace-seconds"] + 2


def test_the_probes_are_deploy_k8s_probes(runtime):
    [container] = runtime["spec"]["containers"]
    k8s = server_container(render(os.path.join(K8S, "overlays", "cpu")))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe] == k8s[probe], probe
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_qvi_server_serves_with_the_runtimes_arguments(runtime, oip_api, tmp_path):
    """The runtime's arguments after the image's config file, /mnt/models replaced by a copy of the
    demo store: the server accepts them, answers the gRPC health check the probes make, and serves
    the Open Inference Protocol."""
    [container] = runtime["spec"]["containers"]
    store = os.path.join(str(tmp_path), "mnt-models")
    shutil.copytree(STORE, store)
    # ServerProcess gives --model-store itself (the store), and a port of its own.
    assert "--model-store=/mnt/models" in container["args"]
    args = [a for a in container["args"] if not a.startswith("--model-store=")]
    proc = ServerProcess(store, str(tmp_path), "--config", os.path.join(REPO, "docker", "qvi-server.toml"), *args)
    try:
        assert f"loading models from {store}" in proc.log()
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        probe = container["readinessProbe"]["grpc"]
        status = health_pb2_grpc.HealthStub(proc.channel).Check(health_pb2.HealthCheckRequest(service=probe["service"]),
                                                              timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        pb, pbg = oip_api
        stub = pbg.GRPCInferenceServiceStub(proc.channel)
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="sentiment"), timeout=10).ready
        texts = [b"A gorgeous, moving film."]
        request = pb.ModelInferRequest(model_name="sentiment", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="text", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=texts))])
        answer = stub.ModelInfer(request, timeout=30)
        assert [o.name for o in answer.outputs] == ["label", "probabilities"]
        assert answer.raw_output_contents[0][4:] == b"positive"
    finally:
        proc.stop()


def test_the_rest_inference_service_runs_on_the_rest_runtime_over_v2(runtime, runtime_rest, isvc_rest):
    """The REST runtime is the gRPC one but for its protocol, its one port (http1, the image's HTTP port)
    and HTTP probes on that port's health routes."""
    model = isvc_rest["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime_rest["metadata"]["name"] == "qvi-serve-rest"
    assert model["protocolVersion"] in runtime_rest["spec"]["protocolVersions"] == ["v2"]
    [container] = runtime_rest["spec"]["containers"]
    [port] = container["ports"]
    with open(os.path.join(REPO, "docker", "qvi-server.toml"), "rb") as f:
        image_config = tomllib.load(f)
    assert (port["name"], port["containerPort"]) == ("http1", image_config["http-port"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": port["containerPort"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": port["containerPort"]}
    [grpc_container] = runtime["spec"]["containers"]
    same = {k: v for k, v in container.items() if k not in ("ports", "startupProbe", "readinessProbe", "livenessProbe")}
    assert same == {k: v for k, v in grpc_container.items()
                    if k not in ("ports", "startupProbe", "readinessProbe", "livenessProbe")}
    assert runtime_rest["spec"]["supportedModelFormats"] == runtime["spec"]["supportedModelFormats"]


def test_qvi_server_answers_the_rest_runtimes_probes_and_v2_rest(runtime_rest, tmp_path):
    """The REST runtime's arguments after the image's config: its probes' paths answer on the HTTP port,
    and KServe v2 REST inference answers there."""
    import http.client
    [container] = runtime_rest["spec"]["containers"]
    store = os.path.join(str(tmp_path), "mnt-models")
    shutil.copytree(STORE, store)
    args = [a for a in container["args"] if not a.startswith("--model-store=")]
    proc = ServerProcess(store, str(tmp_path), "--config", os.path.join(REPO, "docker", "qvi-server.toml"), *args)
    try:
        host, port = proc.http_address.split(":")

        def get(method, path, body=None):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request(method, path, body=body)
                r = conn.getresponse()
                return r.status, json.loads(r.read())
            finally:
                conn.close()

        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert get("GET", container[probe]["httpGet"]["path"])[0] == 200, probe
        status, answer = get("POST", "/v2/models/sentiment/infer", json.dumps({"inputs": [
            {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["A gorgeous, moving film."]}]}))
        assert status == 200, answer
        assert [o["name"] for o in answer["outputs"]] == ["label", "probabilities"]
        assert answer["outputs"][0]["data"] == ["positive"]
    finally:
        proc.stop()
