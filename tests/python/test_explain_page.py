"""The explanation page at / on the HTTP port, in a real browser: headless Chromium (Debian's chromium and
chromium-driver) driven by Selenium. Each test types a text as a person would, waits for the answer, and
reads what the page shows (labels, entity marks, the highlighted tokens and their numbers, the maps, the
model card) against what the JSON route answers for the same text. Screenshots are kept under
build/test-output/explain_page/ (QVI_TEST_OUTPUT moves it) and their colours checked. Also: the page is
self-contained (nothing fetched but this server's JSON routes), runs only its own script (CSP hash), and
--http-explain-page=false turns it off."""
import base64
import hashlib
import json
import os
import re
import shutil
import tempfile

import pytest
import torch
from PIL import Image

from qvi_testing import REPO, ServerProcess, http_call

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

torch.set_num_threads(1)
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
OUTPUT = os.path.join(os.environ.get("QVI_TEST_OUTPUT", os.path.join(REPO, "build", "test-output")), "explain_page")
WAIT_S = 30


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM and CHROMEDRIVER, "chromium or chromium-driver is missing: scripts/setup.sh installs them"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--window-size=1200,1600", "--lang=en-US"):
        options.add_argument(arg)
    # The driver Debian ships for this chromium, not one Selenium Manager would download.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT_S)
    os.makedirs(OUTPUT, exist_ok=True)
    yield driver
    driver.quit()


def answer_of(address, model, verb, text, **options):
    status, data, _ = http_call(address, "POST", f"/v1/models/{model}:{verb}",
                           {"texts": [text], "options": dict(tokens=True, **options)}, raw=True)
    assert status == 200, data
    return json.loads(data)


def state(driver):
    return driver.find_element(By.TAG_NAME, "body").get_attribute("data-state")


def open_page(driver, address, model):
    driver.get("about:blank")  # a new page each time: only the fragment would change otherwise
    driver.get(f"http://{address}/#model={model}")
    WebDriverWait(driver, WAIT_S).until(lambda d: state(d) != "loading")
    assert state(driver) == "ready", driver.find_element(By.ID, "error").text
    assert Select(driver.find_element(By.ID, "model")).first_selected_option.get_attribute("value").startswith(model)


def ask(driver, text, submit_by_keyboard=True):
    """Types `text` into the box and asks, by Ctrl+Enter (or the button); waits for the answer."""
    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)
    if submit_by_keyboard:
        box.send_keys(Keys.CONTROL, Keys.ENTER)
    else:
        driver.find_element(By.ID, "explain").click()
    WebDriverWait(driver, WAIT_S).until(lambda d: state(d) in ("answered", "error"))
    no_script_errors(driver)
    return state(driver)


def no_script_errors(driver):
    errors = driver.find_element(By.ID, "errors").text
    assert driver.find_element(By.TAG_NAME, "html").get_attribute("data-script-errors") != "yes", errors
    assert errors == "", errors


def row(driver, kind):
    """The tokens of one heat-map row: [(text, value, start, end, shade)]."""
    out = []
    for t in driver.find_elements(By.CSS_SELECTOR, f'#answer .row[data-kind="{kind}"] .tok'):
        # The colour as the browser holds it: rgba(r, g, b, shade), or rgb(r, g, b) at full shade.
        colour = re.search(r"rgba?\(\d+, \d+, \d+(?:, ([\d.]+))?\)", t.get_attribute("style"))
        assert colour, t.get_attribute("style")
        shade = float(colour.group(1) or 1)
        out.append((t.text, float(t.get_attribute("data-value")), int(t.get_attribute("data-start")),
                    int(t.get_attribute("data-end")), shade))
    return out


def screenshot(driver, name):
    path = os.path.join(OUTPUT, name)
    driver.save_screenshot(path)
    return Image.open(path).convert("RGB")


def pixels(img, predicate):
    return sum(1 for p in img.getdata() if predicate(p))


def near(rgb, target, tol=12):
    return all(abs(a - b) <= tol for a, b in zip(rgb, target))


