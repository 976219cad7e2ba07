"""`python -m qvi import`, end to end: small random BERT, DistilBERT, RoBERTa and XLM-R sequence and token classifiers
made with `transformers` and saved with save_pretrained (no download), imported, served, and answered over gRPC,
the Open Inference Protocol (tritonclient) and HTTP with what `transformers` computes for the same texts.

BERT and DistilBERT read MiniLM's WordPiece tokenizer.json (the pinned package set-up extracts); RoBERTa a
byte-level BPE the test trains with `tokenizers` on the sentiment corpus; XLM-R a SentencePiece model trained with
`sentencepiece` and converted as XLM-R's is (its rules as the Precompiled normalizer). The answers are per word (the
pre-tokenizer's pieces, model_store's `word_ids`), with the sub-word view on request."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zlib

import grpc
import numpy as np
import pytest

from conftest import oip_calls
from selenium.webdriver.common.keys import Keys
from test_explain_page import ask, browser, open_page  # noqa: F401 (browser: the page tests' fixture)
from test_hf_tokenizer import sentencepiece_converted
from qvi_testing import (REPO, ServerProcess, http_call, metric_sum, post_json, tei_schema_errors, tei_stubs,
                         wait_until)

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

DATA = os.path.join(REPO, "model_store", "data")
MINILM = os.path.join(REPO, "model_store", "pretrained", "all-minilm-l6-v2", "tokenizer.json")
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
LABELS = ["negative", "neutral", "positive"]
PT2_CACHE = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2-tests"))
HOSTILE = ["Café CAFÉ café naïve", "東京は日本の首都です。", "👩🏽‍💻 at work, 🇯🇵!", "don't can't O'Neil e-mail",
           "[MASK] and [CLS] literal", "a <pad> b [PAD] c <s> d", "unbelievably " * 60, "x" * 300,
           "Zalgo: H\u0335\u0321e\u0338\u0327llo"]


def corpus_texts(n):
    out = []
    for line in open(os.path.join(DATA, "sentiment", "test.tsv"), encoding="utf-8"):
        out.append(line.rstrip("\n").split("\t", 1)[1])
        if len(out) >= n:
            break
    return out


def train_texts():
    return [line.rstrip("\n").split("\t", 1)[1] for line in open(os.path.join(DATA, "sentiment", "train.tsv"),
                                                                 encoding="utf-8")]


def roberta_tokenizer():
    texts = train_texts()[:6000]
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<s>", "<pad>", "</s>", "<unk>",
                                                                                    "<mask>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
    return t


def build(family, task, tokenizer):
    t = transformers
    n = len(LABELS) if task == "seq" else len(TAGS)
    labels = LABELS if task == "seq" else TAGS
    common = dict(num_labels=n, id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)})
    vocab = tokenizer.get_vocab_size()
    if family == "bert":
        config = t.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=48, max_position_embeddings=128, **common)
        cls = t.BertForSequenceClassification if task == "seq" else t.BertForTokenClassification
    elif family == "distilbert":
        config = t.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                    max_position_embeddings=128, **common)
        cls = t.DistilBertForSequenceClassification if task == "seq" else t.DistilBertForTokenClassification
    elif family == "roberta":
        config = t.RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=48, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                                 bos_token_id=0, eos_token_id=2, **common)
        cls = t.RobertaForSequenceClassification if task == "seq" else t.RobertaForTokenClassification
    else:
        config = t.XLMRobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=48, max_position_embeddings=130, type_vocab_size=1,
                                    pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
        cls = t.XLMRobertaForSequenceClassification if task == "seq" else t.XLMRobertaForTokenClassification
    torch.manual_seed(zlib.crc32(f"{family}_{task}".encode()))
    return cls._from_config(config, attn_implementation="eager").eval()  # its maps, for α


def qvi_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "model_store"), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "qvi", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def imported():
    """Eight models imported into one store and served; {name: (hf model, tokenizer, task)}."""
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="qvi_hf_import_")
    store = os.path.join(work, "store")
    wordpiece, bpe = Tokenizer.from_file(MINILM), roberta_tokenizer()
    wordpiece.no_padding()  # MiniLM's file pads to 128; the server reads each text as it is (the file's padding
    # is not applied), and so does the reference here
    spm = sentencepiece_converted(train_texts(), work)  # as XLM-R's: SentencePiece rules (Precompiled)
    models_ = {}
    for family in ("bert", "distilbert", "roberta", "xlmr"):
        tokenizer = {"roberta": bpe, "xlmr": spm}.get(family, wordpiece)
        for task in ("seq", "tok"):
            name = f"{family}_{task}"
            folder = os.path.join(work, name)
            model = build(family, task, tokenizer)
            model.save_pretrained(folder)
            tokenizer.save(os.path.join(folder, "tokenizer.json"))
            # One of them also as an AOTInductor package, which the server prefers (compiled once, then
            # reused from the zoo tests' package cache).
            formats = ["--format", "both", "--pt2-cache", PT2_CACHE, "--cpu-freezing", "off"] \
                if name == "distilbert_seq" else ["--format", "torchscript"]
            out = qvi_cli("import", "--from", folder, "--store", store, "--name", name, *formats)
            assert out.returncode == 0, out.stderr
            models_[name] = (model, tokenizer, task)
    proc = ServerProcess(store, work)
    yield proc, models_
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def reference(model, tokenizer, text, max_tokens=128):
    """transformers' logits of `text` [T, C] or [C], its encoding, and the last layer's attention."""
    tokenizer.enable_truncation(max_tokens)
    enc = tokenizer.encode(text)
    ids = torch.tensor([enc.ids])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_attentions=True)
    return out.logits[0], enc, out.attentions[-1][0]


def first_subwords(enc):
    """Each word's first position, in order (the server's words are the pre-tokenizer's pieces)."""
    first = {}
    for position, word in enumerate(enc.word_ids):
        if word is not None and word not in first:
            first[word] = position
    return [first[w] for w in sorted(first)]


