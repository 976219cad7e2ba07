"""qvi_client.batch (the Python client's `qvi-batch`) against the demo models: a file of texts scored
over the stream, the answers equal to the unary call's; a stopped run resumed without asking any answered
text again; refusals by a rate limit sent again until answered; CSV and plain text in; the command line's
summary and exit code."""
import hashlib
import json
import os
import shlex
import subprocess
import sys

import pytest

from qvi_testing import REPO, STORE, ServerProcess

qvi_client = pytest.importorskip("qvi_client")
from qvi_client import Client  # noqa: E402
from qvi_client.batch import answered_ids, score_file  # noqa: E402

TEXTS = ["A moving, funny film.", "Dull and far too long.", "The cast is superb but the plot wanders.",
         "I would not watch it again.", "An instant classic.", "Flat, lifeless and predictable.", "Fine."]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_a_file_is_scored_with_its_explanations_and_a_stopped_run_resumes(server_process, tmp_path):
    texts = tmp_path / "texts.jsonl"
    rows = [{"id": f"t{i}", "text": f"{TEXTS[i % len(TEXTS)]} ({i})"} for i in range(120)]
    write_jsonl(texts, rows)
    out = tmp_path / "answers.jsonl"
    with Client(server_process.address) as client:
        summary = score_file(client, "sentiment", str(texts), str(out), gates=True, attention=True, top_k=2,
                             concurrency=16, texts_per_request=3, progress=False)
        assert (summary.texts, summary.answered, summary.failed, summary.skipped) == (120, 120, 0, 0), summary
        answers = {a["id"]: a for a in read_jsonl(out)}
        assert sorted(answers) == sorted(r["id"] for r in rows)
        for row in rows[:10]:
            unary = client.classify("sentiment", row["text"], top_k=2, attention=True, gates=True)[0]
            got = answers[row["id"]]
            assert got["model"] == "sentiment" and got["version"] >= 1
            assert [l["label"] for l in got["result"]["labels"]] == [l.label for l in unary.labels]
            assert got["result"]["labels"][0]["score"] == pytest.approx(unary.labels[0].score, abs=1e-5)
            assert [t["text"] for t in got["result"]["tokens"]] == [t.text for t in unary.tokens]
            assert [t["gate"] for t in got["result"]["tokens"]] == pytest.approx([t.gate for t in unary.tokens],
                                                                                  abs=1e-5)

        # A run stopped after 50 answers, in the middle of writing the 51st line: the cut line is
        # removed and only the other 70 texts are asked.
        lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
        out.write_text("".join(lines[:50]) + lines[50][:17], encoding="utf-8")
        assert len(answered_ids(str(out))) == 50
        assert out.read_text(encoding="utf-8").endswith("\n")
        summary = score_file(client, "sentiment", str(texts), str(out), progress=False)
        assert (summary.skipped, summary.answered, summary.failed) == (50, 70, 0), summary
        ids = [a["id"] for a in read_jsonl(out)]
        assert sorted(ids) == sorted(r["id"] for r in rows), "every id once"


def test_errors_are_written_per_text_and_tagging_reads_csv_and_plain_text(server_process, tmp_path):
    csv_in = tmp_path / "texts.csv"
    csv_in.write_text('id,text\n7,"Angela Merkel visited Paris."\n8,""\n9,Google opened an office in Zurich.\n',
                      encoding="utf-8")
    out = tmp_path / "tags.jsonl"
    with Client(server_process.address) as client:
        summary = score_file(client, "ner", str(csv_in), str(out), task="tag", progress=False)
        assert (summary.answered, summary.failed) == (3, 0), summary  # Tag answers an empty text empty
        answers = {a["id"]: a for a in read_jsonl(out)}
        assert [s["text"] for s in answers["9"]["result"]["spans"]] == \
            [s.text for s in client.tag("ner", "Google opened an office in Zurich.")[0].spans]

        plain = tmp_path / "texts.txt"
        plain.write_text("fine\n\nalso fine\n", encoding="utf-8")  # the blank line is text 2
        out = tmp_path / "plain.jsonl"
        summary = score_file(client, "sentiment", str(plain), str(out), progress=False)
        assert (summary.answered, summary.failed, summary.errors) == (2, 1, {"INVALID_ARGUMENT": 1}), summary
        errors = [a for a in read_jsonl(out) if "error" in a]
        assert errors[0]["id"] == 2 and errors[0]["error"]["code"] == "INVALID_ARGUMENT"
        assert "texts" in errors[0]["error"]["message"]
        # Failed texts are asked again by the next run; answered ones are not.
        summary = score_file(client, "sentiment", str(plain), str(out), progress=False)
        assert (summary.skipped, summary.failed) == (2, 1), summary


