"""qvi-server called through a Python client generated from the same proto: its answers equal the
Python model's own outputs on the same texts; errors, health and reflection answer."""
import json
import os
import re

import grpc
import pytest
import torch

from qvi_testing import REPO, STORE, ServerProcess
from qvi import artifact
from qvi.metrics import chunks
from qvi.tokenizer import config_from_json, encode

torch.set_num_threads(1)


def corpus_texts(name, n):
    tsv = name in ("sentiment", "bbc")
    path = os.path.join(REPO, "model_store", "data", name, "test.tsv" if tsv else "test.conll")
    if tsv:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n").split("\t", 1)[1] for line in f][:n]
    from qvi.data import read_conll
    return [e.text for e in read_conll(path)][:n]


def card_temperature(manifest):
    """The temperature the server answers a model's scores at (its card's calibration; 1 without one)."""
    return manifest.get("model_card", {}).get("calibration", {}).get("temperature", 1.0)


def python_outputs(model_name, texts, store=STORE):
    module, manifest, vocab = artifact.load(os.path.join(store, model_name, "1", "model.pt"))
    cfg = config_from_json(manifest["tokenizer"])
    encs = [encode(t, cfg, vocab) for t in texts]
    width = max(1, max(len(e.ids) for e in encs))
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.bool)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        mask[i, : len(e.ids)] = True
    with torch.no_grad():
        return manifest, encs, module(ids, mask)


EXTRA = ["北京 and café, 👨‍👩‍👧 emoji!", "  Ünïcödé   text\twith\ttabs  ", "x" * 500]


def test_classify_equals_the_python_model(server, api):
    pb, pb_grpc = api
    texts = corpus_texts("sentiment", 24) + EXTRA
    req = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                             options=pb.OutputOptions(top_k=2, attention=True, gates=True))
    resp = pb_grpc.InferenceStub(server).Classify(req, timeout=60)
    manifest, encs, out = python_outputs("sentiment", texts)
    probs = (out["logits"] / card_temperature(manifest)).softmax(-1)
    assert resp.model.version == 1 and len(resp.results) == len(texts)
    for i, (res, enc) in enumerate(zip(resp.results, encs)):
        best = int(probs[i].argmax())
        assert res.labels[0].label == manifest["labels"][best], texts[i]
        for ls in res.labels:
            assert abs(ls.score - float(probs[i][manifest["labels"].index(ls.label)])) < 1e-4
        assert [(t.text, t.start, t.end) for t in res.tokens] == [(t.text, t.start, t.end) for t in enc.tokens]
        for j, tok in enumerate(res.tokens):
            assert texts[i][tok.start:tok.end] == tok.text
            assert abs(tok.attention - float(out["attention"][i, j])) < 1e-4
            assert abs(tok.gate - float(out["gates"][i, j])) < 1e-4
        assert abs(sum(t.attention for t in res.tokens) - 1.0) < 1e-4


def test_tag_equals_the_python_model(server, api):
    pb, pb_grpc = api
    texts = corpus_texts("conll2003", 30) + EXTRA[:2]
    resp = pb_grpc.InferenceStub(server).Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=texts), timeout=60)
    manifest, encs, out = python_outputs("ner", texts)
    found = 0
    for i, (res, enc) in enumerate(zip(resp.results, encs)):
        n = len(enc.ids)
        tags = [manifest["tags"][int(t)] for t in out["tags"][i, :n]]
        assert [t.tag for t in res.tokens] == tags
        want = sorted((enc.tokens[s].start, enc.tokens[e - 1].end, kind) for s, e, kind in chunks(tags))
        got = sorted((s.start, s.end, s.label) for s in res.spans)
        assert got == want, texts[i]
        for s in res.spans:
            assert texts[i][s.start:s.end] == s.text and 0 <= s.score <= 1
        found += len(res.spans)
    assert found > 0, "the demo tagger should find some entity in 30 test sentences"


