"""qvi-client's HTML report in a real browser: headless Chromium (Debian's package) loads the page
qvi-client wrote, runs its script without errors, and its screenshot shows the highlighted tokens
(α in red, β in blue) and, for Tag, the highlighted entity. Texts are escaped, never run."""
import html
import os
import re
import shutil
import subprocess
import tempfile

import pytest
from PIL import Image

from qvi_testing import REPO

CLIENT = os.environ.get("QVI_CLIENT", os.path.join(REPO, "build", "qvi-client"))
CHROMIUM = shutil.which("chromium")


@pytest.fixture
def work():
    d = tempfile.mkdtemp(prefix="qvi_html_")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def client(server_process, *args):
    out = subprocess.run([CLIENT, "--server", server_process.address, "--color", "never", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def browser(*args):
    assert CHROMIUM, "chromium is missing: scripts/setup.sh installs Debian's package"
    out = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--no-first-run", "--disable-dev-shm-usage", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def render(page, png):
    """The DOM after the page's scripts ran, and a screenshot."""
    dom = browser("--dump-dom", f"file://{page}")
    browser("--window-size=1200,1400", f"--screenshot={png}", f"file://{page}")
    return dom, Image.open(png).convert("RGB")


def count(img, predicate):
    return sum(1 for p in img.getdata() if predicate(p))


def near(rgb, target, tol=12):
    return all(abs(a - b) <= tol for a, b in zip(rgb, target))


def test_classify_report_renders_with_highlighted_tokens(server_process, work):
    page = os.path.join(work, "why.html")
    hostile = "<script>document.title='pwned'</script> dull & long"
    stdout = client(server_process, "classify", "--model", "sentiment", "--top-k", "2", "--html", page,
                    "A gorgeous, moving film.", hostile)
    assert "positive" in stdout or "negative" in stdout
    written = open(page, encoding="utf-8").read()
    assert "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt; dull &amp; long" in written
    assert "http://" not in written and "https://" not in written  # self-contained: nothing fetched
    dom, img = render(page, os.path.join(work, "why.png"))
    assert 'data-ready="yes"' in dom, "the page's script did not finish"
    assert 'data-script-errors="yes"' not in dom and '<pre id="errors"></pre>' in dom, "the page had script errors"
    assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]
    assert dom.count('class="tok"') >= 2 * 6  # α and β rows of the first text at least
    assert "Self-attention maps" in dom and "layer 1, mean of heads" in dom
    # How far to trust them: the card's figures, one line per method, under the heading.
    faith = re.search(r'<details class="faithfulness"><summary>(.*?)</summary><ul>(.*?)</ul>', dom, re.S)
    assert faith and faith.group(1).startswith("faithfulness on test.tsv: "), dom[:3000]
    lines = re.findall(r"<li>(.*?)</li>", faith.group(2))
    assert lines[0].startswith("random: comprehensiveness AOPC ") and "(the floor)" in lines[0]
    assert any(re.match(r"α: comprehensiveness AOPC 0\.\d{3} \[0\.\d{3}, 0\.\d{3}\], random 0\.\d{3}; "
                        r"sufficiency -?0\.\d{3}; leave-one-out agreement ρ -?0\.\d\d; cost \d+\.\d\d ms/text alone, "
                        r"\d+\.\d\d in batches of 32, \+0\.0 forwards$", html.unescape(x))
               for x in lines), lines
    # How far to trust the scores: the card's calibration and its reliability diagram, before and after.
    cal = re.search(r'<details class="calibration" id="calibration"><summary>(.*?)</summary>\s*<svg id="reliability"'
                    r'(.*?)</svg>', dom, re.S)
    assert cal and cal.group(1).startswith("scores calibrated on "), dom[:3000]
    sides = re.findall(r'data-side="(before|after)"', cal.group(2))
    assert "before" in sides and "after" in sides, sides
    # and its risk-coverage curve: per threshold of the card's abstention table, the share answered and its accuracy
    curve = re.search(r'<svg id="risk-coverage"(.*?)</svg>', dom, re.S)
    dots = re.findall(r'<circle data-below="([\d.]+)" data-answered="([\d.]+)" data-accuracy="([\d.]+)"', curve.group(1))
    answered = [float(a) for _, a, _ in dots]
    assert len(dots) == 6 and answered == sorted(answered, reverse=True) and answered[0] > answered[-1], dots
    assert [float(b) for b, _, _ in dots] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95], dots
    assert 'id="calibration-note"' not in dom  # sentiment's coverage is within sampling error
    # The most attended token of each text is drawn at full red; β boxes are blue.
    red = count(img, lambda p: near(p, (220, 38, 38)))
    blue = count(img, lambda p: p[2] > 200 and p[2] - p[0] > 90 and p[2] - p[1] > 50)
    assert red > 300, f"{red} red pixels: the α highlight is missing"
    assert blue > 300, f"{blue} blue pixels: the β highlight is missing"