def test_classifiers_answer_what_transformers_computes_within_1e_4(api, imported):
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    formats = {name: stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name=name)), timeout=30)
               .model.versions[0].metadata.format for name in ("bert_seq", "distilbert_seq")}
    assert formats == {"bert_seq": "torchscript", "distilbert_seq": "pt2"}, formats
    texts = corpus_texts(200) + HOSTILE
    for name in ("bert_seq", "distilbert_seq", "roberta_seq", "xlmr_seq"):
        model, tokenizer, _ = models_[name]
        answer = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name=name), texts=texts,
                                                  options=pb.OutputOptions(top_k=3, attention=True)), timeout=120)
        for text, result in zip(texts, answer.results):
            logits, enc, attention = reference(model, tokenizer, text)
            want = torch.softmax(logits, -1).numpy()
            got = {score.label: score.score for score in result.labels}
            assert np.allclose([got[label] for label in LABELS], want, atol=1e-4), (name, text)
            words = first_subwords(enc)
            assert len(result.tokens) == len(words), (name, text)
            # α of a word: the last layer's row of the first position, averaged over heads, summed over the word.
            cls_row = attention[:, 0, :].mean(0).numpy()
            for token, w in zip(result.tokens, sorted(set(x for x in enc.word_ids if x is not None))):
                positions = [p for p, x in enumerate(enc.word_ids) if x == w]
                assert token.attention == pytest.approx(float(cls_row[positions].sum()), abs=1e-5)
                # Words are whole pieces of the caller's text, in code points.
                assert token.text == text[token.start:token.end]
            tokenizer.no_truncation()
            assert result.truncated == (len(tokenizer.encode(text).ids) > 128), (name, text)


def test_taggers_tag_each_word_with_its_first_subwords_tag_and_spans_slice_the_text(api, imported):
    """Each word's tag is its first sub-word's; words and entity spans slice the text, without the whitespace a
    SentencePiece piece's offsets take in (server/core/serving/subwords.cc)."""
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    texts = corpus_texts(200) + HOSTILE + ["", "   "]  # Tag answers a text without words with none
    for name in ("bert_tok", "distilbert_tok", "roberta_tok", "xlmr_tok"):
        model, tokenizer, _ = models_[name]
        answer = stub.Tag(pb.TagRequest(model=pb.ModelSpec(name=name), texts=texts), timeout=120)
        for text, result in zip(texts, answer.results):
            logits, enc, _ = reference(model, tokenizer, text)
            want = [TAGS[int(logits[p].argmax())] for p in first_subwords(enc)]
            assert [t.tag for t in result.tokens] == want, (name, text)
            for t in result.tokens:  # a word, not the space a SentencePiece piece ("▁German") spans before it
                assert t.text == text[t.start:t.end] and (t.text == t.text.strip() or not t.text.strip()), (name, t)
            for span in result.spans:
                assert span.text == text[span.start:span.end]
                assert span.start == result.tokens[span.token_start].start
                assert span.end == result.tokens[span.token_end - 1].end