def test_scores_are_calibrated_by_the_card_and_raw_on_request(server, api):
    """Issue 77: a model whose card carries a calibration answers softmax(logits / T), and the raw
    softmax with options.raw_scores; a tagger's entity has one confidence, its mean CRF marginal at T,
    which options.occlusion's probability repeats."""
    from types import SimpleNamespace
    from qvi.faithfulness import crf_marginals
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    texts = corpus_texts("sentiment", 12)
    manifest, _, out = python_outputs("sentiment", texts)
    t = card_temperature(manifest)
    assert t != 1.0, "the demo sentiment card carries a fitted temperature (python -m qvi demo)"
    for raw, temperature in ((False, t), (True, 1.0)):
        resp = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                                                options=pb.OutputOptions(top_k=2, raw_scores=raw)), timeout=60)
        probs = (out["logits"] / temperature).softmax(-1)
        for i, res in enumerate(resp.results):
            for ls in res.labels:
                assert abs(ls.score - float(probs[i][manifest["labels"].index(ls.label)])) < 1e-4, (raw, texts[i])

    texts = corpus_texts("conll2003", 20)
    module, manifest, _ = artifact.load(os.path.join(STORE, "ner", "1", "model.pt"))
    _, encs, out = python_outputs("ner", texts)
    t = card_temperature(manifest)
    assert t != 1.0, "the demo tagger's card carries a fitted temperature"
    mask = torch.zeros(out["emissions"].shape[:2], dtype=torch.bool)
    for i, e in enumerate(encs):
        mask[i, : len(e.ids)] = True
    for raw, temperature in ((False, t), (True, 1.0)):
        crf = SimpleNamespace(**{k: getattr(module.crf, k).detach().double() / temperature
                                 for k in ("start", "end", "trans")})
        marginals = crf_marginals(crf, out["emissions"].double() / temperature, mask)
        resp = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=texts,
                                      options=pb.OutputOptions(occlusion=True, raw_scores=raw)), timeout=120)
        spans = 0
        for i, res in enumerate(resp.results):
            for s in res.spans:
                tags = [int(x) for x in out["tags"][i, s.token_start:s.token_end]]
                want = sum(float(marginals[i, s.token_start + j, tag]) for j, tag in enumerate(tags)) / len(tags)
                assert abs(s.score - want) < 1e-5, (raw, texts[i], s.text)
                assert s.probability == s.score, "one confidence per entity"
                spans += 1
        assert spans > 10


def test_label_sets_and_abstention_follow_the_card_on_grpc_and_http(server_process, api):
    """options.coverage answers the labels whose calibrated probability reaches the card's threshold;
    options.abstain_below marks answers (texts, entities) below it, and /metrics counts them; bad options
    are refused naming the field, before the model runs."""
    from qvi_testing import http_call, metric_sum, post_json, wait_until
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server_process.channel)
    card = artifact.load(os.path.join(STORE, "topics", "1", "model.pt"))[1]["model_card"]["calibration"]
    level = card["conformal"][0]
    texts = corpus_texts("bbc", 30)
    before = server_process.metrics()
    resp = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="topics"), texts=texts, options=pb.OutputOptions(
        top_k=5, coverage=level["coverage_target"], abstain_below=0.9)), timeout=60)
    abstained = 0
    for res in resp.results:
        want = [ls.label for ls in res.labels if ls.score >= level["min_probability"]]
        assert list(res.label_set.labels) == want and res.label_set.coverage == level["coverage_target"]
        assert res.label_set.min_probability == pytest.approx(level["min_probability"])
        assert res.abstained == (res.labels[0].score < 0.9)
        abstained += res.abstained
    # A gRPC call is counted once it is done (OnDone), which may be just after its client has the answer.
    def counted():
        after = server_process.metrics()
        return tuple(metric_sum(after, name, 'model="topics"') - metric_sum(before, name, 'model="topics"')
                     for name in ("qvi_abstention_judged_total", "qvi_abstained_total"))

    wait_until(lambda: counted()[0] >= len(texts), "the call's abstention counts", seconds=30)
    assert counted() == (len(texts), abstained)

    tagged = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=corpus_texts("conll2003", 20),
                                    options=pb.OutputOptions(abstain_below=0.95)), timeout=60)
    spans = [s for r in tagged.results for s in r.spans]
    assert spans and all(s.abstained == (s.score < 0.95) for s in spans) and any(s.abstained for s in spans)

    answer = post_json(server_process.http_address, "/v1/models/topics:classify",
                       {"texts": texts[:2], "options": {"coverage": level["coverage_target"], "abstain_below": 0.5}})
    for res, grpc_res in zip(answer["results"], resp.results[:2]):
        assert res["labelSet"]["labels"] == list(grpc_res.label_set.labels)

    for options, code, message in (
            (pb.OutputOptions(coverage=1.5), grpc.StatusCode.INVALID_ARGUMENT, "options.coverage: 1.5 is outside (0, 1)"),
            (pb.OutputOptions(coverage=0.8), grpc.StatusCode.INVALID_ARGUMENT,
             "options.coverage: 0.8 is not a level model 'topics' was calibrated for (0.9, 0.95)"),
            (pb.OutputOptions(abstain_below=2), grpc.StatusCode.INVALID_ARGUMENT,
             "options.abstain_below: 2 is outside [0, 1]"),
            (pb.OutputOptions(abstain_below=0.5, raw_scores=True), grpc.StatusCode.INVALID_ARGUMENT,
             "options.abstain_below: reads calibrated probabilities; not with options.raw_scores")):
        with pytest.raises(grpc.RpcError) as e:
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="topics"), texts=["x"], options=options),
                          timeout=30)
        assert e.value.code() == code and e.value.details() == message
    status, body, _ = http_call(server_process.http_address, "POST", "/v1/models/ner:tag",
                                {"texts": ["Anna"], "options": {"coverage": 0.9}}, {"Content-Type": "application/json"})
    assert status == 400 and "options.coverage: label sets are for Classify; model 'ner' tags" in json.dumps(body)


