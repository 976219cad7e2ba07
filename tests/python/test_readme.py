"""The README's console examples, replayed: every `$ build/qvi-client ...` line of a ```console block
in README.md (and docs/serving.md) runs against a qvi-server on the demo models (only the address added), and its output must
be what the README shows — the same lines, the same words, labels and offsets, and every decimal number
within NUMBER_TOLERANCE of the README's (the demo models are retrained on each fresh machine; the last
digit of a probability may move). A line `    ...` stands for the rest of the output, left out."""
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pytest

from qvi_testing import REPO, STORE, ServerProcess

CLIENT = os.path.join(REPO, "build", "qvi-client")
CLIENT_PY = os.path.join(REPO, ".venv", "bin", "python")
# A model card, read with the zoo's own reader (the zoo and this suite's generated stubs are both `qvi`,
# so it runs in a process of its own).
CARD = ("import json, sys; sys.path.insert(0, 'model_store'); from qvi import artifact; "
        "print(json.dumps(artifact.load({path!r})[1]['model_card']))")
NUMBER = re.compile(r"[-+]?\d+\.\d+")
NUMBER_TOLERANCE = 0.011  # absolute; the README prints probabilities to 3-4 places, shares to 2


def console_examples(doc):
    """(command, expected output lines) of each `$ ` line of the doc's console blocks."""
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
        blocks = re.findall(r"```console\n(.*?)```", f.read(), re.S)
    examples = []
    for block in blocks:
        for line in block.splitlines():
            if line.startswith("$ "):
                examples.append((line[2:], []))
            else:
                examples[-1][1].append(line)
    return examples


EXAMPLES = console_examples("README.md")
DOC_EXAMPLES = console_examples("docs/serving.md")


@pytest.fixture(scope="module")
def demo_server():
    """The demo store as the README's reader has it (nothing added), served."""
    work = tempfile.mkdtemp(prefix="qvi_readme_py_")
    proc = ServerProcess(STORE, work)
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def same_line(got, want):
    """Equal but for decimal numbers, which may differ by NUMBER_TOLERANCE, and trailing spaces."""
    got, want = got.rstrip(), want.rstrip()
    if NUMBER.sub("#", got) != NUMBER.sub("#", want):
        return False
    return all(abs(float(a) - float(b)) <= NUMBER_TOLERANCE for a, b in zip(NUMBER.findall(got), NUMBER.findall(want)))


def test_the_readme_has_console_examples_of_each_command():
    commands = [shlex.split(c)[1] for c, _ in EXAMPLES]
    assert {"classify", "tag", "models", "health"} <= set(commands), commands
    assert all(c.startswith("build/qvi-client ") for c, _ in EXAMPLES), "only qvi-client examples are replayed"


def test_docs_serving_has_console_examples_too():
    assert DOC_EXAMPLES and all(c.startswith("build/qvi-client ") for c, _ in DOC_EXAMPLES), DOC_EXAMPLES


@pytest.mark.parametrize("command,expected", EXAMPLES + DOC_EXAMPLES,
                         ids=[c[:60] for c, _ in EXAMPLES + DOC_EXAMPLES])
def test_a_readme_console_example_prints_what_the_readme_shows(demo_server, command, expected):
    argv = shlex.split(command)
    assert argv[0] == "build/qvi-client", command
    out = subprocess.run([CLIENT, "--server", demo_server.address, "--color", "never", *argv[1:]], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = out.stdout.splitlines()
    if expected and expected[-1].strip() == "...":
        expected = expected[:-1]
        got = got[:len(expected)]
    assert len(got) == len(expected), "\n".join(["README:", *expected, "got:", *out.stdout.splitlines()])
    for g, w in zip(got, expected):
        assert same_line(g, w), f"README shows\n  {w}\nthe client prints\n  {g}\n(whole output:\n{out.stdout})"


def sh_client_commands():
    """The `build/qvi-client` lines of the ```sh blocks of the README and docs/, but those that name a
    server of their own (placeholders such as qvi.example.com, with TLS files test_tls.py makes) and
    `batch`, whose input file the README makes first (test_batch.py replays that block whole)."""
    commands = []
    for doc in ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                                      if f.endswith(".md")):
        with open(os.path.join(REPO, doc), encoding="utf-8") as f:
            for block in re.findall(r"```sh\n(.*?)```", f.read(), re.S):
                commands += [(doc, line.split("#")[0].strip()) for line in block.splitlines()
                             if line.startswith("build/qvi-client ") and "--server" not in line
                             and not line.startswith("build/qvi-client batch ")]  # test_batch.py runs those
    return commands


SH_COMMANDS = sh_client_commands()


def test_the_docs_sh_blocks_have_client_commands():
    assert {doc for doc, _ in SH_COMMANDS} >= {"docs/serving.md", "docs/deploy.md"}, SH_COMMANDS