def card_order(server_process, model, rows):
    """The report's explanation rows up to α's: per method the card measures, most comprehensive
    first, `rows` rows each (a label's, or an entity's)."""
    import json
    info = json.loads(client(server_process, "--json", "models", "--model", model))
    md = next(v for v in info["model"]["versions"] if v["state"] == "MODEL_STATE_READY")["metadata"]
    comp = {m["method"]: m["comprehensiveness"]["mean"] for m in md["faithfulness"]["methods"]}
    kinds = {"occlusion": ["entity-occlusion" if md["task"] == "tagging" else "occlusion"] * rows,
             "alpha": ["α attention"]}
    if md["task"] == "classification":
        kinds["contribution"] = ["contribution"] * rows
    return [k for m in sorted(kinds, key=lambda m: -comp[m]) for k in kinds[m]]


def test_occlusion_in_the_terminal_and_the_report_equals_the_json_answer(server_process, work):
    """Issue 54: --occlusion prints each label's (each entity's) drop per token; the tagger's report
    draws one row per entity, in the card's order, with the JSON answer's values, its own tokens
    unshaded."""
    import json
    text = "Angela Merkel met Barack Obama in Berlin ."
    answer = json.loads(client(server_process, "--json", "tag", "--model", "ner", "--occlusion", text))["results"][0]
    spans = answer["spans"]
    assert spans and all("probability" in s and len(s["occlusion"]) == len(answer["tokens"]) for s in spans), spans
    out = client(server_process, "tag", "--model", "ner", "--occlusion", text)
    for s in spans:
        assert 'why %s "%s" (p %.4f)' % (s["label"], s["text"], s["probability"]) in out, out
    start, end = spans[0].get("token_start", 0), spans[0]["token_end"]
    first = next(i for i in range(len(answer["tokens"])) if not start <= i < end)
    assert "%s(%+.2f)" % (answer["tokens"][first]["text"], spans[0]["occlusion"][first]) in out, out
    page = os.path.join(work, "ner-why.html")
    client(server_process, "tag", "--model", "ner", "--html", page, text)
    dom, _ = render(page, os.path.join(work, "ner-why.png"))
    assert 'data-ready="yes"' in dom and 'data-script-errors="yes"' not in dom
    kinds = re.findall(r'class="row heat[^"]*" data-kind="([^"]+)"', dom)
    assert kinds[:kinds.index("α attention") + 1] == card_order(server_process, "ner", len(spans)), kinds
    rows = re.findall(r'data-kind="entity-occlusion" data-label="[^"]*">(.*?)</div>', dom, re.S)
    for s, row in zip(spans, rows):
        assert [float(x) for x in re.findall(r'data-share="(-?[\d.]+)"', row)] == pytest.approx(s["occlusion"], abs=1e-5)
        own = [i for i, c in enumerate(re.findall(r'<span class="tok( own)?"', row)) if c]
        assert own == list(range(s.get("token_start", 0), s["token_end"]))
    out = client(server_process, "classify", "--model", "sentiment", "--top-k", "2", "--occlusion",
                 "a gorgeous , moving film")
    assert re.search(r"occlusion of \w+ \(p [\d.]+\): the drop without each token\n    a\([+-][\d.]+\) gorgeous", out), out


def test_the_report_and_the_terminal_lead_with_each_labels_contributions(server_process, work):
    """Issue 54: --html asks for contributions where the model has them and draws one row per label
    before α, with the --json answer's values and signs; the terminal prints each label's margin as
    its tokens' sum plus the rest, and each token's signed share."""
    import json
    text = "A gorgeous, moving film, but the plot is dull."
    answer = json.loads(client(server_process, "--json", "classify", "--model", "sentiment", "--top-k", "2",
                               "--contributions", text))["results"][0]
    page = os.path.join(work, "why.html")
    client(server_process, "classify", "--model", "sentiment", "--top-k", "2", "--html", page, text)
    dom, img = render(page, os.path.join(work, "why.png"))
    assert 'data-ready="yes"' in dom and 'data-script-errors="yes"' not in dom
    kinds = re.findall(r'class="row heat[^"]*" data-kind="([^"]+)"', dom)
    assert kinds[:kinds.index("α attention") + 1] == card_order(server_process, "sentiment", 2), kinds
    for j, label in enumerate(answer["labels"]):
        row = re.search(r'data-kind="contribution" data-label="%s">(.*?)</div>' % re.escape(label["label"]), dom, re.S)
        shares = [float(x) for x in re.findall(r'data-share="(-?[\d.]+)"', row.group(1))]
        assert shares == pytest.approx([t["contribution"][j] for t in answer["tokens"]], abs=1e-5)
        colours = re.findall(r'data-share="(-?[\d.]+)" style="background: rgba\((\d+, \d+, \d+)', row.group(1))
        assert all((c == "13, 148, 136") == (float(v) >= 0) for v, c in colours), colours
    teal = count(img, lambda p: near(p, (13, 148, 136), 20))
    assert teal > 100, f"{teal} teal pixels: the contribution highlight is missing"
    out = client(server_process, "classify", "--model", "sentiment", "--top-k", "2", "--contributions", text)
    sums = re.findall(r"contribution to (\w+): margin (-?[\d.]+) = tokens (-?[\d.]+) \+ rest (-?[\d.]+)", out)
    assert [s[0] for s in sums] == [lab["label"] for lab in answer["labels"]], out
    for (label, margin, tokens, rest), want in zip(sums, answer["labels"]):
        assert float(margin) == pytest.approx(want["margin"], abs=1e-4)
        assert float(tokens) + float(rest) == pytest.approx(float(margin), abs=2e-4)
    first = answer["tokens"][0]
    assert "%s(%+.2f)" % (first["text"], first["contribution"][0]) in out, out


