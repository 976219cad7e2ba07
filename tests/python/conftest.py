"""Fixtures for the end-to-end tests: Python stubs generated from proto/ and a running qvi-server."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "model_store"))
SERVER = os.environ.get("QVI_SERVER", os.path.join(REPO, "build", "qvi-server"))
STORE = os.path.join(REPO, "model_store", "store")


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


def _export_inconsistent_model(store):
    """A model whose manifest lists three labels while its logits have two columns: it loads (its
    warm-up runs), but every answer it gives is refused as INTERNAL."""
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


@pytest.fixture(scope="session")
def server():
    """qvi-server on a free port over a copy of the demo store plus a corrupt version."""
    assert os.path.exists(SERVER), f"{SERVER} is missing: scripts/test.sh builds it"
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
    port_file = os.path.join(work, "port")
    log = open(os.path.join(work, "server.log"), "w")
    proc = subprocess.Popen([SERVER, "--model-store", store, "--port", "0", "--host", "127.0.0.1",
                             "--port-file", port_file, "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not os.path.exists(port_file):
        assert proc.poll() is None, f"qvi-server exited: {open(log.name).read()}"
        assert time.monotonic() < deadline, "qvi-server did not start in 120 s"
        time.sleep(0.05)
    with open(port_file) as f:
        address = f"127.0.0.1:{int(f.read())}"
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=30)
    yield channel
    channel.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    log.close()
    shutil.rmtree(work, ignore_errors=True)