def test_a_cased_model_gets_the_ids_the_zoo_gives_it(api, tmp_path):
    """Tokenizer rule 7 on both sides: a tagger whose manifest folds case classes into the ids is fed
    by the server exactly the ids the zoo's encoder makes (word id + vocabulary size x case class),
    and tags as the zoo's model does."""
    from qvi.models import ModelConfig, build_model
    from qvi.tokenizer import TokenizerConfig, Vocabulary
    pb, pb_grpc = api
    torch.manual_seed(3)
    vocab = Vocabulary(["[PAD]", "[UNK]", "paris", "is", "in", "france", "the", "eu", "iphone"])
    cfg = ModelConfig("cnn_transformer_crf", len(vocab), 5, emb_dim=8, hidden=8, heads=2, ffn=16, case_dim=4)
    model = build_model(cfg).eval()
    with torch.no_grad():
        model.crf.trans.normal_(0, 1)
    tags = ["O", "B-LOC", "B-MISC", "I-LOC", "I-MISC"]
    manifest = artifact.build_manifest("cased", cfg, TokenizerConfig(casing=True), vocab, tags, "BIO", {})
    artifact.export(model, manifest, vocab, str(tmp_path / "store"), 1)
    proc = ServerProcess(str(tmp_path / "store"), str(tmp_path))
    try:
        texts = ["Paris is in France", "PARIS paris Paris pARIS", "the EU and the iPhone 3 EU"]
        resp = pb_grpc.InferenceStub(proc.channel).Tag(pb.TagRequest(model=pb.ModelSpec(name="cased"), texts=texts),
                                                        timeout=60)
        _, encs, out = python_outputs("cased", texts, str(tmp_path / "store"))
        assert [t.id for t in resp.results[1].tokens] == [2 + 9 * 3, 2 + 9 * 1, 2 + 9 * 2, 2 + 9 * 4]
        for i, (res, enc) in enumerate(zip(resp.results, encs)):
            assert [t.id for t in res.tokens] == enc.ids, texts[i]
            assert [t.tag for t in res.tokens] == [tags[int(k)] for k in out["tags"][i, :len(enc.ids)]], texts[i]
        # Its card has no faithfulness figures: GetModel says so rather than leaving them blank.
        info = pb_grpc.InferenceStub(proc.channel).GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="cased")),
                                                             timeout=30)
        f = info.model.versions[0].metadata.faithfulness
        assert not f.measured and f.note.startswith("not measured") and not f.methods
    finally:
        proc.stop()


def code_of(call):
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def test_errors(server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="missing"), texts=["x"])))
    assert c == grpc.StatusCode.NOT_FOUND and "models: inconsistent, misconfigured, ner, sentiment, topics" in msg
    c, msg = code_of(lambda: stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner", version=3), texts=["x"])))
    assert c == grpc.StatusCode.UNAVAILABLE and "FAILED" in msg
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"))))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("texts: empty")
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="ner"), texts=["x"])))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "call Tag" in msg
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["a" * 70000])))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "limit of 65536 bytes" in msg
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["x"],
                                                              options=pb.OutputOptions(top_k=-1))))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "options.top_k" in msg


