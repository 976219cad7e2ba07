"""scripts/run.sh serves early: on a store that lacks part of what set-up makes, the server starts on what is
there while the rest is made in the background (its own process group); a line says when each piece is in,
the server loads it, and stopping run.sh stops that work too.

The checkout is a scratch one (the scripts, requirement files, client package and proto copied, so that
set-up's stamps match and it skips what is done; .venv, build and the model zoo's code and corpora linked;
the store copied), so nothing here touches the real store. The model cache is off (QVI_MODEL_CACHE=)."""
import os
import shutil
import signal
import subprocess

import pytest

from qvi_testing import REPO, STORE, wait_until

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("QVI_SERVER")), reason="run.sh starts build/qvi-server: a sanitized server adds nothing here")


def scratch_checkout(tmp_path, drop):
    root = tmp_path / "checkout"
    for path in ("scripts", "requirements.txt", "requirements.lock", "requirements-test.txt", "client/python",
                 "proto/qvi/serving/v1/inference.proto"):
        src, dst = os.path.join(REPO, path), root / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        else:
            shutil.copy2(src, dst)
    for path in (".venv", "build", "model_store/qvi", "model_store/corpora", "model_store/data",
                 "model_store/pretrained"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).symlink_to(os.path.join(REPO, path))
    shutil.copytree(STORE, root / "model_store" / "store")
    for path in drop:
        target = root / "model_store" / "store" / path
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return root


class RunSh:
    """scripts/run.sh in `root` on free ports, its terminal in a file."""

    def __init__(self, root, tmp_path):
        self.root, self.port_file, self.out = root, tmp_path / "port", tmp_path / "run.out"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                ["scripts/run.sh", "--port=0", "--host", "127.0.0.1", "--port-file", str(self.port_file),
                 "--metrics-port", "0", "--http-port", "0", "--device", "cpu"],
                # The pretrained demo models (about 40 minutes of both cores after the GloVe ones) stay out: what is
                # tested here is the GloVe models' arrival; tests/python/test_finetune.py serves fine-tuned ones.
                cwd=root, env=dict(os.environ, QVI_MODEL_CACHE="", QVI_PRETRAINED_DEMOS="0"), stdout=out,
                stderr=subprocess.STDOUT)
        wait_until(lambda: self.port_file.exists() or self.proc.poll() is not None, "run.sh's server to start",
                   seconds=300, interval=0.2)
        assert self.proc.poll() is None, self.text()[-3000:]

    def text(self):
        return self.out.read_text(errors="replace")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_run_sh_serves_at_once_and_the_missing_package_arrives_live(tmp_path):
    root = scratch_checkout(tmp_path, ["topics/1/model.cpu.pt2"])
    run = RunSh(root, tmp_path)
    try:
        text = run.text()
        assert "ready to serve sentiment" in text, text[-3000:]
        assert "model topics@1 READY: CNN-Att-QVI (classification) on cpu from model.pt " in text, text[-3000:]
        wait_until(lambda: "the demo models are complete" in run.text(), "the background to finish", seconds=600,
                   interval=0.5)
        wait_until(lambda: "model topics@1 READY: CNN-Att-QVI (classification) on cpu from model.cpu.pt2" in run.text(),
                   "the server to load topics' package", seconds=60, interval=0.2)
        text = run.text()
        assert "topics: native CPU package compiled" in text, text[-3000:]
        assert "the server loads version 1 again" in text, text[-3000:]
        assert (root / "model_store/store/topics/1/model.cpu.pt2").exists()
        assert not (root / ".stamps/demo-models.pid").exists()
        assert "the demo models (in the background)\t" in (root / ".stamps/setup-times.tsv").read_text()
    finally:
        assert run.stop() == 0, run.text()[-3000:]


def test_stopping_run_sh_stops_the_models_it_is_still_making(tmp_path):
    root = scratch_checkout(tmp_path, ["ner"])  # training it takes minutes: still under way when stopped
    run = RunSh(root, tmp_path)
    pgid = int((root / ".stamps/demo-models.pid").read_text())
    try:
        assert group_alive(pgid)
        text = run.text()
        assert "model sentiment@1 READY" in text and "model ner@1" not in text, text[-3000:]
    finally:
        assert run.stop() == 0, run.text()[-3000:]
    wait_until(lambda: not group_alive(pgid), "the background's process group to end", seconds=30, interval=0.1)
    assert not (root / ".stamps/demo-models.pid").exists()
    assert not (root / "model_store/store/ner").exists()
