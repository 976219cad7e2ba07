"""The imported encoders (qvi.hf_encoders) on their own: every family and head scripts, pads without changing
a real position's outputs, and answers the same from forward and forward_without_maps. Their equality with
`transformers` is tests/python/test_hf_import.py's."""
import pytest
import torch

from qvi.hf_encoders import Encoder, EncoderConfig, output_spec
from qvi.hf_import import CannotImport, encoder_config, id2label, tag_scheme, weight_map


def config(family, task):
    return EncoderConfig(family, task, vocab_size=50, hidden=16, layers=2, heads=4, ffn=24, max_positions=40,
                         type_vocab_size=0 if family == "distilbert" else 2, layer_norm_eps=1e-12, activation="gelu",
                         num_labels=3, pad_id=1 if family == "roberta" else 0)


def alone_padded_lean(model):
    """The scripted model's answers to 7 random ids alone, to the same ids with 5 padding positions after them,
    and to those from forward_without_maps."""
    ids = torch.randint(2, 50, (1, 7))
    alone = model(ids, torch.ones(1, 7, dtype=torch.bool))
    padded_ids = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 7, dtype=torch.bool), torch.zeros(1, 5, dtype=torch.bool)], 1)
    return alone, model(padded_ids, mask), model.forward_without_maps(padded_ids, mask)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
@pytest.mark.parametrize("task", ["classification", "tagging"])
def test_padding_changes_nothing_and_both_forwards_agree(family, task):
    torch.manual_seed(0)
    alone, padded, lean = alone_padded_lean(torch.jit.script(Encoder(config(family, task)).eval()))
    key = "logits" if task == "classification" else "emissions"
    got = padded[key] if task == "classification" else padded[key][:, :7]
    assert torch.allclose(got, alone[key], atol=1e-5)
    assert torch.allclose(lean[key], padded[key], atol=1e-5)
    assert torch.allclose(lean["attention"], padded["attention"], atol=1e-6)
    assert torch.allclose(padded["attention"][:, :7].sum(), torch.tensor(1.0), atol=1e-5)
    assert padded["layer_attention"].shape == (1, 2, 4, 12, 12) and "layer_attention" not in lean
    assert set(output_spec(config(family, task))) == set(padded)
    if task == "tagging":
        assert (padded["tags"][0, 7:] == -1).all()


def test_the_checkpoints_names_are_mapped_for_every_parameter():
    for family in ("bert", "roberta", "distilbert"):
        for task in ("classification", "tagging"):
            c = config(family, task)
            assert set(weight_map(c)) == set(Encoder(c).state_dict()) - (
                {"emb_type.weight"} if family == "distilbert" else set())


def test_configs_and_labels_are_read_or_refused_by_name():
    with pytest.raises(CannotImport, match="GPT2ForSequenceClassification"):
        encoder_config({"architectures": ["GPT2ForSequenceClassification"]})
    with pytest.raises(CannotImport, match="position_embedding_type 'relative_key'"):
        encoder_config({"architectures": ["BertForSequenceClassification"], "vocab_size": 9, "hidden_size": 8,
                        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8,
                        "max_position_embeddings": 16, "position_embedding_type": "relative_key"})
    assert id2label({"num_labels": 2}) == ["LABEL_0", "LABEL_1"]
    assert id2label({"id2label": {"1": "pos", "0": "neg"}}) == ["neg", "pos"]
    assert tag_scheme(["O", "B-PER", "E-PER", "S-LOC"]) == "BIOES"
    with pytest.raises(CannotImport, match="'LABEL_1' is not O"):
        tag_scheme(["O", "LABEL_1"])


@pytest.mark.parametrize("task,pooling,qvi_layers", [("classification", "attention", 0), ("classification", "qvi", 1),
                                                      ("classification", "first", 2), ("tagging", "first", 1)])
def test_the_qvi_variants_pad_without_change_answer_their_spec_and_gate_nothing_on_padding(task, pooling, qvi_layers):
    """The fine-tuning variants (qvi.finetune): attention or QVI pooling, QVI in the top layers, a CRF tagger."""
    torch.manual_seed(0)
    c = EncoderConfig("bert", task, vocab_size=50, hidden=16, layers=2, heads=4, ffn=24, max_positions=40,
                      type_vocab_size=2, layer_norm_eps=1e-12, activation="gelu", num_labels=3, pooling=pooling,
                      qvi_layers=qvi_layers, crf=task == "tagging")
    eager = Encoder(c).eval()
    with torch.no_grad():  # W and u_h start at 0; move them so that the gates are not all ½
        for layer in eager.layers:
            if layer.qvi:
                layer.w_qvi.normal_()
                layer.u_qvi.normal_()
    alone, padded, lean = alone_padded_lean(torch.jit.script(eager))
    assert sorted(padded) == sorted(output_spec(c))
    key = "logits" if task == "classification" else "emissions"
    got = padded[key] if task == "classification" else padded[key][:, :7]
    assert torch.allclose(got, alone[key], atol=1e-5)
    assert torch.allclose(lean[key], padded[key], atol=1e-5)
    if task == "tagging":
        assert padded["tags"][0, :7].tolist() == alone["tags"][0].tolist() and padded["tags"][0, 7:].eq(-1).all()
    if "gates" in padded:
        assert padded["gates"][0, 7:].eq(0).all() and torch.allclose(padded["gates"][:, :7], alone["gates"], atol=1e-5)
    if qvi_layers:
        gates = padded["layer_gates"]
        assert gates.shape == (1, 2, 4, 12) and gates[0, :, :, 7:].eq(0).all()
        assert gates[0, :2 - qvi_layers, :, :7].eq(1).all(), "β = 1 in the layers without QVI"
    if "contribution" in padded:
        total = padded["contribution"].sum(1) + eager.classifier.bias
        assert torch.allclose(total, padded["logits"], atol=1e-5), "the words' shares and the bias are the logits"