@pytest.mark.parametrize("doc,command", SH_COMMANDS, ids=[f"{d}: {c[:50]}" for d, c in SH_COMMANDS])
def test_a_client_command_of_the_docs_runs_as_written(demo_server, doc, command):
    argv = shlex.split(command)
    out = subprocess.run([CLIENT, "--server", demo_server.address, "--color", "never", *argv[1:]], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{doc}: {command}\n{out.stderr}"
    assert out.stdout.strip(), f"{doc}: {command} printed nothing"


def cold_start_results():
    """The newest bench/results/cold-start-*.txt (bench/cold_start.sh's output) and its `[cold m:ss]` lines."""
    folder = os.path.join(REPO, "bench", "results")
    newest = sorted(f for f in os.listdir(folder) if re.fullmatch(r"cold-start-\d{4}-\d\d-\d\d\.txt", f))[-1]
    with open(os.path.join(folder, newest), encoding="utf-8") as f:
        lines = f.read().splitlines()
    return newest, lines


def test_the_readme_quotes_the_newest_cold_start_measurement():
    """The README's timings of a newcomer's first run are bench/cold_start.sh's lines, quoted whole from
    the results file it names (so a new measurement that is not quoted fails here)."""
    name, lines = cold_start_results()
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert f"bench/results/{name}" in readme, f"the README does not name the newest measurement, {name}"
    events = [line for line in lines if line.startswith("[cold ")]
    assert any("sentiment answered" in e for e in events) and any("complete" in e for e in events), events
    quoted = re.search(r"```text\n(\[cold .*?)```", readme, re.S)
    assert quoted, "the README has no ```text block of [cold ...] lines"
    assert quoted.group(1).splitlines() == events, "the README's quote differs from " + name


# The README's sentence on the demo models' test figures, and what each number is in the model's card.
FIGURES = [("sentiment", r"`sentiment` is right on ([\d.]+)% of the Rotten Tomatoes test snippets", "accuracy"),
           ("ner", r"`ner` finds CoNLL-2003's test entities with ([\d.]+)% F1", "f1"),
           ("topics", r"`topics` puts ([\d.]+)% of BBC News test articles", "accuracy")]


@pytest.mark.parametrize("name,pattern,key", FIGURES, ids=[f[0] for f in FIGURES])
def test_the_readme_quotes_the_test_figures_of_the_demo_models_this_machine_trained(name, pattern, key):
    """Every machine trains the same demo models (model_store/qvi/reproducible.py), so the README's
    figures are the ones a fresh machine gets: the card's, as set-up trained the model here."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        quoted = re.search(pattern.replace(" ", r"\s+"), f.read())  # the sentence may wrap anywhere
    assert quoted, f"the README has no sentence matching {pattern!r}"
    card = json.loads(subprocess.run([CLIENT_PY, "-c", CARD.format(path=os.path.join(STORE, name, "1", "model.pt"))],
                                     capture_output=True, text=True, check=True, cwd=REPO).stdout)
    assert card["training"]["options"]["isa"] == "avx2", "the demo model was not trained with the pinned recipe"
    assert quoted.group(1) == f"{100 * card['metrics']['test'][key]:.1f}", (name, key, card["metrics"]["test"])


def layout_folders(readme_text):
    """The folders README's Layout names: each entry's path (a file's folder too), the folders listed under
    server/core/, and the sub-folders an entry's text names (`native/ and oip/`), as paths from the root."""
    block = re.search(r"## Layout\n\n```\n(.*?)```", readme_text, re.S).group(1)
    named, current = set(), None
    for line in block.splitlines():
        entry = re.match(r"^(\S+)\s", line)
        nested = re.match(r"^ {20}([a-z][\w-]*)/\s", line)
        if entry:
            path = entry.group(1)
            current = path.rstrip("/") if path.endswith("/") else os.path.dirname(path)
            named.add(current)
            text = line[entry.end():]
        elif nested and current is not None and current.startswith("server/core"):
            current = "server/core/" + nested.group(1)
            named.add(current)
            text = line[nested.end():]
        else:
            text = line
        if current is not None:
            named.update(f"{current}/{folder}" for folder in re.findall(r"(?<![\w./-])([a-z][\w-]*)/(?=[\s,)])", text))
    return named


def test_the_layout_names_every_folder_of_the_server_and_only_folders_that_exist():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        named = layout_folders(f.read())
    missing = sorted(p for p in named if not os.path.isdir(os.path.join(REPO, p)))
    assert missing == [], f"README's Layout names folders the tree does not have: {missing}"
    code = {os.path.relpath(folder, REPO) for folder, _, files in os.walk(os.path.join(REPO, "server"))
            if any(f.endswith((".h", ".cc")) for f in files)}
    unnamed = sorted(code - named)
    assert unnamed == [], f"README's Layout leaves out these folders of server/: {unnamed}"


def test_the_layout_reader_sees_a_stale_folder_and_a_missing_one():
    text = ("## Layout\n\n```\nserver/core/      the core:\n                    spec/     outputs.h\n"
            "server/grpc/      adapters: native/ (the API), oip/ (OIP v2)\nserver/main.cc    the process\n```\n")
    assert layout_folders(text) == {"server", "server/core", "server/core/spec", "server/grpc", "server/grpc/native",
                                    "server/grpc/oip"}