def test_the_client_prints_a_models_faithfulness_one_line_per_method(server_process):
    out = client(server_process, "models", "--model", "topics")
    lines = out.splitlines()
    assert re.match(r"topics +v1 +READY +CNN-Att-QVI \(classification, cpu, 5 labels\)$", lines[0]), out
    assert lines[1].startswith("  faithfulness on test.tsv: 223 answers in 223 texts, tokens deleted, "
                               "p(predicted label); costs measured on x86_64, "), out
    names = [line.strip().split(":")[0] for line in lines[2:]]
    assert names == ["random", "α", "contribution", "gradient × input", "integrated gradients", "occlusion"], out
    assert "leave-one-out agreement ρ" in lines[3] and "leave-one-out agreement" not in lines[-1]
    # each method's cost: what the answer's own pass holds costs no extra forward, occlusion one per token
    forwards = {name: float(re.search(r"; cost \d+\.\d\d ms/text alone, \d+\.\d\d in batches of 32, "
                                      r"\+(\d+\.\d) forwards$", line).group(1))
                for name, line in zip(names, lines[2:])}
    assert forwards["α"] == forwards["contribution"] == 0 and forwards["integrated gradients"] == 20, forwards
    assert forwards["occlusion"] > 10, forwards


def test_tag_report_highlights_the_entity(server_process, work):
    page = os.path.join(work, "ner.html")
    text = "Barack Obama flew to Paris with Microsoft people 😀 ."
    client(server_process, "tag", "--model", "ner", "--html", page, text)
    dom, img = render(page, os.path.join(work, "ner.png"))
    assert 'data-ready="yes"' in dom and 'data-script-errors="yes"' not in dom and '<pre id="errors"></pre>' in dom
    assert '<mark class="ent"' in dom, "no entity span on the page"
    # Spans are cut from the original text by their byte offsets: the page shows it whole.
    source = re.search(r'<p class="source spans">(.*?)</p>', dom, re.S)
    assert source, "no text paragraph on the page"
    shown = re.sub(r"<[^>]+>", "", re.sub(r'<span class="ent-label">[^<]*</span>', "", source.group(1)))
    assert html.unescape(shown) == text, shown
    marked = count(img, lambda p: near(p, (253, 230, 138), tol=6))  # the entity's background
    assert marked > 100, f"{marked} highlighted pixels: the entity span is not highlighted"


def test_the_report_says_why_a_coverage_fell_short(tmp_path):
    """A card whose test split fell short of a coverage beyond sampling error carries qvi.calibration's note; the
    report shows it under the diagrams, escaped."""
    from qvi import artifact
    from qvi_testing import STORE, ServerProcess
    store = tmp_path / "store"
    shutil.copytree(os.path.join(STORE, "sentiment"), store / "sentiment")
    for package in (store / "sentiment" / "1").glob("*.pt2"):  # the card is read from model.pt then
        package.unlink()
    model_pt = str(store / "sentiment" / "1" / "model.pt")
    card = artifact.load(model_pt)[1]["model_card"]["calibration"]
    note = "coverage on the test split fell short beyond sampling error (0.879 for 0.9): <dev & test differ>"
    artifact.update_card(model_pt, {"calibration": dict(card, note=note)})
    proc = ServerProcess(str(store), str(tmp_path))
    try:
        page = str(tmp_path / "why.html")
        client(proc, "classify", "--model", "sentiment", "--html", page, "A dull film.")
        with open(page, encoding="utf-8") as f:
            shown = re.search(r'<p class="meta" id="calibration-note">(.*?)</p>', f.read())
        assert shown and shown.group(1) == html.escape(note, quote=True), shown
    finally:
        proc.stop()