def test_refusals_by_a_rate_limit_are_sent_again_until_answered(api, tmp_path):
    key = "k-batch-feedc0ffee0123456"
    keys = tmp_path / "keys.json"
    # 40 texts a second with a bucket of 8: 60 texts at once meet the limit and must wait for it.
    keys.write_text(json.dumps({"keys": [{"name": "batch", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                                          "scopes": ["infer"],
                                          "limits": {"texts_per_second": 40, "burst_seconds": 0.2}}]}))
    proc = ServerProcess(STORE, str(tmp_path), "--api-keys", str(keys))
    try:
        texts = tmp_path / "texts.jsonl"
        write_jsonl(texts, [{"text": f"text number {i}"} for i in range(60)])
        out = tmp_path / "answers.jsonl"
        with Client(proc.address, api_key=key) as client:
            summary = score_file(client, "sentiment", str(texts), str(out), concurrency=32, retries=50,
                                 progress=False)
        assert (summary.answered, summary.failed) == (60, 0), summary
        assert summary.retries > 0, "the limit was never met: the test proves nothing"
        assert sorted(a["id"] for a in read_jsonl(out)) == list(range(1, 61))

        # qvi-client batch, the key from the environment: the same refusals, sent again until answered.
        out = tmp_path / "cpp.jsonl"
        run = subprocess.run([os.path.join(REPO, "build", "qvi-client"), "batch", "--server", proc.address, "--model",
                              "sentiment", "--concurrency", "32", "--retries", "50", str(texts), str(out)],
                             capture_output=True, text=True, timeout=300, env=dict(os.environ, QVI_API_KEY=key))
        assert run.returncode == 0, run.stderr
        summary_line = run.stderr.strip().splitlines()[-1]
        assert summary_line.startswith("60 texts: 60 answered, 0 failed (none)"), summary_line
        assert int(summary_line.split("; ")[1].split()[0]) > 0, "no request was sent again: " + summary_line
        assert sorted(a["id"] for a in read_jsonl(out)) == list(range(1, 61))
    finally:
        proc.stop()


def test_the_command_line_prints_a_summary_and_fails_when_texts_failed(server_process, tmp_path):
    texts = tmp_path / "texts.jsonl"
    write_jsonl(texts, [{"id": "a", "text": "good"}, {"id": "b", "text": "x" * 70000}])
    out = tmp_path / "answers.jsonl"
    env = dict(os.environ, PYTHONPATH="")
    run = subprocess.run([sys.executable, "-m", "qvi_client.batch", "--server", server_process.address, "--model",
                          "sentiment", "--gates", str(texts), str(out)], capture_output=True, text=True, timeout=120,
                         env=env, cwd=REPO)
    assert run.returncode == 1, run.stderr  # one text failed
    assert "2 texts: 1 answered, 1 failed (INVALID_ARGUMENT 1)" in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "-m", "qvi_client.batch", "--server", server_process.address, "--model",
                          "nope", str(texts), str(tmp_path / "none.jsonl")], capture_output=True, text=True,
                         timeout=120, env=env, cwd=REPO)
    # The long text is refused before its model is looked up; the other finds no model.
    assert run.returncode == 1 and "failed (INVALID_ARGUMENT 1, NOT_FOUND 1)" in run.stderr, run.stderr


def test_the_readmes_corpus_commands_run_as_written(server_process, tmp_path):
    """The README's "Score a whole file" block, replayed in a folder of its own (the repository's
    model_store, build and .venv linked in): the CoNLL-2003 test split made into JSONL, then tagged with β
    over one stream, every sentence answered; the summary line the README quotes."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("### Score a whole file"):]
    block = section[section.index("```sh\n") + 6:section.index("```", section.index("```sh\n") + 6)]
    make, score = [c for c in block.split("\nbuild/") if c.strip()]
    score = "build/" + score.strip()
    for name in ("model_store", "build", ".venv"):
        os.symlink(os.path.join(REPO, name), tmp_path / name)
    subprocess.run(["bash", "-c", make], cwd=tmp_path, check=True, timeout=300)
    texts = (tmp_path / "conll-test.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(texts) == 3453, len(texts)
    argv = shlex.split(score)
    run = subprocess.run([os.path.join(REPO, argv[0]), argv[1], "--server", server_process.address, *argv[2:]],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "3453 texts: 3453 answered, 0 failed (none), 0 already in the output" in run.stderr, run.stderr
    shown = section[section.index("```text\n") + 8:].splitlines()[0]
    assert shown.startswith("3453 texts: 3453 answered, 0 failed (none), 0 already in the output"), shown
    answers = read_jsonl(tmp_path / "conll-tags.jsonl")
    assert len(answers) == 3453 and all("gate" in t for a in answers for t in a["result"]["tokens"])
    first = next(a for a in answers if a["id"] == 1)
    assert [(s["label"], s["text"]) for s in first["result"]["spans"]] == [("LOC", "JAPAN"), ("LOC", "CHINA")]
