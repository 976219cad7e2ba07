"""Fixtures for the end-to-end tests: Python stubs generated from proto/, a running qvi-server, and
the virtual environment of the Open Inference Protocol clients."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from qvi_testing import REPO, STORE, ServerProcess, api_stubs  # the helpers every suite shares


@pytest.fixture(scope="session")
def api():
    """The qvi.serving.v1 Python modules, generated from proto/ (qvi_testing.api_stubs)."""
    return api_stubs()


INTEROP = os.path.join(REPO, "tests", "python", "interop")


@pytest.fixture(scope="session")
def interop_python():
    """The Python of a virtual environment holding tritonclient and KServe's client, installed from
    tests/python/interop/requirements.lock. Kept outside the checkout, in ~/.cache/qvi-serve/interop-venv/
    under the lock's hash (QVI_INTEROP_VENVS moves it), so that a fresh clone (CI) does not install it
    again (45 s); made under a file lock, so that two suites at once make it once."""
    from filelock import FileLock
    lock = os.path.join(INTEROP, "requirements.lock")
    with open(lock, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    home = os.environ.get("QVI_INTEROP_VENVS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qvi-serve", "interop-venv")
    venv = os.path.join(home, digest[:16])
    stamp = os.path.join(venv, "lock.sha256")
    python = os.path.join(venv, "bin", "python")
    os.makedirs(home, exist_ok=True)
    with FileLock(venv + ".lock", timeout=1200):
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
    proc = ServerProcess(store, work, "--default-model", "sentiment")  # TEI's routes name no model
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


# With pytest-xdist (`-n 2 --dist loadgroup`, scripts/sanitize.sh), a file's tests stay on one worker,
# so that its module-scoped servers start once; the files that run the repository's own scripts
# (setup.sh, run.sh), which write the checkout's .stamps and build, share one group, so that two of them
# never run at once.
RUNS_REPO_SCRIPTS = {"test_setup_script.py", "test_lifecycle.py", "test_run_script.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = os.path.basename(str(item.fspath))
        group = "repo-scripts" if name in RUNS_REPO_SCRIPTS else name
        item.add_marker(pytest.mark.xdist_group(group))