def test_a_broken_model_fails_only_its_own_requests(server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    c, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="inconsistent"), texts=["a b"])))
    assert c == grpc.StatusCode.UNAVAILABLE and "returned logits of shape [2,2]" in msg, msg
    ok = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"]), timeout=30)
    assert len(ok.results) == 1


def test_discovery(server, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    models = {m.name: m for m in stub.ListModels(pb.ListModelsRequest()).models}
    assert set(models) == {"inconsistent", "misconfigured", "ner", "sentiment", "topics"}
    bad = models["misconfigured"].versions[0]
    assert bad.state == pb.MODEL_STATE_FAILED and "'max_batch_szie' is not a serving setting" in bad.reason
    ner = models["ner"]
    assert [(v.version, v.state) for v in ner.versions] == [(3, pb.MODEL_STATE_FAILED), (1, pb.MODEL_STATE_READY)]
    md = ner.versions[1].metadata
    assert md.task == "tagging" and md.tag_scheme == "BIO" and set(md.entity_types) == {"LOC", "MISC", "ORG", "PER"}
    assert {o.name for o in md.outputs} >= {"attention", "gates", "layer_gates", "layer_attention"}
    assert json.loads(md.model_card_json)["metrics"]["test"]["f1"] >= 0
    one = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment", version=1))).model
    assert [v.version for v in one.versions] == [1]


def test_get_model_carries_the_cards_faithfulness_figures(server, api):
    """Typed, equal to the card's figures, for each demo model; "not measured" for a card without."""
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    for name in ("ner", "sentiment", "topics"):
        md = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name, version=1))).model.versions[0].metadata
        card = json.loads(md.model_card_json)["faithfulness"]
        f = md.faithfulness
        assert f.measured and not f.note, name
        assert (f.split, f.answers, f.texts, f.removal, f.target, list(f.ks)) == (
            card["split"], card["answers"], card["texts"], card["removal"], card["target"], card["ks"])
        assert [m.method for m in f.methods] == [m["method"] for m in card["methods"]]
        assert f.methods[0].method == "random" and not f.methods[0].HasField("vs_random")
        for got, want in zip(f.methods, card["methods"]):
            assert got.name == want["name"]
            for key in ("comprehensiveness", "sufficiency", "normalised_comprehensiveness", "loo_spearman"):
                if key in want:
                    e = getattr(got, key)
                    assert (e.mean, e.low, e.high) == (want[key]["mean"], want[key]["low"], want[key]["high"])
                else:
                    assert not got.HasField(key)
            if "vs_random" in want:
                assert got.vs_random.mean == want["vs_random"]["mean"] and got.vs_random_p == want["vs_random"]["p"]
            # issue 54: each method's cost, typed (a card without costs would have none)
            c = want["cost"]
            assert (got.cost.ms_per_text_batch_1, got.cost.ms_per_text_batch_32, got.cost.extra_forwards_per_text) == (
                c["ms_per_text_batch_1"], c["ms_per_text_batch_32"], c["extra_forwards_per_text"]), (name, got.method)
        assert f.cost_machine == card["cost_machine"] and f.cost_machine.startswith("x86_64"), name
        by = {m.method: m for m in f.methods}
        # the served methods are on every demo card, measured through the exported model
        assert "occlusion" in by and by["occlusion"].cost.extra_forwards_per_text > 1, name
        assert by["alpha"].cost.extra_forwards_per_text == 0 and by["alpha"].cost.ms_per_text_batch_1 > 0, name
        if md.task == "classification":
            assert by["contribution"].cost.extra_forwards_per_text == 0, name
        if md.task == "classification":  # issue 31's target: α significantly above random
            assert by["alpha"].comprehensiveness.low > by["random"].comprehensiveness.high, name