def test_a_classification_typed_by_keyboard_shows_what_the_json_route_answers(browser, server_process):
    address = server_process.http_address
    open_page(browser, address, "sentiment")
    text = "A gorgeous, moving film."
    assert ask(browser, text) == "answered"
    api = answer_of(address, "sentiment", "classify", text, attention=True, gates=True, topK=2)["results"][0]
    labels = [(e.get_attribute("data-label"), float(e.get_attribute("data-score")))
              for e in browser.find_elements(By.CSS_SELECTOR, "#answer .labels .label")]
    assert [x[0] for x in labels] == [x["label"] for x in api["labels"]]
    assert all(abs(a[1] - b["score"]) < 1e-4 for a, b in zip(labels, api["labels"])), (labels, api["labels"])
    # α per token, in the text's order (the browser keeps a colour's opacity in 1/255 steps), each with its number; the most attended token drawn darkest.
    alpha = row(browser, "alpha")
    assert [a[0] for a in alpha] == [t["text"] for t in api["tokens"]]
    assert all(abs(a[1] - t["attention"]) < 1e-4 for a, t in zip(alpha, api["tokens"])), alpha
    top = max(range(len(alpha)), key=lambda i: alpha[i][1])
    assert alpha[top][4] == 1.0 and all(a[4] <= 1.0 for a in alpha)
    beta = row(browser, "beta")
    assert len(beta) == len(api["tokens"])
    assert all(abs(b[1] - t["gate"]) < 1e-4 and abs(b[4] - t["gate"]) < 0.005 for b, t in zip(beta, api["tokens"])), \
        (beta, [t["gate"] for t in api["tokens"]])
    # Per-layer maps of the 2-layer Transformer: one T x T map per layer (mean of heads), a β row each.
    md = json.loads(http_call(address, "GET", "/v1/models/sentiment", raw=True)[1])["model"]["versions"][0]["metadata"]
    n = len(api["tokens"])
    maps = browser.find_elements(By.CSS_SELECTOR, "#answer table.map")
    assert [m.get_attribute("data-layer") for m in maps] == [str(i) for i in range(md["layers"])]
    assert all(len(m.find_elements(By.CSS_SELECTOR, "td")) == n * n for m in maps)
    assert len(browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="layer-gates"]')) == md["layers"]
    # The model card, and how far to trust α: one table row per method the card measured.
    assert browser.find_element(By.ID, "description").text == md["description"]
    methods = [r.get_attribute("data-method") for r in browser.find_elements(By.CSS_SELECTOR, "#faithfulness-table tr[data-method]")]
    assert methods == [m["method"] for m in md["faithfulness"]["methods"]] and "alpha" in methods
    assert browser.find_element(By.CSS_SELECTOR, "#faithfulness summary").text.startswith("faithfulness on test.tsv: ")
    # how far to trust its scores: the card's calibration and its reliability diagram (before and after)
    cal = json.loads(md["modelCardJson"])["calibration"]
    summary = browser.find_element(By.CSS_SELECTOR, "#calibration summary").text
    assert summary.startswith(f"scores calibrated on {cal['fitted_on']} (T {cal['temperature']:.2f}): ECE "), summary
    dots = browser.find_elements(By.CSS_SELECTOR, "#reliability circle")
    assert len(dots) == len(cal["before"]["reliability"]) + len(cal["after"]["reliability"])
    after = [(float(d.get_attribute("data-confidence")), float(d.get_attribute("data-accuracy")))
             for d in dots if d.get_attribute("data-side") == "after"]
    assert after == [(q[1], q[2]) for q in cal["after"]["reliability"]]
    # the risk-coverage curve: a dot per threshold of the card's abstention table, answered share against accuracy
    curve = [(float(d.get_attribute("data-below")), float(d.get_attribute("data-answered")),
              float(d.get_attribute("data-accuracy")))
             for d in browser.find_elements(By.CSS_SELECTOR, "#risk-coverage circle")]
    assert curve == pytest.approx([(r["below"], 1 - r["abstained"], r["accuracy"]) for r in cal["abstention"]]), curve
    assert len(curve) == 6 and [a for _, a, _ in curve] == sorted((a for _, a, _ in curve), reverse=True), curve
    levels = [li.get_attribute("data-coverage") for li in browser.find_elements(By.CSS_SELECTOR, "#conformal li")]
    assert not browser.find_elements(By.ID, "calibration-note")  # its coverage is within sampling error
    assert levels == [str(c["coverage_target"]) for c in cal["conformal"]]
    # what the model scored on its test split, from its card
    test = json.loads(md["modelCardJson"])["metrics"]["test"]
    scored = browser.find_element(By.CSS_SELECTOR, '#card dd[data-fact="on its test split"]').text
    assert scored == f"accuracy {100 * test['accuracy']:.1f} %, macro F1 {100 * test['macro_f1']:.1f} %", scored
    img = screenshot(browser, "classify.png")
    red = pixels(img, lambda p: near(p, (220, 38, 38)))
    blue = pixels(img, lambda p: p[2] > 200 and p[2] - p[0] > 90 and p[2] - p[1] > 50)
    purple = pixels(img, lambda p: p[0] > 100 and p[2] > 200 and p[1] < 110)
    assert red > 300, f"{red} red pixels: the α highlight is missing"
    assert blue > 300, f"{blue} blue pixels: the β highlight is missing"
    assert purple > 100, f"{purple} purple pixels: the attention maps are missing"


