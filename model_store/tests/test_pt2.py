"""The AOTInductor export (qvi/pt2.py) of every architecture that has one: the package answers like
the eager model and the TorchScript file at several batch sizes and lengths, padded rows included
(logits, emissions, α, β, λ and the per-layer outputs, within 1e-5); its pt2.json carries what the
server needs; the architectures that cannot be exported say so and ship TorchScript alone.

Compiling takes 20-60 s per architecture on two cores, so packages are kept in a cache folder
(QVI_PT2_CACHE, default ~/.cache/qvi/pt2-tests) keyed by weights, exporter code and torch version:
a warm run reuses them, a changed exporter compiles again. The C++ side (the server's loader, its
Viterbi, parity with TorchScript inside the server) is tested in tests/cpp/model_test.cc."""
import json
import os

import pytest
import torch

from qvi import artifact, pt2
from qvi.cli import export_checkpoint
from qvi.models import ARCHITECTURES, BASELINES, TAGGERS, ModelConfig, TransformerCRF, build_model
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_to_json

CACHE = os.environ.get("QVI_PT2_CACHE", os.path.expanduser("~/.cache/qvi/pt2-tests"))
VOCAB = 40
EXPORTABLE = [a for a in ARCHITECTURES if a not in pt2.UNEXPORTABLE]


def make(arch, tmp_path, score="additive"):
    """`arch` may name a context too: "ctx_transformer:deep"; "+casing" folds case classes into the ids."""
    arch, casing = arch.split("+")[0], arch.endswith("+casing")
    arch, _, context = arch.partition(":")
    torch.manual_seed(11)
    num = 5 if arch in TAGGERS else 3
    cfg = ModelConfig(arch, VOCAB, num, g="none" if arch in BASELINES else "qvi", score=score, emb_dim=16, hidden=16, heads=2, layers=2, ffn=32,
                      max_tokens=32, context=context, case_dim=4 if casing else 0)
    model = build_model(cfg).eval()
    # Trained-looking CRF scores, so that Viterbi's choices are not all ties.
    if isinstance(model, TransformerCRF):
        with torch.no_grad():
            model.crf.trans.normal_(0, 1)
            model.crf.start.normal_(0, 1)
            model.crf.end.normal_(0, 1)
    vocab = Vocabulary(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(VOCAB - 2)])
    labels = ["O", "B-x", "I-x", "B-y", "I-y"] if arch in TAGGERS else ["a", "b", "c"]
    manifest = artifact.build_manifest("m", cfg, TokenizerConfig(max_tokens=32, casing=casing), vocab, labels, "BIO", {})
    return model, manifest, vocab


def padded_batch(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return torch.randint(2, VOCAB, (b, t), generator=g) * mask, mask


# Every exportable architecture with the default score, the MLP and scaled-dot scores once each, and
# the deep and deep-global contexts once each.
@pytest.mark.parametrize("arch,score", [(a, "additive") for a in EXPORTABLE] +
                         [("cnn_att", "mlp"), ("transformer", "scaled_dot"),
                          ("ctx_transformer:deep", "additive"), ("ctx_transformer_crf:deep_global", "additive"),
                          ("cnn_transformer_crf+casing", "additive")])
def test_the_package_answers_like_the_eager_model_and_torchscript(arch, score, tmp_path):
    model, manifest, vocab = make(arch, tmp_path, score)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE)
    assert os.path.basename(path) == "model.cpu.pt2"
    script = torch.jit.load(artifact.export(model, manifest, vocab, str(tmp_path / "store"), 1))
    compiled = pt2.load_methods(path)
    transformer = hasattr(model, "forward_without_maps")
    assert set(compiled) == ({"model", "without_maps"} if transformer else {"model"})
    with torch.no_grad():
        for b, t in [(1, 2), (3, 17), (8, 32), (2, 5)]:
            ids, mask = padded_batch(b, t, seed=b * 100 + t)
            if manifest["tokenizer"]["casing"]:
                ids = ids + VOCAB * (ids % 5) * mask  # every case class (tokenizer rule 7)
            eager = model(ids, mask)
            scripted = script(ids, mask)
            got = compiled["model"](ids, mask)
            # Taggers' packages stop at the emissions; the server decodes the tags (viterbi.cc).
            assert set(got) == set(eager) - {"tags"}
            for name, value in got.items():
                assert value.shape == eager[name].shape, name
                assert (value - eager[name]).abs().max().item() <= 1e-5, (name, b, t)
                assert (value - scripted[name]).abs().max().item() <= 1e-5, (name, b, t)
            if transformer:
                lean = compiled["without_maps"](ids, mask)
                assert set(lean) == set(got) - {"layer_attention"}
                for name, value in lean.items():
                    assert (value - eager[name]).abs().max().item() <= 1e-5, (name, b, t)