def test_the_subword_view_shows_what_the_model_read_and_adds_up_to_the_words(api, imported):
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    text = "Unbelievably charming, if overlong."
    for name in ("bert_seq", "roberta_seq"):
        _, tokenizer, _ = models_[name]
        request = dict(model=pb.ModelSpec(name=name), texts=[text])
        words = stub.Classify(pb.ClassifyRequest(**request, options=pb.OutputOptions(attention=True)), timeout=60)
        subs = stub.Classify(pb.ClassifyRequest(**request, options=pb.OutputOptions(attention=True, subwords=True)),
                             timeout=60)
        tokenizer.enable_truncation(128)
        enc = tokenizer.encode(text)
        got = subs.results[0].tokens
        assert [t.id for t in got] == enc.ids
        assert [t.word for t in got] == [-1 if w is None else w for w in enc.word_ids]
        for w, word in enumerate(words.results[0].tokens):
            assert not word.HasField("word")
            mine = [t.attention for t in got if t.word == w]
            assert word.attention == pytest.approx(sum(mine), abs=1e-6)
        assert subs.results[0].labels[0].label == words.results[0].labels[0].label


def test_oip_and_http_answer_as_grpc_does(api, imported, interop_python):
    pb, pbg = api
    proc, models_ = imported
    texts = corpus_texts(5)
    native = pbg.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="distilbert_seq"), texts=texts, options=pb.OutputOptions(top_k=3)),
        timeout=60)
    (oip, subwords) = oip_calls(interop_python, proc.address, [
        {"client": "triton", "rpc": "infer", "model": "distilbert_seq", "texts": texts,
         "outputs": [{"name": "probabilities"}, {"name": "tokens"}, {"name": "token_count"}]},
        {"client": "triton", "rpc": "infer", "model": "distilbert_seq", "texts": texts[:1],
         "outputs": [{"name": "tokens"}, {"name": "token_count"}, {"name": "word_index"}],
         "parameters": {"subwords": True}}])
    assert oip["ok"] and subwords["ok"], (oip, subwords)
    probabilities = oip["value"]["outputs"]["probabilities"]["data"]
    for row, result in zip(probabilities, native.results):
        got = {s.label: s.score for s in result.labels}
        assert np.allclose(row, [got[label] for label in LABELS], atol=1e-6)
    words = [w for w in oip["value"]["outputs"]["tokens"]["data"][0] if w]
    assert words == [t.text for t in pbg.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="distilbert_seq"), texts=texts[:1],
                           options=pb.OutputOptions(tokens=True)), timeout=60).results[0].tokens]
    # token_count: how many of a row's tokens are the text's -- its words, or in the sub-word view every position.
    counts = oip["value"]["outputs"]["token_count"]["data"]
    assert counts[0] == len(words)
    _, tokenizer, _ = models_["distilbert_seq"]
    tokenizer.enable_truncation(128)
    (n,) = subwords["value"]["outputs"]["token_count"]["data"]
    sub = subwords["value"]["outputs"]["tokens"]["data"][0][:n]
    enc = tokenizer.encode(texts[0])
    assert n == len(enc.ids) and sub[0] == "" and sub[-1] == ""  # [CLS], [SEP]: no text
    assert subwords["value"]["outputs"]["word_index"]["data"][0][:n] == [-1 if w is None else w for w in enc.word_ids]
    body = post_json(proc.http_address, "/v1/models/distilbert_seq:classify",
                     {"texts": texts, "options": {"topK": 3, "subwords": True, "attention": True}})
    for result, want in zip(body["results"], native.results):
        got = {s["label"]: s["score"] for s in result["labels"]}
        assert np.allclose([got[label] for label in LABELS], [{s.label: s.score for s in want.labels}[label]
                                                             for label in LABELS], atol=1e-6)
        assert result["tokens"][0]["word"] == -1 and result["tokens"][1]["word"] == 0