def test_the_contribution_rows_come_first_with_the_json_answers_values_signs_and_card_figure(browser, server_process):
    """Issue 54: the page leads with each label's contribution row; its tokens' values and signs are the
    HTTP/JSON answer's (teal for, magenta against), the top row names its card figure, and the margin
    note adds up."""
    address = server_process.http_address
    open_page(browser, address, "sentiment")
    text = "A gorgeous, moving film, but the plot is dull."
    assert ask(browser, text) == "answered"
    no_script_errors(browser)
    api = answer_of(address, "sentiment", "classify", text, contributions=True, topK=2)["results"][0]
    kinds = [r.get_attribute("data-kind") for r in browser.find_elements(By.CSS_SELECTOR, "#answer .row.heat")]
    assert kinds[:kinds.index("alpha") + 1] == card_order(address, "sentiment", 2), kinds
    rows = browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="contribution"]')
    assert [r.get_attribute("data-label") for r in rows] == [lab["label"] for lab in api["labels"]]
    for j, (r, label) in enumerate(zip(rows, api["labels"])):
        toks = r.find_elements(By.CSS_SELECTOR, ".tok")
        assert [t.text for t in toks] == [t["text"] for t in api["tokens"]]
        served = [t["contribution"][j] for t in api["tokens"]]
        shown = [float(t.get_attribute("data-share")) for t in toks]
        assert shown == pytest.approx(served, abs=1e-5)
        for t, v in zip(toks, served):
            colour = re.search(r"rgba?\((\d+), (\d+), (\d+)", t.get_attribute("style")).groups()
            assert tuple(map(int, colour)) == ((13, 148, 136) if v >= 0 else (192, 38, 211)), (t.text, v)
        assert sum(served) + label["contributionRest"] == pytest.approx(label["margin"], abs=1e-4)
    assert any(v < 0 for t in api["tokens"] for v in t["contribution"][:1]) or \
        any(v > 0 for t in api["tokens"] for v in t["contribution"][:1])
    title = rows[0].find_element(By.CSS_SELECTOR, ".row-title").text
    assert re.match(r"contribution to \w+ \(comprehensiveness 0\.\d{3}, \d+\.\d× α\)$", title), title


def card_order(address, model, labels):
    """The page's explanation rows up to α's: per method the card measures, most comprehensive first,
    a row per label (an entity's one row for a tagger's occlusion)."""
    versions = json.loads(http_call(address, "GET", f"/v1/models/{model}", raw=True)[1])["model"]["versions"]
    md = next(v for v in versions if v["state"] == "MODEL_STATE_READY")["metadata"]
    comp = {m["method"]: m["comprehensiveness"]["mean"] for m in md["faithfulness"]["methods"]}
    kinds = {"contribution": ["contribution"] * labels, "occlusion": ["occlusion"] * labels, "alpha": ["alpha"]}
    if md["task"] == "tagging":
        kinds = {"occlusion": ["entity-occlusion"] * labels, "alpha": ["alpha"]}
    order = sorted(kinds, key=lambda m: -comp[m])
    return [k for m in order for k in kinds[m]]


