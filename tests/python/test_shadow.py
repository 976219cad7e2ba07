"""Shadow versions (server/core/serving/shadow.h; docs/serving.md, "Shadow versions"): a retrained `sentiment`
v2 (a CNN-attention model trained here for two epochs on the demo corpus, seed 11) beside the demo v1, named the
shadow candidate in serving.json. The callers' answers stay v1's; every text they send is mirrored to both
versions off their path; the comparison the server reports (GetModel, GET /v1/models/{m}/shadow, Prometheus)
matches the same comparison done here offline from each version's own answers; under overload the mirrored
work is dropped and counted, and every caller is answered."""
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from qvi_testing import REPO, STORE, ServerProcess, get_json, http_call, masked, metric_sum, wait_until

MODEL_STORE = os.path.join(REPO, "model_store")
SHADOW = {"version": 2, "fraction": 1.0, "keep_texts": True}


def corpus_texts(n):
    with open(os.path.join(MODEL_STORE, "data", "sentiment", "test.tsv")) as f:
        return [line.rstrip("\n").split("\t", 1)[1] for line in f][:n]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """sentiment/1 (the demo model's TorchScript file) and sentiment/2 (retrained here), v2 the candidate."""
    work = str(tmp_path_factory.mktemp("shadow"))
    store = os.path.join(work, "store")
    os.makedirs(os.path.join(store, "sentiment", "1"))
    shutil.copy(os.path.join(STORE, "sentiment", "1", "model.pt"), os.path.join(store, "sentiment", "1"))
    checkpoint = os.path.join(work, "v2.pt")
    data = os.path.join(MODEL_STORE, "data", "sentiment")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    trained = subprocess.run([sys.executable, "-m", "qvi", "train", "--task", "classification", "--arch", "cnn_att",
                              "--g", "qvi", "--train", os.path.join(data, "train.tsv"), "--dev",
                              os.path.join(data, "dev.tsv"), "--min-count", "2", "--max-tokens", "128", "--epochs",
                              "2", "--seed", "11", "--threads", "2", "--quiet", "--out", checkpoint],
                             cwd=MODEL_STORE, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr
    exported = subprocess.run([sys.executable, "-m", "qvi", "export", "--checkpoint", checkpoint, "--store", store,
                               "--name", "sentiment", "--version", "2", "--format", "torchscript"],
                              cwd=MODEL_STORE, env=env, capture_output=True, text=True, timeout=600)
    assert exported.returncode == 0, exported.stderr
    with open(os.path.join(store, "sentiment", "serving.json"), "w") as f:
        # The default policy (latest:1) chooses among the others: v1 serves, and the candidate loads beside it.
        json.dump({"format": "torchscript", "shadow": SHADOW}, f)
    return work, store


@pytest.fixture(scope="module")
def server(store):
    work, path = store
    # --shadow-max-cpu-busy 1: every sampled text compared, however busy the test machine's CPU is
    proc = ServerProcess(path, work, "--shadow-max-inflight-texts", "1024", "--shadow-max-cpu-busy", "1")
    yield proc
    proc.stop()


def classify(api, server, texts, version=0, explain=False):
    pb, pbg = api
    options = pb.OutputOptions(top_k=2, tokens=explain, contributions=explain)
    return pbg.InferenceStub(server.channel).Classify(pb.ClassifyRequest(
        model=pb.ModelSpec(name="sentiment", version=version), texts=texts, options=options), timeout=60)


def shadow_of(server):
    return get_json(server.http_address, "/v1/models/sentiment/shadow")["comparisons"]


def spearman(a, b):
    def ranks(v):
        v = np.asarray(v, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            r[order[i:j + 1]] = (i + j) / 2 + 1
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    if len(a) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def test_callers_get_the_serving_versions_answers_and_the_comparison_matches_an_offline_one(api, server):
    texts = corpus_texts(120)
    # The callers' answers: v1's, the same as asking v1 by name (which is not mirrored).
    answers = [classify(api, server, texts[i:i + 10]) for i in range(0, len(texts), 10)]
    got = [r for a in answers for r in a.results]
    assert {a.model.version for a in answers} == {1}, "a request that named no version reached the candidate"
    v1 = classify(api, server, texts, version=1).results
    # (a batch's other texts move the last digits of a score)
    assert [r.labels[0].label for r in got] == [r.labels[0].label for r in v1]
    assert [r.labels[0].score for r in got] == pytest.approx([r.labels[0].score for r in v1], abs=1e-5)
    comparison = wait_until(lambda: (lambda c: c if c and int(c[0]["comparedTexts"]) == len(texts) else None)(
        shadow_of(server)), "every text compared")[0]
    assert (comparison["liveVersion"], comparison["shadowVersion"]) == ("1", "2")
    assert int(comparison["mirroredTexts"]) == len(texts) and not comparison.get("droppedTexts")
    # Offline: each version's own answer to the same texts, every label and the words' contributions.
    live = classify(api, server, texts, version=1, explain=True).results
    cand = classify(api, server, texts, version=2, explain=True).results
    agree, flips, diffs, rhos = 0, {}, [], []
    for a, b in zip(live, cand):
        la, lb = a.labels[0].label, b.labels[0].label
        agree += la == lb
        if la != lb:
            flips[(la, lb)] = flips.get((la, lb), 0) + 1
        score_b = {s.label: s.score for s in b.labels}[la]
        diffs.append(score_b - a.labels[0].score)
        k_a = [s.label for s in a.labels].index(la)
        k_b = [s.label for s in b.labels].index(la)
        rho = spearman([t.contribution[k_a] for t in a.tokens], [t.contribution[k_b] for t in b.tokens])
        if rho is not None:
            rhos.append(rho)
    assert 0 < agree < len(texts), "the retrained model should agree on most texts, not all"
    assert comparison["labelAgreement"] == pytest.approx(agree / len(texts), abs=1e-9)
    assert {(f["from"], f["to"]): int(f["texts"]) for f in comparison["flips"]} == flips
    assert comparison["meanScoreDifference"] == pytest.approx(np.mean(diffs), abs=1e-5)
    assert comparison["meanAbsScoreDifference"] == pytest.approx(np.mean(np.abs(diffs)), abs=1e-5)
    assert comparison["meanRankCorrelation"] == pytest.approx(np.mean(rhos), abs=1e-4)
    assert "meanLatencyDifferenceMs" in comparison
    # The texts that disagree most: flipped labels first, kept as they are (keep_texts), at most ten.
    worst = comparison["disagreements"]
    assert 0 < len(worst) <= 10 and all(d["text"] in texts and len(d["textSha256"]) == 64 for d in worst)
    assert all(d["liveLabel"] != d["shadowLabel"] for d in worst[:min(len(worst), len(texts) - agree)])
    # The same in GetModel and in Prometheus.
    pb, pbg = api
    model = pbg.InferenceStub(server.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")),
                                                        timeout=30)
    assert model.shadow[0].compared_texts == len(texts)
    assert model.shadow[0].label_agreement == pytest.approx(agree / len(texts))
    samples = server.metrics()
    pair = ('model="sentiment"', 'live_version="1"', 'shadow_version="2"')
    assert metric_sum(samples, "qvi_shadow_compared_texts_total", *pair) == len(texts)
    assert metric_sum(samples, "qvi_shadow_agreed_texts_total", *pair) == agree
    assert metric_sum(samples, "qvi_shadow_rank_correlation_count", *pair) == len(rhos)
    # qvi-client shadow prints the same comparison.
    client = os.environ.get("QVI_CLIENT", os.path.join(REPO, "build", "qvi-client"))
    printed = subprocess.run([client, "shadow", "--model", "sentiment", "--server", server.address],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "version 1 serving, version 2 its candidate" in printed.stdout
    assert f"compared {len(texts)}" in printed.stdout and f"label agreement {agree / len(texts):.3f}" in printed.stdout
    for (a, b), n in flips.items():
        assert f"{a} -> {b}: {n}" in printed.stdout, printed.stdout
    assert worst[0]["text"][:40] in printed.stdout


def test_the_texts_a_summary_keeps_are_masked_by_the_servers_tagger(api, store, tmp_path):
    """--redact-texts-with ner: a kept text is the caller's with the tagger's PER/LOC/ORG masked, as the Tag answer
    of the same text has them; never the text as it was."""
    work, path = store
    copy = os.path.join(tmp_path, "store")
    shutil.copytree(path, copy)
    os.makedirs(os.path.join(copy, "ner", "1"))
    shutil.copy(os.path.join(STORE, "ner", "1", "model.pt"), os.path.join(copy, "ner", "1"))
    with open(os.path.join(copy, "ner", "serving.json"), "w") as f:
        json.dump({"format": "torchscript"}, f)
    texts = [f"Tom Hanks in London : {t}" for t in corpus_texts(60)]
    with ServerProcess(copy, str(tmp_path), "--redact-texts-with", "ner", "--shadow-max-cpu-busy", "1") as proc:
        for i in range(0, len(texts), 10):
            classify(api, proc, texts[i:i + 10])
        pb, pbg = api
        tagged = pbg.InferenceStub(proc.channel).Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=texts),
                                                     timeout=60).results

        def masked_all():
            c = shadow_of(proc)
            if not c or int(c[0]["comparedTexts"]) < len(texts):
                return None
            kept = c[0]["disagreements"]
            return kept if kept and all(d.get("text") for d in kept) else None
        kept = wait_until(masked_all, "the kept texts masked")
    by_sha = {hashlib.sha256(t.encode()).hexdigest(): (t, r) for t, r in zip(texts, tagged)}
    for d in kept:
        text, answer = by_sha[d["textSha256"]]
        assert d["text"] == masked(text, answer.spans)
        assert "Tom Hanks" not in d["text"] and d["text"] != text


def test_under_overload_the_mirrored_work_is_dropped_and_every_caller_answered(api, store):
    work, path = store
    proc = ServerProcess(path, work, "--shadow-max-inflight-texts", "4", "--inference-threads", "1",
                         "--shadow-max-cpu-busy", "1", name="overloaded")
    try:
        texts = corpus_texts(200)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: classify(api, proc, texts[i:i + 5]), range(0, len(texts), 5)))
        assert all(len(a.results) == 5 and a.model.version == 1 for a in answers), "a caller lost its answer"

        def settled():
            c = shadow_of(proc)
            if not c:
                return None
            dropped = sum(int(v) for v in c[0].get("droppedTexts", {}).values())
            return c[0] if int(c[0]["comparedTexts"]) + dropped == len(texts) else None
        c = wait_until(settled, "every mirrored text compared or dropped")
        assert int(c["mirroredTexts"]) == len(texts)
        assert int(c["droppedTexts"]["busy"]) > 0, c
        assert metric_sum(proc.metrics(), "qvi_shadow_dropped_texts_total", 'reason="busy"') == \
            int(c["droppedTexts"]["busy"])
    finally:
        proc.stop()