def test_health_and_reflection(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
    health = health_pb2_grpc.HealthStub(server)
    for service in ("", "sentiment", "ner"):  # ner serves v1 although its v3 failed to load
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
    # A model none of whose versions loaded is NOT_SERVING; the others are untouched (above).
    status = health.Check(health_pb2.HealthCheckRequest(service="misconfigured")).status
    assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    # A name that is no model at all is NOT_FOUND, as the health protocol asks.
    with pytest.raises(grpc.RpcError) as unknown:
        health.Check(health_pb2.HealthCheckRequest(service="unknown-model"))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    db = ProtoReflectionDescriptorDatabase(server)
    services = set(db.get_services())
    assert {"qvi.serving.v1.Inference", "grpc.health.v1.Health"} <= services
    method = db.FindFileContainingSymbol("qvi.serving.v1.Inference")
    assert method.package == "qvi.serving.v1"
    assert "grpc.reflection.v1.ServerReflection" in services


def test_reflection_answers_both_versions_on_one_stream_and_goes_on_after_not_found(server):
    """The server's own reflection (reflection_service.h) on grpc.reflection.v1 (which newer grpcurl
    asks first) and v1alpha: the two share their messages' layout, so v1alpha's Python classes read
    both. A file comes with its dependencies once a stream; a name that is nothing is an error
    answer, and the stream goes on."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2 as r
    for version in ("v1", "v1alpha"):
        info = server.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                    request_serializer=r.ServerReflectionRequest.SerializeToString,
                                    response_deserializer=r.ServerReflectionResponse.FromString)
        requests = [r.ServerReflectionRequest(host="h", list_services=""),
                    r.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService.ModelInfer"),
                    r.ServerReflectionRequest(file_containing_symbol="no.such.Symbol" + "x" * 200),
                    r.ServerReflectionRequest(file_by_filename="qvi/serving/v1/inference.proto"),
                    r.ServerReflectionRequest(file_by_filename="qvi/serving/v1/inference.proto"),
                    r.ServerReflectionRequest(all_extension_numbers_of_type="qvi.serving.v1.ModelSpec")]
        answers = list(info(iter(requests), timeout=30))
        assert len(answers) == len(requests)
        assert answers[0].valid_host == "h" and answers[0].original_request == requests[0]
        assert {s.name for s in answers[0].list_services_response.service} == {
            "qvi.serving.v1.Inference", "inference.GRPCInferenceService", "tei.v1.Info", "tei.v1.Predict",
            "tei.v1.Tokenize", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"}
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in answers[1].file_descriptor_response.file_descriptor_proto]
        assert files[0].name == "inference/open_inference_grpc.proto"
        assert answers[2].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert "x" * 65 not in answers[2].error_response.error_message  # names echoed to 64 bytes
        first = [descriptor_pb2.FileDescriptorProto.FromString(b).name
                 for b in answers[3].file_descriptor_response.file_descriptor_proto]
        again = [descriptor_pb2.FileDescriptorProto.FromString(b).name
                 for b in answers[4].file_descriptor_response.file_descriptor_proto]
        assert first[0] == "qvi/serving/v1/inference.proto" and again == first[:1], (first, again)
        assert answers[5].all_extension_numbers_response.base_type_name == "qvi.serving.v1.ModelSpec"


def test_concurrent_requests_share_batches_invisibly(server, api):
    """64 requests from 16 threads, with random texts and mixed options, so that texts of different
    callers and with different options share batches: every answer is still the model's own."""
    import random
    from concurrent.futures import ThreadPoolExecutor
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    pool_texts = corpus_texts("sentiment", 40)
    manifest, encs, out = python_outputs("sentiment", pool_texts)
    probs = (out["logits"] / card_temperature(manifest)).softmax(-1)
    rng = random.Random(7)
    jobs = [(rng.sample(range(len(pool_texts)), rng.randint(1, 5)), rng.random() < 0.5) for _ in range(64)]

    def call(job):
        picks, explain = job
        req = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[pool_texts[i] for i in picks],
                                 options=pb.OutputOptions(top_k=2, attention=explain))
        return picks, explain, stub.Classify(req, timeout=60)

    with ThreadPoolExecutor(16) as ex:
        answers = list(ex.map(call, jobs))
    assert len(answers) == 64
    for picks, explain, resp in answers:
        assert len(resp.results) == len(picks)
        for i, res in zip(picks, resp.results):
            for ls in res.labels:
                assert abs(ls.score - float(probs[i][manifest["labels"].index(ls.label)])) < 1e-4
            assert len(res.tokens) == (len(encs[i].ids) if explain else 0)
            for j, tok in enumerate(res.tokens):
                assert abs(tok.attention - float(out["attention"][i, j])) < 1e-4


