"""The Python client package (client/python), installed as a user installs it: `pip install
./client/python` into a fresh virtual environment (its stubs are generated from proto/ while the
wheel is built), then used against the running server. Its answers equal the generated stubs' (the
native API), errors raise QviError with the gRPC code and the server's message, UNAVAILABLE is
retried with backoff within the call's deadline, and the README's Python snippet runs as written."""
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import pytest

from qvi_testing import REPO, STORE, ServerProcess, free_port

PACKAGE = os.path.join(REPO, "client", "python")


@pytest.fixture(scope="module")
def client_python():
    """A new virtual environment with the package installed from the repository, and nothing else."""
    venv = tempfile.mkdtemp(prefix="qvi_client_venv_")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    python = os.path.join(venv, "bin", "python")
    out = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", PACKAGE],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    yield python
    subprocess.run(["rm", "-rf", venv], check=False)


def run(python, script, *args, timeout=120):
    """Runs `script` in the package's environment (not from the repository's folders); its stdout as JSON."""
    out = subprocess.run([python, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def test_the_package_installs_with_generated_stubs_and_types(client_python):
    info, _ = run(client_python, """
        import json, os, qvi_client
        from qvi_client._proto.qvi.serving.v1 import inference_pb2
        root = os.path.dirname(qvi_client.__file__)
        print(json.dumps({"version": qvi_client.__version__, "file": qvi_client.__file__,
                          "typed": os.path.exists(os.path.join(root, "py.typed")),
                          "stub": inference_pb2.DESCRIPTOR.name}))
    """)
    assert info["version"] == "0.1.0" and info["typed"]
    assert "site-packages" in info["file"]  # the installed copy, not the source tree
    assert info["stub"] == "qvi/serving/v1/inference.proto"


def catalogue_proto_fields():
    """The native API's Token and LayerMap fields that the output catalogue's rows fill (outputs.cc)."""
    with open(os.path.join(REPO, "server", "core", "outputs", "outputs.cc"), encoding="utf-8") as f:
        text = f.read()
    token = re.findall(r'&TokenOutput::\w+, nullptr, "(\w+)"', text)
    layer = re.findall(r'&LayerMapOutput::\w+, "(\w+)"', text)
    assert len(token) >= 6 and len(layer) >= 3, (token, layer)
    return token, layer


def test_the_client_carries_every_explanation_field_of_the_catalogue(client_python):
    """A row added to the catalogue with a Token or LayerMap field must reach the client's dataclasses:
    each field set on the wire message comes back, with its value, from the client's conversion."""
    token, layer = catalogue_proto_fields()
    got, _ = run(client_python, """
        import dataclasses, json, sys
        from qvi_client import client
        from qvi_client._proto.qvi.serving.v1 import inference_pb2
        token, layer = json.loads(sys.argv[1]), json.loads(sys.argv[2])
        t = inference_pb2.Token(text="x")
        for i, name in enumerate(token):
            setattr(t, name, 0.25 + i)
        m = inference_pb2.LayerMap(layer=1, head=2)
        for i, name in enumerate(layer):
            getattr(m, name).extend([0.5 + i])
        print(json.dumps({"token": dataclasses.asdict(client._token(t)),
                          "layer": dataclasses.asdict(client._layers([m])[0])}))
    """, json.dumps(token), json.dumps(layer))
    for i, name in enumerate(token):
        assert got["token"].get(name) == 0.25 + i, (name, got["token"])
    for i, name in enumerate(layer):
        assert got["layer"].get(name) == [0.5 + i], (name, got["layer"])


def address_of(server_process, protocol):
    return server_process.address if protocol == "grpc" else server_process.http_address


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_classify_and_tag_answer_as_the_native_api(client_python, server_process, api, server, protocol):
    texts = ["A gorgeous, moving film.", "What a waste of time."]
    got, _ = run(client_python, """
        import dataclasses, json, sys
        from qvi_client import Client
        with Client(sys.argv[1], protocol=sys.argv[2]) as c:
            a = c.classify("sentiment", sys.argv[3:], top_k=2, attention=True, gates=True, request_id="py-1")
            t = c.tag("ner", "Barack Obama went to Paris and Berlin .", attention=True)
            models = c.list_models()
        print(json.dumps({"model": a.model, "version": a.version, "request_id": a.request_id, "n": len(a),
                          "label": a[0].label, "score": a[0].score,
                          "results": [dataclasses.asdict(r) for r in a],
                          "tag": dataclasses.asdict(t[0]),
                          "models": [dataclasses.asdict(m) for m in models]}))
    """, address_of(server_process, protocol), protocol, *texts)
    pb, pbg = api
    stub = pbg.InferenceStub(server)
    want = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts, options=pb.OutputOptions(
        top_k=2, attention=True, gates=True)), timeout=30)
    assert (got["model"], got["version"], got["request_id"], got["n"]) == ("sentiment", 1, "py-1", 2)
    assert got["label"] == want.results[0].labels[0].label
    for g, w in zip(got["results"], want.results):
        assert [l["label"] for l in g["labels"]] == [l.label for l in w.labels]
        assert [l["score"] for l in g["labels"]] == pytest.approx([l.score for l in w.labels], abs=1e-5)
        assert [(t["text"], t["start"], t["end"]) for t in g["tokens"]] == [(t.text, t.start, t.end) for t in w.tokens]
        assert [t["attention"] for t in g["tokens"]] == pytest.approx([t.attention for t in w.tokens], abs=1e-5)
        assert [t["gate"] for t in g["tokens"]] == pytest.approx([t.gate for t in w.tokens], abs=1e-5)
        assert g["tokens"][0]["lambda_q"] is None  # not a context-aware model: unset stays None
    tag = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=["Barack Obama went to Paris and Berlin ."],
                                 options=pb.OutputOptions(attention=True)), timeout=30).results[0]
    assert [(s["label"], s["start"], s["end"], s["text"]) for s in got["tag"]["spans"]] == \
        [(s.label, s.start, s.end, s.text) for s in tag.spans]
    assert [t["tag"] for t in got["tag"]["tokens"]] == [t.tag for t in tag.tokens]
    states = {m["name"]: {v["version"]: v["state"] for v in m["versions"]} for m in got["models"]}
    assert states["sentiment"] == {1: "READY"} and states["ner"][3] == "FAILED"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_errors_raise_qvierror_with_the_code_and_the_servers_message(client_python, server_process, api, server,
                                                                     protocol):
    import grpc
    got, _ = run(client_python, """
        import json, sys
        from qvi_client import Client, QviError
        out = []
        with Client(sys.argv[1], protocol=sys.argv[2]) as c:
            for call in (lambda: c.classify("sentiment", ["a film", "   "]),
                         lambda: c.classify("nope", ["a film"]),
                         lambda: c.classify("sentiment", ["a film"], version=9),
                         lambda: c.classify("sentiment", ["a film"], gates=True, layers={"gates": True, "layers": [7]})):
                try:
                    call()
                    out.append(None)
                except QviError as e:
                    out.append([e.code.name, e.message, e.attempts, str(e)])
        print(json.dumps(out))
    """, address_of(server_process, protocol), protocol)
    pb, pbg = api
    stub = pbg.InferenceStub(server)
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a film", "   "]), timeout=10)
    assert got[0][:3] == ["INVALID_ARGUMENT", e.value.details(), 1]
    assert got[0][3] == f"INVALID_ARGUMENT: {e.value.details()}"
    assert got[1][0] == "NOT_FOUND" and "model 'nope' not found" in got[1][1]
    assert got[2][0] == "NOT_FOUND" and "has no version 9" in got[2][1]
    assert got[3][0] == "INVALID_ARGUMENT" and got[3][1].startswith("options.layers.layers[0]: 7 is out of range")