def test_the_occlusion_rows_equal_the_json_answer_and_sit_where_the_card_ranks_them(browser, server_process):
    """Issue 54: each returned label's occlusion row (its drop per token, teal for, magenta against) is
    the HTTP/JSON answer's, labelled with the card's leave-one-out figure."""
    address = server_process.http_address
    open_page(browser, address, "sentiment")
    text = "A gorgeous, moving film, but the plot is dull."
    assert ask(browser, text) == "answered"
    api = answer_of(address, "sentiment", "classify", text, occlusion=True, topK=2)["results"][0]
    rows = browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="occlusion"]')
    assert [r.get_attribute("data-label") for r in rows] == [lab["label"] for lab in api["labels"]]
    for j, r in enumerate(rows):
        toks = r.find_elements(By.CSS_SELECTOR, ".tok")
        served = [t["occlusion"][j] for t in api["tokens"]]
        assert [float(t.get_attribute("data-share")) for t in toks] == pytest.approx(served, abs=1e-5)
        for t, v in zip(toks, served):
            colour = re.search(r"rgba?\((\d+), (\d+), (\d+)", t.get_attribute("style")).groups()
            assert tuple(map(int, colour)) == ((13, 148, 136) if v >= 0 else (192, 38, 211)), (t.text, v)
    title = rows[0].find_element(By.CSS_SELECTOR, ".row-title").text
    assert re.match(r"occlusion of \w+ \(comprehensiveness 0\.\d{3}, \d+\.\d× α\)$", title), title


def test_a_click_on_an_entity_shows_why_it_was_found(browser, server_process):
    """Issue 54: a tagger's answer shows one entity's occlusion row at a time; a click on another
    entity (or Enter on it) shows that entity's row: its values are the JSON answer's, its own tokens
    unshaded, and it leads the rows when the card ranks leave-one-out above α."""
    address = server_process.http_address
    open_page(browser, address, "ner")
    text = "Angela Merkel met Barack Obama in Berlin on Tuesday."
    assert ask(browser, text) == "answered"
    api = answer_of(address, "ner", "tag", text, occlusion=True)["results"][0]
    spans = api["spans"]
    assert len(spans) >= 2, spans
    kinds = [r.get_attribute("data-kind") for r in browser.find_elements(By.CSS_SELECTOR, "#answer .row.heat")
             if r.is_displayed()]
    assert kinds[:kinds.index("alpha") + 1] == card_order(address, "ner", 1), kinds
    marks = browser.find_elements(By.CSS_SELECTOR, "#answer mark.ent")
    for k in [len(spans) - 1, 0, 1]:
        if k == 1:
            marks[k].send_keys(Keys.ENTER)
        else:
            marks[k].click()
        shown = [r for r in browser.find_elements(By.CSS_SELECTOR, "#entity-why .row") if r.is_displayed()]
        assert [r.get_attribute("data-entity") for r in shown] == [str(k)]
        assert marks[k].get_attribute("aria-pressed") == "true"
        s = spans[k]
        toks = shown[0].find_elements(By.CSS_SELECTOR, ".tok")
        assert [float(t.get_attribute("data-share")) for t in toks] == pytest.approx(s["occlusion"], abs=1e-5)
        own = [i for i, t in enumerate(toks) if "own" in t.get_attribute("class").split()]
        assert own == list(range(s.get("tokenStart", 0), s["tokenEnd"]))
        assert shown[0].find_element(By.CSS_SELECTOR, ".row-title").text.startswith(f'why {s["label"]} "{s["text"]}"')
    no_script_errors(browser)


def test_the_faithfulness_check_deletes_alphas_top_tokens(browser, server_process):
    open_page(browser, server_process.http_address, "sentiment")
    browser.find_element(By.ID, "want-check").click()
    assert ask(browser, "A gorgeous, moving film that I will not forget.", submit_by_keyboard=False) == "answered"
    check = browser.find_element(By.ID, "check").text
    alpha = sorted(row(browser, "alpha"), key=lambda a: -a[1])[:3]
    m = re.match(r"With α's top 3 tokens deleted \((.*)\): p\((\w+)\) ([\d.]+) → ([\d.]+)\.$", check)
    assert m, check
    assert sorted(m.group(1).split(", ")) == sorted(a[0] for a in alpha)


def test_keyboard_moves_along_a_row_and_a_map_and_shows_the_numbers(browser, server_process):
    open_page(browser, server_process.http_address, "sentiment")
    assert ask(browser, "A gorgeous, moving film.") == "answered"
    toks = browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="alpha"] .tok')
    # One tab stop per row: Tab does not walk through every token.
    assert [t.get_attribute("tabindex") for t in toks] == ["0"] + ["-1"] * (len(toks) - 1)
    toks[0].send_keys(Keys.ARROW_RIGHT)
    active = browser.switch_to.active_element
    assert active == toks[1] and active.get_attribute("tabindex") == "0"
    status = browser.find_element(By.ID, "status").get_attribute("textContent")
    assert status == toks[1].get_attribute("data-info") and status.startswith("α attention ")
    active.send_keys(Keys.END)
    assert browser.switch_to.active_element == toks[-1]
    cells = browser.find_elements(By.CSS_SELECTOR, "#answer table.map")[0].find_elements(By.CSS_SELECTOR, "td")
    cells[0].send_keys(Keys.ARROW_DOWN)
    n = len(toks)
    assert browser.switch_to.active_element == cells[n]  # one row down: the next query token
    assert browser.find_element(By.ID, "status").get_attribute("textContent") == cells[n].get_attribute("data-info")