def test_the_access_log_is_off_by_default(server_process, api):
    """The session's server runs without --access-log: its requests leave no access lines."""
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server_process.channel)
    stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"], request_id="quiet-1"),
                  timeout=30)
    log = server_process.log()
    assert "serving qvi.serving.v1.Inference" in log  # the log is there, and it is this server's
    assert "quiet-1" not in log and "request_id" not in log, log


def _instances(proc, api):
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(proc.channel)
    return stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="sentiment")), timeout=30).model.versions[0].metadata.batching.instances


@pytest.mark.parametrize("cpus,flags,expected", [
    ("one", (), 1),                                   # taskset to one CPU: one instance
    ("all", (), None),                                # every CPU it may use, up to 8
    ("one", ("--instances-per-model", "3"), 3),       # the flag wins over the CPUs
])
def test_instances_follow_the_cpus_the_server_may_use(api, tmp_path, cpus, flags, expected):
    mine = sorted(os.sched_getaffinity(0))
    allowed = {mine[0]} if cpus == "one" else set(mine)
    proc = ServerProcess(os.path.join(STORE), str(tmp_path), *flags, cpus=allowed)
    try:
        log = proc.log()
        if flags:
            assert _instances(proc, api) == expected
            return
        usable = re.search(r"(\d+) usable CPU\(s\) \((\d+) CPU\(s\) in the affinity mask", log)
        assert usable, log
        assert int(usable.group(2)) == len(allowed)
        # A cgroup CPU limit, where the tests run under one, may lower it below the mask.
        assert 1 <= int(usable.group(1)) <= len(allowed)
        want = expected if expected is not None else min(int(usable.group(1)), 8)
        assert _instances(proc, api) == want
        assert f"models on the CPU: {want} instance(s) per model" in log
    finally:
        proc.stop()


def test_the_faithfulness_check_deletes_alphas_top_tokens_and_runs_the_rest_again(server, api):
    """options.faithfulness: the answer's top label's probability with α's top-k tokens deleted, from a
    second forward in the same batch step, equals the zoo's model run on the same ids without them."""
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(server)
    texts = corpus_texts("sentiment", 12) + ["Great.", "a b"]
    options = pb.OutputOptions(attention=True, faithfulness=pb.FaithfulnessOptions(top_k=3))
    resp = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts, options=options),
                         timeout=60)
    module, manifest, _ = artifact.load(os.path.join(STORE, "sentiment", "1", "model.pt"))
    for text, res in zip(texts, resp.results):
        f = res.faithfulness
        alphas = [t.attention for t in res.tokens]
        n = len(alphas)
        assert list(f.removed) == sorted(f.removed) and len(f.removed) == min(3, n), text
        top = sorted(range(n), key=lambda i: -alphas[i])[:len(f.removed)]
        assert sorted(top) == list(f.removed), (text, alphas)  # α's top tokens (no ties in these texts)
        assert f.label == res.labels[0].label and abs(f.score - res.labels[0].score) < 1e-6
        kept = [t.id for i, t in enumerate(res.tokens) if i not in set(f.removed)]
        ids = torch.tensor([kept or [0]], dtype=torch.long)
        mask = torch.tensor([[bool(kept)] * max(1, len(kept))])
        with torch.no_grad():
            p = torch.softmax(module(ids, mask)["logits"][0] / card_temperature(manifest), -1)[
                manifest["labels"].index(f.label)]
        assert abs(f.score_without - float(p)) < 1e-4, text
    # texts that did not ask get no check; the default path stays as it was
    plain = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts[:2]), timeout=60)
    assert not any(r.HasField("faithfulness") for r in plain.results)
    for bad, message in ((pb.FaithfulnessOptions(top_k=-1), "options.faithfulness.top_k: -1 is outside [0, 32]"),
                         (pb.FaithfulnessOptions(top_k=33), "options.faithfulness.top_k: 33 is outside [0, 32]")):
        code, msg = code_of(lambda: stub.Classify(pb.ClassifyRequest(
            model=pb.ModelSpec(name="sentiment"), texts=["x"], options=pb.OutputOptions(faithfulness=bad)), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in msg, msg
    code, msg = code_of(lambda: stub.Tag(pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=["Anna"], options=pb.OutputOptions(
        faithfulness=pb.FaithfulnessOptions(top_k=2))), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "options.faithfulness: the check is for Classify" in msg, msg