def test_teis_tokenize_and_decode_answer_as_the_models_own_tokenizer(imported):
    """TEI's /tokenize and /decode for a sub-word model (server/http/tei/tokenize_routes.h): every token's id, its
    bytes of the text and their byte offsets, a special token's own spelling with null offsets (as TEI writes
    them), always a list per text; /decode the tokenizer's own decode, with and without the special tokens —
    WordPiece's decoder (MiniLM's file), SentencePiece's Metaspace (XLM-R's), and none (the byte-level BPE here
    has no decoder: its tokens joined by spaces, as `tokenizers` does)."""
    proc, models_ = imported
    for name in ("bert_seq", "xlmr_tok", "roberta_seq"):
        tokenizer = Tokenizer.from_str(models_[name][1].to_str())
        tokenizer.no_truncation()  # TEI's /tokenize truncates nothing (MiniLM's file cuts at 128)
        status, got, _ = http_call(proc.http_address, "POST", f"/models/{name}/tokenize", {"inputs": HOSTILE})
        assert status == 200 and len(got) == len(HOSTILE), (name, got)
        for text, tokens, enc in zip(HOSTILE, got, tokenizer.encode_batch(HOSTILE)):
            raw = text.encode()
            byte = [len(text[:i].encode()) for i in range(len(text) + 1)]
            want = [{"id": i, "text": t if m else raw[byte[a]:byte[b]].decode(), "special": bool(m),
                     "start": None if m else byte[a], "stop": None if m else byte[b]}
                    for i, t, m, (a, b) in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)]
            assert tokens == want, (name, text)
            assert all(list(t) == ["id", "text", "special", "start", "stop"] for t in tokens)
        status, plain, _ = http_call(proc.http_address, "POST", f"/models/{name}/tokenize",
                                     {"inputs": HOSTILE[0], "add_special_tokens": False})
        assert status == 200 and [t["id"] for t in plain[0]] == tokenizer.encode(HOSTILE[0], add_special_tokens=False).ids
        ids = [e.ids for e in tokenizer.encode_batch(HOSTILE)]
        for skip in (True, False):
            status, texts, _ = http_call(proc.http_address, "POST", f"/models/{name}/decode",
                                         {"ids": ids, "skip_special_tokens": skip})
            assert status == 200 and texts == [tokenizer.decode(i, skip_special_tokens=skip) for i in ids], (name, skip)
            # TEI's own OpenAPI schemas (proto/tei/openapi.json) hold the request and the answer.
            assert tei_schema_errors("DecodeRequest", {"ids": ids, "skip_special_tokens": skip}) == []
            assert tei_schema_errors("DecodeResponse", texts) == [] and tei_schema_errors("TokenizeResponse", got) == []
        status, one, _ = http_call(proc.http_address, "POST", f"/models/{name}/decode", {"ids": ids[0]})
        assert status == 200 and one == [tokenizer.decode(ids[0])]  # one list of ids: a list of one text
    size = models_["bert_seq"][1].get_vocab_size()
    for body, status, kind, message in (
            ({"ids": [101, size + 5]}, 422, "Validation", f"ids[1]: {size + 5} is no token's id"),
            ({"ids": [[101], [7, -3]]}, 422, "Validation", "ids[1][1]: not a token id"),
            ({"ids": [[101], [7, size + 9]]}, 422, "Validation", f"ids[1][1]: {size + 9} is no token's id"),
            ({"ids": [2 ** 32]}, 422, "Validation", "ids[0]: not a token id"),
            ({"ids": []}, 400, "Empty", "cannot be empty"),
            ({"ids": [[101]] * 300}, 422, "Validation", "batch size 300"),
            ({"inputs": "a"}, 422, "Validation", "ids: missing")):
        got, answer, _ = http_call(proc.http_address, "POST", "/models/bert_seq/decode", body)
        assert (got, answer["error_type"]) == (status, kind) and message in answer["error"], (body, answer)
    for body, status, kind, message in (
            ({"inputs": ""}, 400, "Empty", "cannot be empty"),
            ({"inputs": ["a", 3]}, 422, "Validation", "inputs[1]: not a text"),
            ({"inputs": "x" * 70000}, 422, "Validation", "inputs: 70000 bytes, over the limit of 65536"),
            ({"inputs": "a", "prompt_name": "query"}, 422, "Validation", "prompt_name: these models have no prompts"),
            ({"inputs": ["x " * 30000] * 20}, 422, "Validation", "the answer would pass")):
        got, answer, _ = http_call(proc.http_address, "POST", "/models/bert_seq/tokenize", body)
        assert (got, answer["error_type"]) == (status, kind) and message in answer["error"], (str(body)[:60], answer)
    got, answer, _ = http_call(proc.http_address, "POST", "/models/nope/tokenize", {"inputs": "a"})
    assert got == 404 and "nope" in answer["error"]
    # TEI's gRPC Tokenize and Decode (tei.v1) answer the same, a text or a list of ids a call — a long one too.
    pb2, pb2_grpc = tei_stubs()
    stub = pb2_grpc.TokenizeStub(proc.channel)
    tokenizer = Tokenizer.from_str(models_["xlmr_tok"][1].to_str())
    tokenizer.no_truncation()
    long_text = " ".join(["unbelievably moving"] * 80)
    assert len(tokenizer.encode(long_text).ids) > 64  # more ids than a default wire cap of a repeated field
    for text in HOSTILE + [long_text]:
        metadata = (("qvi-model", "xlmr_tok"),)
        tokens = stub.Tokenize(pb2.EncodeRequest(inputs=text, add_special_tokens=True), metadata=metadata,
                               timeout=30).tokens
        ids = tokenizer.encode(text).ids
        assert [t.id for t in tokens] == ids, text
        for skip in (True, False):
            decoded = stub.Decode(pb2.DecodeRequest(ids=ids, skip_special_tokens=skip), metadata=metadata, timeout=30)
            assert decoded.text == tokenizer.decode(ids, skip_special_tokens=skip), (text, skip)
    # Their streams (TokenizeStream, DecodeStream) answer the same, in order.
    texts = HOSTILE + [long_text]
    streamed = stub.TokenizeStream(iter([pb2.EncodeRequest(inputs=t, add_special_tokens=True) for t in texts]),
                                   metadata=(("qvi-model", "xlmr_tok"),), timeout=60)
    assert [[t.id for t in answer.tokens] for answer in streamed] == [tokenizer.encode(t).ids for t in texts]
    decoded = stub.DecodeStream(iter([pb2.DecodeRequest(ids=tokenizer.encode(t).ids, skip_special_tokens=True)
                                      for t in texts]), metadata=(("qvi-model", "xlmr_tok"),), timeout=60)
    assert [d.text for d in decoded] == [tokenizer.decode(tokenizer.encode(t).ids, skip_special_tokens=True)
                                         for t in texts]