def test_right_to_left_and_cjk_texts_keep_their_offsets(browser, server_process):
    address = server_process.http_address
    open_page(browser, address, "ner")
    text = "Barack Obama flew to 東京 😀 and then to Paris"
    assert ask(browser, text) == "answered"
    api = answer_of(address, "ner", "tag", text)["results"][0]
    marks = browser.find_elements(By.CSS_SELECTOR, "#answer mark.ent")
    assert [(m.get_attribute("data-label"), int(m.get_attribute("data-start")), int(m.get_attribute("data-end")))
            for m in marks] == [(s["label"], s["start"], s["end"]) for s in api["spans"]]
    assert any(s["text"] == "Paris" for s in api["spans"]), api["spans"]
    # The marked text reads as typed: labels aside, nothing lost or moved by the emoji or the CJK.
    shown = browser.execute_script("""
        var p = document.querySelector('#answer p.source').cloneNode(true);
        p.querySelectorAll('.ent-label').forEach(function (e) { e.remove(); });
        return p.textContent;""")
    assert shown == text
    cps = list(text)
    for t in row(browser, "alpha"):
        assert "".join(cps[t[2]:t[3]]) == t[0], t
    screenshot(browser, "tag.png")
    # Right to left: a Hebrew text's tokens run right to left, and their offsets still slice the text.
    open_page(browser, address, "sentiment")
    text = "סרט יפה מאוד film"
    assert ask(browser, text) == "answered"
    toks = browser.find_element(By.CSS_SELECTOR, '#answer .row[data-kind="alpha"] .toks')
    assert browser.execute_script("return getComputedStyle(arguments[0]).direction", toks) == "rtl"
    alpha = row(browser, "alpha")
    assert [a[0] for a in alpha] == ["סרט", "יפה", "מאוד", "film"]
    assert all("".join(list(text)[a[2]:a[3]]) == a[0] for a in alpha)
    first, second = browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="alpha"] .tok')[:2]
    assert first.location["x"] > second.location["x"], "the first Hebrew token is not on the right"
    # ArrowLeft moves to the next token in a right-to-left row.
    first.send_keys(Keys.ARROW_LEFT)
    assert browser.switch_to.active_element == second
    screenshot(browser, "rtl.png")


def test_a_refused_request_shows_the_servers_error(browser, server_process):
    address = server_process.http_address
    open_page(browser, address, "sentiment")
    status, data, _ = http_call(address, "POST", "/v1/models/sentiment:classify", {"texts": ["   "]}, raw=True)
    assert status == 400
    assert ask(browser, "   ") == "error"
    assert browser.find_element(By.ID, "error").text == "HTTP 400: " + json.loads(data)["error"]
    assert browser.find_element(By.ID, "answer").text == ""
    assert ask(browser, "Fine again.") == "answered"  # the page recovers
    assert browser.find_element(By.ID, "error").text == ""


# A card with measured costs (the shape card_summary writes), on the HAN of explained_zoo, and a calibration whose
# test split fell short of its coverage (qvi.calibration's note).
SHORT = ("coverage on the test split fell short beyond sampling error (0.879 for 0.9): the thresholds were fitted "
         "on the dev split, on which this model is right 85.5 % of the time against 82.4 % on the test split")