def test_a_sample_that_finds_no_idle_cpu_is_dropped_and_counted(api, store):
    """--shadow-max-cpu-busy: a sample is mirrored only while the process's CPU time over the last 100 ms is below
    that share of its CPUs (bench/shadow_cost.py measures what that keeps of the callers' latency). At 0 no CPU is
    idle enough: every sampled text is dropped as "cpu", none is run, and the callers are answered as ever."""
    work, path = store
    with ServerProcess(path, work, "--shadow-max-cpu-busy", "0", name="no-headroom") as proc:
        texts = corpus_texts(30)
        ran = metric_sum(proc.metrics(), "qvi_batch_size_sum", 'version="2"')  # a warm-up's, if any
        answers = [classify(api, proc, texts[i:i + 10]) for i in range(0, len(texts), 10)]
        assert all(len(a.results) == 10 and a.model.version == 1 for a in answers)
        # A sample is taken after its caller's answer is sent: wait for the last one.
        c = wait_until(lambda: (lambda cs: cs[0] if cs and int(cs[0]["mirroredTexts"]) == len(texts) else None)(
            shadow_of(proc)), "every text sampled")
        assert int(c["droppedTexts"]["cpu"]) == len(texts), c
        assert int(c.get("comparedTexts", 0)) == 0, c
        assert metric_sum(proc.metrics(), "qvi_shadow_dropped_texts_total", 'reason="cpu"') == len(texts)
        assert metric_sum(proc.metrics(), "qvi_batch_size_sum", 'version="2"') == ran, "the candidate ran texts"