def test_occlusion_deletes_whole_words_and_maps_are_per_word(api, imported):
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    text = "Unbelievably charming film"
    model, tokenizer, _ = models_["bert_seq"]
    answer = stub.Classify(pb.ClassifyRequest(
        model=pb.ModelSpec(name="bert_seq"), texts=[text],
        options=pb.OutputOptions(occlusion=True, layers=pb.LayerOptions(attention_maps=True, layers=[1], heads=[0]))),
        timeout=60).results[0]
    tokenizer.enable_truncation(128)
    enc = tokenizer.encode(text)
    assert len(answer.tokens) == 3 and len(enc.ids) > 5  # "unbelievably" is several sub-words
    label = LABELS.index(answer.labels[0].label)
    base = torch.softmax(reference(model, tokenizer, text)[0], -1)[label]
    for w, token in enumerate(answer.tokens):
        kept = [i for i, x in zip(enc.ids, enc.word_ids) if x != w]
        with torch.no_grad():
            p = torch.softmax(model(input_ids=torch.tensor([kept])).logits[0], -1)[label]
        assert token.occlusion[0] == pytest.approx(float(base - p), abs=1e-4)
    (layer_map,) = answer.layers
    assert len(layer_map.attention) == 3 * 3


def test_bad_folders_are_refused_naming_what_is_missing(tmp_path):
    folder = tmp_path / "half"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    out = qvi_cli("import", "--from", str(folder), "--store", str(tmp_path / "store"), "--name", "x")
    assert out.returncode != 0 and "lacks model.safetensors, tokenizer.json" in out.stderr
    for name in ("model.safetensors", "tokenizer.json"):
        (folder / name).write_text("{}")
    (folder / "config.json").write_text(json.dumps({"architectures": ["GPT2ForSequenceClassification"]}))
    out = qvi_cli("import", "--from", str(folder), "--store", str(tmp_path / "store"), "--name", "x")
    assert out.returncode != 0 and "GPT2ForSequenceClassification" in out.stderr and "is not supported" in out.stderr


def test_a_tokenizer_the_server_cannot_read_fails_that_model_only(api, imported, tmp_path):
    pb, pbg = api
    model, tokenizer, _ = imported[1]["bert_seq"]
    folder = tmp_path / "nfkc"
    model.save_pretrained(folder)
    j = json.loads(tokenizer.to_str())
    j["normalizer"] = {"type": "NFKC"}
    (folder / "tokenizer.json").write_text(json.dumps(j))
    store = tmp_path / "store"
    assert qvi_cli("import", "--from", str(folder), "--store", str(store), "--name", "nfkc",
                   "--format", "torchscript").returncode == 0
    # A post-processor naming a [CLS] id past the embedding: refused at load, not on every request.
    j = json.loads(tokenizer.to_str())
    j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = [999999]
    (folder / "tokenizer.json").write_text(json.dumps(j))
    assert qvi_cli("import", "--from", str(folder), "--store", str(store), "--name", "bigcls",
                   "--format", "torchscript").returncode == 0
    shutil.copytree(os.path.join(str(imported[0].work), "store", "bert_seq"), store / "bert_seq")
    proc = ServerProcess(str(store), str(tmp_path))
    try:
        stub = pbg.InferenceStub(proc.channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="nfkc"), texts=["x"]), timeout=30)
        assert "NFKC" in proc.log()
        assert "tokenizer.json has ids up to 999999 but the model's vocab_size is 30522" in proc.log()
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)
        fine = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="bert_seq"), texts=["fine"]), timeout=30)
        assert fine.results[0].labels
    finally:
        proc.stop()