CARD = {"calibration": {
    "fitted_on": "dev.tsv", "measured_on": "test.tsv", "method": "temperature", "temperature": 1.0, "bins": 15,
    "before": {"ece": 0.05, "brier": 0.2, "reliability": [[0.6, 0.7, 0.65, 10]]},
    "after": {"ece": 0.02, "brier": 0.19, "reliability": [[0.6, 0.7, 0.68, 10]]},
    "conformal": [{"coverage_target": 0.9, "min_probability": 0.4, "coverage": 0.879,
                   "coverage_interval": [0.86, 0.896], "mean_set_size": 1.1, "empty": 0.0}],
    "abstention": [{"below": 0.5, "abstained": 0.0, "accuracy": 0.82}, {"below": 0.8, "abstained": 0.3,
                                                                        "accuracy": 0.91}],
    "note": SHORT}, "faithfulness": {
    "split": "test.tsv", "answers": 10, "texts": 10, "ks": [1, 5, 10, 20, 50], "removal": "delete",
    "target": "p(predicted label)", "cost_machine": "x86_64, 2 torch threads",
    "methods": [{"method": m, "name": name,
                 **{k: {"mean": v, "low": v - 0.01, "high": v + 0.01}
                    for k in ("comprehensiveness", "sufficiency", "normalised_comprehensiveness")},
                 "cost": {"ms_per_text_batch_1": ms1, "ms_per_text_batch_32": ms32, "extra_forwards_per_text": fw}}
                for m, name, v, ms1, ms32, fw in (("occlusion", "occlusion", 0.4, 12.5, 1.25, 21.4),
                                                  ("alpha", "α", 0.15, 2.0, 0.125, 0))]}}


@pytest.fixture(scope="module")
def explained_zoo():
    """A context-aware Transformer (λ) and a HAN (sentence α and β), small and seeded, served."""
    from qvi import artifact
    from qvi.cli import BOUNDARIES
    from qvi.models import ModelConfig, build_model
    from qvi.tokenizer import TokenizerConfig, Vocabulary
    work = tempfile.mkdtemp(prefix="qvi_page_py_")
    store = os.path.join(work, "store")
    vocab = Vocabulary(["[PAD]", "[UNK]", "a", "good", "film", "dull", ".", "!"])
    boundaries = sorted({vocab.id(b) for b in BOUNDARIES} - {1})
    for name, arch in (("ctx", "ctx_transformer"), ("han", "han")):
        torch.manual_seed(3)
        cfg = ModelConfig(arch, len(vocab), 2, g="qvi", emb_dim=8, hidden=8, heads=2, layers=2, ffn=16,
                          boundary_ids=boundaries if arch == "han" else [])
        manifest = artifact.build_manifest(name, cfg, TokenizerConfig(max_tokens=32), vocab, ["neg", "pos"], "",
                                           CARD if arch == "han" else {})
        artifact.export(build_model(cfg), manifest, vocab, store, 1)
    proc = ServerProcess(store, work)
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_context_aware_and_hierarchical_models_show_lambda_and_sentence_weights(browser, explained_zoo):
    address = explained_zoo.http_address
    text = "A good film. A dull film!"
    open_page(browser, address, "ctx")
    assert ask(browser, text) == "answered"
    api = answer_of(address, "ctx", "classify", text, gates=True)["results"][0]
    for kind, field in (("lambda-q", "lambdaQ"), ("lambda-k", "lambdaK")):
        shown = row(browser, kind)
        assert [s[0] for s in shown] == [t["text"] for t in api["tokens"]]
        assert all(abs(s[1] - t[field]) < 1e-4 for s, t in zip(shown, api["tokens"])), (kind, shown)
    assert browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="layer-lambdaQ"]')
    # A context-aware QVI model has β as well, from its attention pooling.
    beta = row(browser, "beta")
    assert len(beta) == len(api["tokens"]) and all(abs(b[1] - t["gate"]) < 1e-4 for b, t in zip(beta, api["tokens"]))
    img = screenshot(browser, "lambda.png")
    green = pixels(img, lambda p: p[1] > 140 and p[1] - p[0] > 60 and p[1] - p[2] > 40)
    assert green > 200, f"{green} green pixels: the λ highlight is missing"
    open_page(browser, address, "han")
    assert ask(browser, text) == "answered"
    api = answer_of(address, "han", "classify", text, attention=True, gates=True)["results"][0]
    sentence = row(browser, "sentence-alpha")
    assert all(abs(s[1] - t["sentenceAttention"]) < 1e-4 for s, t in zip(sentence, api["tokens"])), sentence
    assert len({s[1] for s in sentence}) == 2, "two sentences, two sentence weights"
    assert row(browser, "sentence-beta")
    # A model without self-attention has no layer maps to ask for.
    assert browser.find_element(By.ID, "want-layers").get_attribute("disabled") == "true"