def test_an_admin_names_the_candidate_over_the_wire_and_promotes_it_by_removing_it(api, store, tmp_path):
    """PUT /v1/models/{m}/shadow (the admin scope) makes v2 the candidate at once — v1, the policy's other
    version, answers the callers and the texts are compared — and DELETE promotes v2 back to serving."""
    work, path = store
    copy = os.path.join(tmp_path, "store")
    shutil.copytree(path, copy)
    with open(os.path.join(copy, "sentiment", "serving.json"), "w") as f:
        json.dump({"format": "torchscript", "version_policy": "latest:2"}, f)
    with ServerProcess(copy, str(tmp_path), "--poll-store-seconds", "60", "--shadow-max-cpu-busy", "1") as proc:
        texts = corpus_texts(20)
        assert classify(api, proc, texts[:2]).model.version == 2  # no candidate: the newest serves
        for body, message in (({"fraction": 0.5}, "body: 'shadow.version' is missing"),
                              ({"version": 2, "fraction": 2}, "body: 'shadow.fraction' must be in (0, 1]")):
            status, answer, _ = http_call(proc.http_address, "PUT", "/v1/models/sentiment/shadow", body)
            assert status == 400 and message in answer["error"], answer
        status, answer, _ = http_call(proc.http_address, "PUT", "/v1/models/nope/shadow",
                                      {"version": 2, "fraction": 1.0})
        assert status == 404, answer
        status, answer, _ = http_call(proc.http_address, "PUT", "/v1/models/sentiment/shadow",
                                      {"version": 2, "fraction": 1.0})
        assert status == 200, answer
        assert classify(api, proc, texts).model.version == 1  # at once: v2 answers no caller now
        wait_until(lambda: (lambda c: c and int(c[0]["comparedTexts"]) == len(texts))(shadow_of(proc)),
                   "the texts compared")
        status, answer, _ = http_call(proc.http_address, "DELETE", "/v1/models/sentiment/shadow")
        assert status == 200 and answer["comparisons"][0]["shadowVersion"] == "2", answer
        assert classify(api, proc, texts[:2]).model.version == 2  # promoted
        status, _, headers = http_call(proc.http_address, "POST", "/v1/models/sentiment/shadow", {})
        assert status == 405 and headers["Allow"] == "GET, PUT, DELETE, OPTIONS", headers