def test_a_text_over_max_tokens_is_truncated_counting_the_special_tokens_or_refused(api, imported):
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    _, tokenizer, _ = models_["roberta_seq"]
    text = "a " * 126 + "b c"  # 128 words of one sub-word each: 130 positions with <s> and </s>
    tokenizer.no_truncation()
    assert len(tokenizer.encode(text).ids) == 130
    result = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="roberta_seq"), texts=[text],
                                              options=pb.OutputOptions(tokens=True)), timeout=60).results[0]
    assert result.truncated and len(result.tokens) == 126  # 128 positions less <s> and </s>
    with pytest.raises(grpc.RpcError) as e:
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="roberta_seq"), texts=[text],
                                         options=pb.OutputOptions(truncation=pb.TRUNCATION_POLICY_ERROR)), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "texts[0]: 130 sub-words (2 special tokens included) exceed model 'roberta_seq' max_tokens of 128" in \
        e.value.details()


def test_the_readme_imports_a_folder_and_answers_from_it(imported, tmp_path):
    """The README's commands as written, but for the folder, the store and the server's address."""
    proc, models_ = imported
    model, tokenizer, _ = models_["distilbert_seq"]
    folder = tmp_path / "reviews-distilbert"
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Serve your own fine-tuned BERT, RoBERTa, XLM-R or DistilBERT"):]
    command, *clients = re.search(r"```sh\n(.*?)```", section, re.S).group(1).strip().splitlines()
    argv = shlex.split(command.replace("~/reviews-distilbert", str(folder)))
    store = os.path.join(proc.work, "store")
    argv[argv.index("--store") + 1] = store
    # The package from the cache: the fixture compiled these weights' already (the key is the weights, code
    # and target, not the name), so even a cold run compiles it once.
    argv += ["--pt2-cache", PT2_CACHE, "--cpu-freezing", "off"]
    out = subprocess.run(argv[1:], cwd=REPO, env=dict(os.environ, PYTHONPATH="model_store", OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    client = os.path.join(REPO, "build", "qvi-client")
    answers = []
    for command in clients:
        assert command.startswith("build/qvi-client "), command
        argv = shlex.split(command.replace("localhost:8500", proc.address))
        wait_until(lambda: subprocess.run([client, "--server", proc.address, "health", "--model", "reviews"],
                                          capture_output=True).returncode == 0, "the imported model to be served")
        out = subprocess.run([client, "--color", "never", *argv[1:]], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        answers.append(out.stdout)
    # What the README shows: the test's model is seeded, so the numbers are the same on every machine
    # but for the last digit.
    shown = re.findall(r"```text\n(.*?)```", section.split("\n## ")[0], re.S)
    assert len(shown) == 2
    number = re.compile(r"[-+]?\d+\.\d+")
    for got, want in zip(answers, shown):
        got_lines, want_lines = got.rstrip().splitlines(), want.rstrip().splitlines()
        assert [number.sub("#", g) for g in got_lines] == [number.sub("#", w) for w in want_lines], got
        for g, w in zip(number.findall(got), number.findall(want)):
            assert abs(float(g) - float(w)) <= 2e-4, (g, w)


def test_a_tagger_without_a_crf_explains_its_entities_by_deleting_words(api, imported):
    """Occlusion of an imported tagger: an entity's probability is the mean of its words' tag softmax
    (first sub-words'), and each other word's value what it drops without that word, in both views."""
    pb, pbg = api
    proc, models_ = imported
    stub = pbg.InferenceStub(proc.channel)
    model, tokenizer, _ = models_["bert_tok"]
    tokenizer.enable_truncation(128)

    def word_probabilities(ids, word_ids):
        with torch.no_grad():
            p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0], -1)
        first = {}
        for position, w in enumerate(word_ids):
            if w is not None and w not in first:
                first[w] = position
        return [p[first[w]] for w in sorted(first)]

    checked = 0
    for text in corpus_texts(40):
        request = dict(model=pb.ModelSpec(name="bert_tok"), texts=[text])
        answer = stub.Tag(pb.TagRequest(**request, options=pb.OutputOptions(occlusion=True)), timeout=60).results[0]
        if not answer.spans:
            continue
        enc = tokenizer.encode(text)
        base = word_probabilities(enc.ids, enc.word_ids)
        for span in answer.spans:
            tags = [TAGS.index(answer.tokens[w].tag) for w in range(span.token_start, span.token_end)]
            want = sum(float(base[w][t]) for w, t in zip(range(span.token_start, span.token_end), tags)) / len(tags)
            assert span.probability == pytest.approx(want, abs=1e-5)
            assert len(span.occlusion) == len(answer.tokens)
            for w in range(len(answer.tokens)):
                if span.token_start <= w < span.token_end:
                    assert span.occlusion[w] == 0
                    continue
                kept = [(i, x) for i, x in zip(enc.ids, enc.word_ids) if x != w]
                without = word_probabilities([i for i, _ in kept], [x for _, x in kept])
                shift = 1 if w < span.token_start else 0
                p = sum(float(without[v - shift][t]) for v, t in zip(range(span.token_start, span.token_end), tags))
                assert span.occlusion[w] == pytest.approx(want - p / len(tags), abs=1e-4), (text, w)
        subs = stub.Tag(pb.TagRequest(**request, options=pb.OutputOptions(occlusion=True, subwords=True)),
                        timeout=60).results[0]
        for span, sub in zip(answer.spans, subs.spans):
            assert sub.probability == pytest.approx(span.probability, abs=1e-6)
            assert [sub.occlusion[p] for p, t in enumerate(subs.tokens) if t.word >= 0] == pytest.approx(
                [span.occlusion[t.word] for t in subs.tokens if t.word >= 0], abs=1e-6)
        checked += 1
        if checked == 3:
            break
    assert checked == 3, "the random tagger found too few entities to check"


def test_the_page_shows_each_words_subwords_on_hover_and_the_report_the_subwords(browser, imported, tmp_path):
    from selenium.webdriver.common.by import By
    proc, models_ = imported
    _, tokenizer, _ = models_["bert_seq"]
    text = "Unbelievably charming, if overlong."
    open_page(browser, proc.http_address, "bert_seq")
    assert ask(browser, text) == "answered"
    toks = browser.find_elements(By.CSS_SELECTOR, '#answer .row[data-kind="alpha"] .tok')
    assert [t.text for t in toks] == ["Unbelievably", "charming", ",", "if", "overlong", "."]
    tokenizer.enable_truncation(128)
    enc = tokenizer.encode(text)
    pieces = [t for t, w in zip(enc.tokens, enc.word_ids) if w == 0]
    assert len(pieces) > 1
    toks[0].send_keys(Keys.ARROW_RIGHT)
    toks[1].send_keys(Keys.ARROW_LEFT)  # back to the first word: its numbers and sub-words in the status line
    status = browser.find_element(By.ID, "status").get_attribute("textContent")
    assert status.endswith("sub-words " + " ".join(pieces)), status
    # qvi-client's HTML report of the sub-word view: [CLS], the word pieces and [SEP] as the model read them.
    page = str(tmp_path / "report.html")
    out = subprocess.run([os.path.join(REPO, "build", "qvi-client"), "--server", proc.address, "classify", "--model",
                          "bert_seq", "--subwords", "--attention", "--html", page, text], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with open(page, encoding="utf-8") as f:
        report = f.read()
    shown = re.findall(r'<span class="tok"[^>]*>([^<]*)</span>', report)
    assert shown[:len(enc.tokens)] == enc.tokens, shown


def test_qvi_faithfulness_measures_an_imported_model_word_by_word_and_its_card_carries_it(api, imported, tmp_path):
    """`python -m qvi faithfulness` on an imported model.pt: its answers per word, α, the maps and occlusion
    measured by deleting words; the report goes onto the card with a second import, and GetModel shows it."""
    pb, pbg = api
    proc, models_ = imported
    model, tokenizer, _ = models_["roberta_seq"]
    artifact = os.path.join(proc.work, "store", "roberta_seq", "1", "model.pt")
    report_path = str(tmp_path / "faithfulness.json")
    out = qvi_cli("faithfulness", "--artifact", artifact, "--test", os.path.join(DATA, "sentiment", "test.tsv"),
                  "--max-answers", "24", "--cost-texts", "0", "--quiet", "--out", report_path)
    assert out.returncode == 0, out.stderr
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    assert report["unit"] == "word" and report["answers"] == 24
    assert set(report["methods"]) == {"random", "alpha", "last_layer", "rollout", "occlusion"}
    assert report["padding_check"]["max_abs_diff"] < 1e-5  # deleting the last words = masking them off
    # The measured model is the served one: its answer on a text is the server's.
    texts = corpus_texts(3)
    served = pbg.InferenceStub(proc.channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="roberta_seq"), texts=texts, options=pb.OutputOptions(top_k=3)),
        timeout=60)
    from qvi.hf_faithfulness import word_level  # the zoo (qvi_testing puts model_store on the path)
    words, _, _, encoded = word_level(artifact, texts)
    for row, result in zip(encoded, served.results):
        with torch.no_grad():
            p = torch.softmax(words(torch.tensor([row]), torch.ones(1, len(row), dtype=torch.bool))["logits"][0], -1)
        got = {s.label: s.score for s in result.labels}
        assert np.allclose(p.numpy(), [got[label] for label in LABELS], atol=1e-4)
    # Onto the card: import again with the report; GetModel reads the figures.
    folder = tmp_path / "again"
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    store = os.path.join(proc.work, "store")
    out = qvi_cli("import", "--from", str(folder), "--store", store, "--name", "roberta_seq", "--version", "2",
                  "--format", "torchscript", "--faithfulness", report_path)
    assert out.returncode == 0, out.stderr
    stub = pbg.InferenceStub(proc.channel)

    def card():
        try:
            versions = stub.GetModel(pb.GetModelRequest(model=pb.ModelSpec(name="roberta_seq", version=2)),
                                     timeout=30).model.versions
        except grpc.RpcError:  # not seen yet: NOT_FOUND
            return None
        return versions[0].metadata.faithfulness if versions and versions[0].state == pb.MODEL_STATE_READY else None

    wait_until(lambda: card() is not None, "version 2 to be served")
    assert card().measured and card().answers == 24
    assert {m.method for m in card().methods} == set(report["methods"])