def test_the_cards_table_shows_each_methods_cost(browser, explained_zoo):
    """Issue 54 item 4: beside each method's faithfulness, what it costs (ms per text alone and in
    batches of 32, and the forwards beyond the answer's own), and the machine that measured it."""
    open_page(browser, explained_zoo.http_address, "han")
    rows = browser.find_elements(By.CSS_SELECTOR, "#faithfulness-table tr[data-method]")
    shown = [(r.get_attribute("data-method"), r.find_element(By.CSS_SELECTOR, "td.cost").text,
              r.find_element(By.CSS_SELECTOR, "td.forwards").text) for r in rows]
    assert shown == [("occlusion", "12.50 / 1.25", "+21.4"), ("alpha", "2.00 / 0.13", "+0.0")], shown
    summary = browser.find_element(By.CSS_SELECTOR, "#faithfulness summary").text
    assert summary.endswith("costs measured on x86_64, 2 torch threads"), summary
    # and the calibration's note, where its test split fell short of a coverage
    assert browser.find_element(By.ID, "calibration-note").text == SHORT
    assert len(browser.find_elements(By.CSS_SELECTOR, "#risk-coverage circle")) == 2


def test_the_page_is_self_contained_and_runs_only_its_own_script(server_process):
    status, body, headers = http_call(server_process.http_address, "GET", "/", raw=True)
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    page = body.decode()
    # Nothing from elsewhere: no absolute URL, no external script, style or image. (SVG's namespace is a
    # name in the form of a URL, never fetched: the reliability diagram's elements are made in it.)
    assert page.count("http://www.w3.org/2000/svg") == 1
    named = page.replace("http://www.w3.org/2000/svg", "")
    assert "http://" not in named and "https://" not in named
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=\"(?!data:|openapi\.json)", page), page[:2000]
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
    csp = headers["Content-Security-Policy"]
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_the_page_can_be_turned_off(tmp_path):
    store = os.path.join(tmp_path, "store")
    shutil.copytree(os.path.join(REPO, "model_store", "store", "sentiment"), os.path.join(store, "sentiment"))
    proc = ServerProcess(store, str(tmp_path), "--http-explain-page=false")
    try:
        status, body, _ = http_call(proc.http_address, "GET", "/", raw=True)
        assert status == 404 and "the explanation page is off" in json.loads(body)["error"]
        assert http_call(proc.http_address, "GET", "/v2/health/ready", raw=True)[0] == 200
        assert "the explanation page is at /" not in proc.log()
    finally:
        proc.stop()


def test_a_server_with_api_keys_makes_the_page_ask_for_one(browser, tmp_path):
    """Without a key the page shows the key row (the server answered 401); a wrong key says the server did
    not take it; the right one lists the models and explains, and no URL holds it."""
    store = os.path.join(tmp_path, "store")
    shutil.copytree(os.path.join(REPO, "model_store", "store", "sentiment"), os.path.join(store, "sentiment"))
    keys = os.path.join(tmp_path, "keys.json")
    key = "page-secret-4c8e1"
    with open(keys, "w") as f:
        json.dump({"keys": [{"name": "page", "sha256": hashlib.sha256(key.encode()).hexdigest(),
                             "scopes": ["infer", "read"]}]}, f)
    proc = ServerProcess(store, str(tmp_path), "--api-keys", keys)
    try:
        browser.get("about:blank")
        browser.get(f"http://{proc.http_address}/")
        WebDriverWait(browser, WAIT_S).until(lambda d: state(d) != "loading")
        assert state(browser) == "error"
        row = browser.find_element(By.ID, "key-row")
        assert row.is_displayed() and "This server wants an API key." in row.text
        assert "HTTP 401" in browser.find_element(By.ID, "error").text

        def use(k):
            field = browser.find_element(By.ID, "api-key")
            field.clear()
            field.send_keys(k, Keys.ENTER)
        use("not-the-key")
        WebDriverWait(browser, WAIT_S).until(
            lambda d: "The server did not take this key" in d.find_element(By.ID, "key-note").text)
        assert state(browser) == "error"
        use(key)
        WebDriverWait(browser, WAIT_S).until(lambda d: state(d) == "ready")
        assert not browser.find_element(By.ID, "key-row").is_displayed()
        ask(browser, "A moving , wonderful film .")
        assert state(browser) == "answered", browser.find_element(By.ID, "error").text
        assert key not in browser.current_url
        no_script_errors(browser)
    finally:
        browser.execute_script("sessionStorage.clear()")
        proc.stop()