@pytest.mark.parametrize("arch", EXPORTABLE)
def test_pt2_json_says_what_the_server_needs(arch, tmp_path):
    model, manifest, vocab = make(arch, tmp_path)
    path = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE)
    extra = pt2.read_extra(path)
    assert json.loads(extra["manifest.json"]) == json.loads(json.dumps(manifest))
    assert extra["vocab.txt"] == vocab.to_text()
    info = json.loads(extra[pt2.PT2_INFO])
    assert info["device"] == "cpu" and info["cpu_target"] == "x86-64-v3"
    assert info["cpu_flags"] == pt2.X86_64_V3_FLAGS and "avx512f" not in info["cpu_flags"]
    assert info["torch_version"] == torch.__version__.split("+")[0]
    assert (info["min_tokens"], info["max_tokens"], info["max_batch"]) == (pt2.MIN_TOKENS, 32, pt2.MAX_BATCH)
    assert "logits" in info["outputs"]["model"] or "emissions" in info["outputs"]["model"]
    if arch in TAGGERS:
        crf = info["crf"]
        assert torch.equal(torch.tensor(crf["transitions"]), model.crf.trans.detach())
        assert torch.equal(torch.tensor(crf["start"]), model.crf.start.detach())
        assert info["server_decodes"] == "tags"
    else:
        assert "crf" not in info
    assert manifest["pt2"] == {"exportable": True}


def test_a_cached_package_gets_the_new_manifest(tmp_path):
    model, manifest, vocab = make("cnn_att", tmp_path)
    first = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path / "a"), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE)
    manifest = dict(manifest, model_card={"description": "a later export of the same weights"})
    second = pt2.write_cached(model, manifest, vocab.to_text(), str(tmp_path / "b"), "cpu", pt2.DEFAULT_CPU_TARGET, CACHE)
    assert json.loads(pt2.read_extra(first)["manifest.json"])["model_card"] != manifest["model_card"]
    assert json.loads(pt2.read_extra(second)["manifest.json"])["model_card"] == manifest["model_card"]
    ids, mask = padded_batch(3, 9, seed=1)
    a, b = pt2.load_methods(first)["model"](ids, mask), pt2.load_methods(second)["model"](ids, mask)
    assert all(torch.equal(a[k], b[k]) for k in a)
    key = pt2.cache_key(model, manifest, "cpu", "x86-64-v3")
    assert os.path.exists(os.path.join(CACHE, key + ".pt2"))
    with torch.no_grad():
        model.out.bias.add_(1.0)  # other weights: another key, so a new compile
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3") != key


def test_the_cache_key_follows_the_model_code(tmp_path, monkeypatch):
    """Same weights and manifest, but a changed forward (models.py or qvi/nn/): another key, so the
    package is compiled again rather than served stale from the cache."""
    model, manifest, _ = make("cnn_att", tmp_path)
    key = pt2.cache_key(model, manifest, "cpu", "x86-64-v3")
    code = {os.path.relpath(p, os.path.dirname(pt2.__file__)) for p in pt2._CODE}
    assert {"pt2.py", "models.py", os.path.join("nn", "self_attention.py"), os.path.join("nn", "additive.py")} <= code
    for name in ("models.py", "self_attention.py"):
        original = next(p for p in pt2._CODE if os.path.basename(p) == name)
        edited = tmp_path / name
        with open(original, "rb") as f:
            edited.write_bytes(f.read() + b"\n# a change\n")
        monkeypatch.setattr(pt2, "_CODE", [str(edited) if p == original else p for p in pt2._CODE])
        assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3") != key, name
        monkeypatch.undo()
    assert pt2.cache_key(model, manifest, "cpu", "x86-64-v3") == key


@pytest.mark.parametrize("arch", sorted(pt2.UNEXPORTABLE))
def test_what_cannot_be_exported_says_so_and_ships_torchscript(arch, tmp_path):
    cfg = ModelConfig(arch, VOCAB, 2, g="none" if arch in BASELINES else "qvi", emb_dim=8, hidden=8, boundary_ids=[3])
    vocab = Vocabulary(["[PAD]", "[UNK]"] + [f"w{i}" for i in range(VOCAB - 2)])
    manifest = artifact.build_manifest("m", cfg, TokenizerConfig(), vocab, ["a", "b"], "", {})
    assert manifest["pt2"] == {"exportable": False, "reason": pt2.UNEXPORTABLE[arch]}
    torch.save({"config": cfg.to_json(), "vocab": vocab.tokens, "tokenizer": config_to_json(TokenizerConfig()),
                "labels": ["a", "b"], "scheme": "", "state_dict": build_model(cfg).state_dict(),
                "metrics": {}, "train_options": {"seed": 1}, "data": {}}, tmp_path / "c.ckpt")
    written = export_checkpoint(str(tmp_path / "c.ckpt"), str(tmp_path / "store"), "m", 1, {}, "both")
    assert [os.path.basename(p) for p in written] == ["model.pt"]
    with pytest.raises(SystemExit, match="cannot be exported to a .pt2"):
        export_checkpoint(str(tmp_path / "c.ckpt"), str(tmp_path / "store"), "m", 2, {}, "pt2")