def test_a_subword_models_drift_gauges_measure_what_its_card_records(api, imported, tmp_path):
    """`qvi drift-reference` on an imported sub-word classifier (a word its vocabulary does not hold whole stands
    where a word-level model's unknown token does); served, its gauges over texts of the card's split are the same
    measure offline (tests/python/test_drift.py: the GloVe models)."""
    from qvi import drift  # qvi_testing puts model_store on the path
    pb, pbg = api
    proc, _ = imported
    store = tmp_path / "store"
    (store / "bert_seq" / "1").mkdir(parents=True)
    target = str(store / "bert_seq" / "1" / "model.pt")
    shutil.copy(os.path.join(proc.work, "store", "bert_seq", "1", "model.pt"), target)
    out = qvi_cli("drift-reference", "--artifact", target, "--test", os.path.join(DATA, "sentiment", "test.tsv"),
                  "--write")
    assert out.returncode == 0, out.stderr
    extra = {"manifest.json": ""}
    torch.jit.load(target, _extra_files=extra)
    card = json.loads(extra["manifest.json"])["model_card"]["drift_reference"]
    assert card["unknown_of"] == "words" and 0 < card["unknown"] < 1 and card["texts"] == 1276
    with open(os.path.join(DATA, "sentiment", "test.tsv")) as f:
        rows = [line.rstrip("\n").split("\t", 1) for line in f][:200]
    window = tmp_path / "window.tsv"
    window.write_text("".join(f"{label}\t{text}\n" for label, text in rows))
    offline = drift.reference(target, str(window))
    with ServerProcess(str(store), str(tmp_path), "--drift-window-texts", "500") as served:
        stub = pbg.InferenceStub(served.channel)
        for i in range(0, len(rows), 50):
            stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name="bert_seq"),
                                             texts=[t for _, t in rows[i:i + 50]]), timeout=60)
        samples = served.metrics()
    series = lambda name, *parts: metric_sum(samples, name, 'model="bert_seq"', *parts)  # noqa: E731
    assert series("qvi_drift_window", 'what="texts"') == len(rows)
    assert series("qvi_drift_unknown_share", 'side="live"') == pytest.approx(offline["unknown"], abs=1e-5)
    assert series("qvi_drift_unknown_share", 'side="reference"') == pytest.approx(card["unknown"], abs=1e-9)
    assert series("qvi_drift_low_confidence_share", 'side="live"') == pytest.approx(offline["below"]["share"],
                                                                                      abs=1e-5)
    def psi(live, reference):
        live, reference = (np.maximum(np.asarray(x, dtype=float), 1e-4) for x in (live, reference))
        return float(((live - reference) * np.log(live / reference)).sum())
    labels = sorted(card["labels"])
    assert series("qvi_drift_psi", 'feature="label"') == pytest.approx(
        psi([offline["labels"][k] for k in labels] + [0], [card["labels"][k] for k in labels] + [0]), abs=1e-4)
    # The lengths count the special tokens the model reads, as the server's tokens read do.
    tok = Tokenizer.from_file(MINILM)
    tok.no_padding()
    tok.enable_truncation(json.loads(extra["manifest.json"])["tokenizer"]["max_tokens"])
    lengths = [len(e.ids) for e in tok.encode_batch([t for _, t in rows])]
    edges = card["length"]["edges"]
    shares = np.bincount(np.searchsorted(edges, lengths, side="right"), minlength=len(edges) + 1) / len(rows)
    assert series("qvi_drift_psi", 'feature="length"') == pytest.approx(psi(shares, card["length"]["shares"]),
                                                                       abs=1e-4)
