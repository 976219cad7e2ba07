"""The batching defaults have one source of truth, server/core/sched/defaults.h: qvi-server --help prints
them, GetModel reports them for a version that sets none of its own, and docs/serving.md's table and
the exporter's manifest block (model_store/qvi/artifact.py) say the same."""
import ast
import os
import re
import subprocess

from qvi_testing import REPO, SERVER

KEYS = ("max_batch_size", "max_batch_tokens", "max_queue_delay_ms", "max_queued_texts", "max_queued_tokens",
        "batch_when_idle", "priority_aging_ms")


def value(text):
    if text in ("true", "false"):
        return text == "true"
    return float(text)


def help_text():
    return subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=60, check=True).stdout


def help_defaults(device="cpu"):
    """The footer's defaults: the CPU's line, or (device "cuda") the keys the GPU's line changes."""
    out = help_text()
    cpu, _, gpu = out.partition("and on a GPU, unless")
    found = dict(re.findall(r"\b(" + "|".join(KEYS) + r")=(\S+)", cpu if device == "cpu" else gpu))
    if device == "cpu":
        assert set(found) == set(KEYS), out[-600:]
    else:
        assert found and set(found) <= set(KEYS), out[-600:]
    return {k: value(v) for k, v in found.items()}


def test_the_docs_table_lists_the_servers_defaults():
    with open(os.path.join(REPO, "docs", "serving.md"), encoding="utf-8") as f:
        rows = re.findall(r"^\| `(\w+)` \| `([^`]+)`(?:; `([^`]+)`)? \|", f.read(), flags=re.M)
    cpu = {k: value(v) for k, v, _ in rows if k in KEYS}
    gpu = {k: value(g) for k, _, g in rows if k in KEYS and g}
    assert cpu == help_defaults("cpu")
    assert gpu == help_defaults("cuda"), "the table's second figures are the GPU's (docs/serving.md)"


def test_the_exporter_writes_the_servers_defaults_into_manifests():
    with open(os.path.join(REPO, "model_store", "qvi", "artifact.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    exported = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "DEFAULT_SERVING" for t in node.targets))
    defaults = help_defaults()
    assert exported and {k: float(v) for k, v in exported.items()} == {k: defaults[k] for k in exported}


def test_get_model_reports_the_defaults_for_a_version_that_sets_none(server, api):
    # The demo sentiment model has no serving.json, and its manifest carries the exporter's defaults.
    pb, pb_grpc = api
    model = pb_grpc.InferenceStub(server).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")),
                                                   timeout=30).model
    batching = model.versions[0].metadata.batching
    assert {k: value(str(getattr(batching, k)).lower()) for k in KEYS} == help_defaults()


def test_get_model_says_why_a_cpu_model_has_no_cuda_graphs(server, api):
    # --cuda-graphs is on by default; graphs are a GPU thing, and GetModel says so rather than
    # leaving the field empty.
    pb, pb_grpc = api
    model = pb_grpc.InferenceStub(server).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")),
                                                   timeout=30).model
    graphs = model.versions[0].metadata.cuda_graphs
    assert (graphs.active, graphs.note, graphs.graphs, list(graphs.batch_sizes)) == (False, "none on the CPU", 0, [])


def test_a_flag_of_seconds_or_a_share_refuses_nan_and_infinity_naming_the_flag_and_its_range():
    """CLI11's Range lets "nan" through (every comparison with it is false): the server's own check refuses
    it, the infinities and what is not a number, each with the flag and its range, before anything starts."""
    for flag, value, bounds in (("--trace-rate", "nan", "0 to 1"), ("--otlp-sampling-ratio", "nan", "0 to 1"),
                                ("--shutdown-grace-seconds", "inf", "0 to 3600"),
                                ("--poll-store-seconds", "-inf", "0 to 86400"), ("--trace-rate", "0.5x", "0 to 1"),
                                ("--trace-rate", "2", "0 to 1")):
        out = subprocess.run([SERVER, "--model-store", os.path.join(REPO, "model_store", "store"), flag, value],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and f"{flag}: '{value}' is not a number from {bounds}" in out.stderr, \
            (flag, value, out.stderr)