def test_a_bad_shadow_setting_fails_the_model_naming_the_field(api, tmp_path):
    store = os.path.join(tmp_path, "store")
    os.makedirs(os.path.join(store, "sentiment", "1"))
    shutil.copy(os.path.join(STORE, "sentiment", "1", "model.pt"), os.path.join(store, "sentiment", "1"))
    for shadow, message in (({"fraction": 0.5}, "'shadow.version' is missing"),
                            ({"version": 2, "fraction": 0}, "'shadow.fraction' must be in (0, 1]"),
                            ({"version": 2, "fraction": 0.5, "texts": True}, "'shadow.texts' is not a shadow setting")):
        with open(os.path.join(store, "sentiment", "serving.json"), "w") as f:
            json.dump({"shadow": shadow}, f)
        with ServerProcess(store, str(tmp_path)) as proc:
            models = get_json(proc.http_address, "/v1/models")["models"]
            reason = models[0]["versions"][0].get("reason", "")
            assert message in reason, models
    # A model without a candidate: qvi-client shadow says so (exit 3).
    os.remove(os.path.join(store, "sentiment", "serving.json"))
    with ServerProcess(store, str(tmp_path)) as proc:
        client = os.environ.get("QVI_CLIENT", os.path.join(REPO, "build", "qvi-client"))
        printed = subprocess.run([client, "shadow", "--model", "sentiment", "--server", proc.address],
                                 capture_output=True, text=True, timeout=60)
        assert printed.returncode == 3 and "no shadow candidate" in printed.stdout, printed