def test_unavailable_is_retried_with_backoff_until_the_server_answers(client_python, tmp_path):
    """A call started before the server listens is retried (UNAVAILABLE) and answered once it does;
    with the retries spent, the call raises UNAVAILABLE saying how many attempts it made."""
    port = free_port()
    got, log = run(client_python, """
        import json, sys
        from qvi_client import Client, QviError
        try:
            Client(sys.argv[1], retries=2, backoff=0.01).classify("sentiment", ["a film"])
        except QviError as e:
            print(json.dumps([e.code.name, e.attempts]))
    """, f"127.0.0.1:{port}")
    assert got == ["UNAVAILABLE", 3]

    script = textwrap.dedent("""
        import json, logging, sys
        from qvi_client import Client
        logging.basicConfig(level=logging.INFO)
        a = Client(sys.argv[1], retries=10000, backoff=0.05, max_backoff=0.2, timeout=120).classify("sentiment", "a film")
        print(json.dumps([a.model, a[0].label]))
    """)
    caller = subprocess.Popen([client_python, "-c", script, f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    try:
        # The caller has met a closed port at least once before the server starts.
        seen = [caller.stderr.readline() for _ in range(1)]
        while "UNAVAILABLE" not in seen[-1]:
            assert seen[-1] and len(seen) < 50, seen
            seen.append(caller.stderr.readline())
        proc = ServerProcess(STORE, str(tmp_path), port=port)
        try:
            out, err = caller.communicate(timeout=150)
        finally:
            proc.stop()
    finally:
        caller.kill()
    assert caller.returncode == 0, err
    assert json.loads(out)[0] == "sentiment"


def test_the_readme_python_snippet_runs_as_written(client_python, server_process):
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("### From Python"):readme.index("### From tritonclient")]
    assert "pip install ./client/python" in section
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert '"localhost:8500"' in snippet
    out = subprocess.run([client_python, "-c", snippet.replace("localhost:8500", server_process.address)],
                         capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[0] == "positive" and lines[1].split()[0] == "negative"  # top_k=2, best first
    assert lines[2].split()[:3] == ["A", "0", "1"]  # the first token, its code-point offsets


def test_the_set_up_installs_the_package_into_the_projects_venv():
    """The README's Python snippet runs with .venv/bin/python as the set-up leaves it; its stubs are
    those of this checkout's proto (the set-up reinstalls when the proto changes)."""
    python = os.path.join(REPO, ".venv", "bin", "python")
    out = subprocess.run([python, "-c", "import json, qvi_client; from qvi_client._proto.qvi.serving.v1 import "
                          "inference_pb2 as pb; print(json.dumps(sorted(pb.MethodCost.DESCRIPTOR.fields_by_name)))"],
                         capture_output=True, text=True, timeout=60, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == ["extra_forwards_per_text", "ms_per_text_batch_1", "ms_per_text_batch_32"]


def test_the_api_key_goes_with_every_call_over_both_protocols(client_python, tmp_path):
    """Client(api_key=...) or QVI_API_KEY in the environment: a server with --api-keys answers; without a
    key it raises QviError UNAUTHENTICATED. The priority goes with the call too: this key may ask for
    normal at most, so high is PERMISSION_DENIED."""
    import hashlib
    key = "client-secret-2b7d"
    keys = os.path.join(tmp_path, "keys.json")
    with open(keys, "w") as f:
        json.dump({"keys": [{"name": "py", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                             "scopes": ["infer", "read"], "max_priority": "normal"}]}, f)
    proc = ServerProcess(STORE, str(tmp_path), "--api-keys", keys)
    try:
        script = """
            import json, sys
            from qvi_client import Client, QviError
            target, protocol, key = sys.argv[1], sys.argv[2], sys.argv[3] or None
            with Client(target, protocol=protocol, api_key=key, retries=0) as c:
                try:
                    answer = [c.classify("sentiment", "a fine film", priority="low").results[0].labels[0].label,
                              sorted(m.name for m in c.list_models())]
                    try:
                        c.tag("ner", "Ada went to Paris", priority="high")
                    except QviError as e:
                        answer.append([e.code.name, e.message])
                    print(json.dumps(answer))
                except QviError as e:
                    print(json.dumps([e.code.name, e.message]))
        """
        for protocol, address in (("grpc", proc.address), ("http", proc.http_address)):
            got, _ = run(client_python, script, address, protocol, key)
            # The GloVe demo models, and the pretrained ones where run.sh has fine-tuned them into the store.
            assert got[0] in ("positive", "negative") and {"ner", "sentiment", "topics"} <= set(got[1]), (protocol, got)
            assert got[2] == ["PERMISSION_DENIED", "priority: API key 'py' may ask for normal priority at most, "
                                                   "not high"], (protocol, got)
            got, _ = run(client_python, script, address, protocol, "")
            assert got[0] == "UNAUTHENTICATED" and "API key" in got[1], (protocol, got)
        os.environ["QVI_API_KEY"] = key
        try:
            got, _ = run(client_python, script, proc.address, "grpc", "")
        finally:
            del os.environ["QVI_API_KEY"]
        assert got[0] in ("positive", "negative"), got
    finally:
        proc.stop()
