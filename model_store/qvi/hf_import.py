"""python -m qvi import: a fine-tuned Hugging Face checkpoint folder -> a served artifact.

    python -m qvi import --from ./my-finetuned-bert --store model_store/store --name reviews [--format both]

The folder is what `save_pretrained` (model and tokenizer) writes: config.json, model.safetensors and
tokenizer.json. Its encoder is rebuilt with the zoo's modules (qvi.hf_encoders; `transformers` is not
needed here or at serve time), scripted, and written as <store>/<name>/<version>/model.pt with the
manifest (format version 2: a sub-word tokenizer, tokenizer.json carried inside the archive) and a model
card; and, as `python -m qvi export` does, compiled into an AOTInductor package beside it. The server
tokenizes with its own reader of tokenizer.json (server/core/text/hf/).
"""
import argparse
import hashlib
import json
import os
from typing import Dict, List, Optional, Tuple

import torch

from qvi import __version__
from qvi import artifact, pt2
from qvi.hf_encoders import Encoder, EncoderConfig, output_spec
from qvi.workflow import add_freezing_arg

FORMAT_VERSION = artifact.SUBWORD_FORMAT_VERSION  # the manifest format with sub-word tokenizers
TOKENIZER_FILE = artifact.TOKENIZER
REQUIRED = ("config.json", "model.safetensors", TOKENIZER_FILE)
# architectures[0] of config.json -> (family, task)
ARCHITECTURES = {
    "BertForSequenceClassification": ("bert", "classification"),
    "BertForTokenClassification": ("bert", "tagging"),
    "RobertaForSequenceClassification": ("roberta", "classification"),
    "RobertaForTokenClassification": ("roberta", "tagging"),
    # XLM-R: RoBERTa's encoder (its weights under roberta.*) with a SentencePiece tokenizer (Precompiled).
    "XLMRobertaForSequenceClassification": ("roberta", "classification"),
    "XLMRobertaForTokenClassification": ("roberta", "tagging"),
    "DistilBertForSequenceClassification": ("distilbert", "classification"),
    "DistilBertForTokenClassification": ("distilbert", "tagging"),
}
DISPLAY = {"bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT"}


class CannotImport(ValueError):
    """A folder that cannot be imported; the message names what is missing or unsupported."""


def read_config(folder: str) -> Dict[str, object]:
    missing = [f for f in REQUIRED if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise CannotImport(f"{folder} lacks {', '.join(missing)} (save_pretrained writes config.json and "
                           f"model.safetensors; the tokenizer's save_pretrained writes tokenizer.json)")
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def encoder_config(config: Dict[str, object]) -> Tuple[EncoderConfig, str]:
    """The zoo's config of the checkpoint's encoder, and its architecture name."""
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in ARCHITECTURES:
        raise CannotImport(f"config.json: architectures {archs!r} is not supported; one of "
                           f"{', '.join(sorted(ARCHITECTURES))} is")
    family, task = ARCHITECTURES[arch]
    labels = id2label(config)
    g = config.get
    if family == "distilbert":
        c = EncoderConfig(family, task, int(g("vocab_size")), int(g("dim")), int(g("n_layers")), int(g("n_heads")),
                          int(g("hidden_dim")), int(g("max_position_embeddings")), 0, 1e-12,
                          str(g("activation", "gelu")), len(labels), int(g("pad_token_id", 0) or 0))
    else:
        c = EncoderConfig(family, task, int(g("vocab_size")), int(g("hidden_size")), int(g("num_hidden_layers")),
                          int(g("num_attention_heads")), int(g("intermediate_size")),
                          int(g("max_position_embeddings")), int(g("type_vocab_size", 2)),
                          float(g("layer_norm_eps", 1e-12)), str(g("hidden_act", "gelu")), len(labels),
                          int(g("pad_token_id", 0) or 0))
    if g("position_embedding_type", "absolute") != "absolute":
        raise CannotImport(f"config.json: position_embedding_type {g('position_embedding_type')!r} is not "
                           "supported; 'absolute' is")
    # DistilBERT's sinusoidal_pos_embds: the sinusoids are stored as the position embedding's weights.
    return c, arch


def id2label(config: Dict[str, object]) -> List[str]:
    """The labels in id order (a 2-label config may omit id2label: LABEL_0, LABEL_1)."""
    raw = config.get("id2label")
    n = int(config.get("num_labels", len(raw) if isinstance(raw, dict) else 2))  # type: ignore[arg-type]
    if not isinstance(raw, dict) or not raw:
        return [f"LABEL_{i}" for i in range(n)]
    by_id = {int(k): str(v) for k, v in raw.items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise CannotImport(f"config.json: id2label's ids {sorted(by_id)} are not 0..{len(by_id) - 1}")
    return [by_id[i] for i in range(len(by_id))]


def tag_scheme(tags: List[str]) -> str:
    """BIO or BIOES, from the tags' prefixes; anything else cannot be decoded into spans."""
    prefixes = set()
    for t in tags:
        if t == "O":
            continue
        if len(t) < 3 or t[1] != "-" or t[0] not in "BIES":
            raise CannotImport(f"config.json: id2label's tag {t!r} is not O or B-/I-/E-/S- and an entity type; "
                               "spans cannot be decoded from it")
        prefixes.add(t[0])
    return "BIOES" if prefixes & {"E", "S"} else "BIO"


def _layer_names(family: str) -> Dict[str, str]:
    if family == "distilbert":
        return {"q": "attention.q_lin", "k": "attention.k_lin", "v": "attention.v_lin", "o": "attention.out_lin",
                "norm1": "sa_layer_norm", "ffn1": "ffn.lin1", "ffn2": "ffn.lin2", "norm2": "output_layer_norm"}
    return {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
            "o": "attention.output.dense", "norm1": "attention.output.LayerNorm", "ffn1": "intermediate.dense",
            "ffn2": "output.dense", "norm2": "output.LayerNorm"}


def weight_map(c: EncoderConfig, prefix: Optional[str] = None) -> Dict[str, str]:
    """Encoder parameter name -> the checkpoint's name of it. `prefix`: where the checkpoint keeps the encoder
    ("bert." in a BertForSequenceClassification; "" in a bare BertModel, as sentence-transformers saves one)."""
    p = c.family
    base = f"{p}." if prefix is None else prefix
    emb = f"{base}embeddings"
    names = {"emb_word": f"{emb}.word_embeddings", "emb_pos": f"{emb}.position_embeddings",
             "emb_norm": f"{emb}.LayerNorm"}
    if c.type_vocab_size > 0:
        names["emb_type"] = f"{emb}.token_type_embeddings"
    stack = f"{base}transformer.layer" if p == "distilbert" else f"{base}encoder.layer"
    for i in range(c.layers):
        for ours, theirs in _layer_names(p).items():
            names[f"layers.{i}.{ours}"] = f"{stack}.{i}.{theirs}"
    if c.task == "classification":
        names["head_dense"] = {"bert": "bert.pooler.dense", "roberta": "classifier.dense",
                               "distilbert": "pre_classifier"}[p]
        names["classifier"] = "classifier.out_proj" if p == "roberta" else "classifier"
    else:
        names["classifier"] = "classifier"
    out: Dict[str, str] = {}
    for ours, theirs in names.items():
        suffixes = ("weight",) if ours.startswith("emb_") and not ours.endswith("norm") else ("weight", "bias")
        for s in suffixes:
            out[f"{ours}.{s}"] = f"{theirs}.{s}"
    return out


def load_weights(model: Encoder, c: EncoderConfig, folder: str, prefix: Optional[str] = None,
                 encoder_only: bool = False) -> None:
    """The checkpoint's weights into `model`; `encoder_only`: the embeddings and layers alone (a pretrained
    encoder under a new head, qvi.finetune), the rest left as initialised."""
    from safetensors.torch import load_file
    state = load_file(os.path.join(folder, "model.safetensors"))
    # Older checkpoints name LayerNorm's parameters gamma and beta.
    for key in list(state):
        if key.endswith(".gamma") or key.endswith(".beta"):
            state[key[: key.rfind(".")] + (".weight" if key.endswith(".gamma") else ".bias")] = state.pop(key)
    ours = model.state_dict()
    loaded: Dict[str, torch.Tensor] = {}
    missing = []
    for name, theirs in weight_map(c, prefix).items():
        if encoder_only and not name.startswith(("emb_", "layers.")):
            continue
        if theirs not in state:
            missing.append(theirs)
            continue
        if tuple(state[theirs].shape) != tuple(ours[name].shape):
            raise CannotImport(f"model.safetensors: {theirs} has shape {tuple(state[theirs].shape)}, config.json "
                               f"implies {tuple(ours[name].shape)}")
        loaded[name] = state[theirs].to(torch.float32)
    if missing:
        raise CannotImport(f"model.safetensors lacks {len(missing)} tensors the {c.family} architecture needs, "
                           f"first {missing[:3]}")
    if c.type_vocab_size == 0:
        loaded["emb_type.weight"] = ours["emb_type.weight"].zero_()
    model.load_state_dict(loaded, strict=not encoder_only)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_kind(tokenizer_json: Dict[str, object]) -> str:
    model = tokenizer_json.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    return str(kind or "unknown")


def build_manifest(name: str, c: EncoderConfig, arch: str, labels: List[str], folder: str,
                   tokenizer_json: Dict[str, object], max_tokens: int, description: str) -> Dict[str, object]:
    outputs = output_spec(c)
    manifest: Dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "task": c.task,
        "architecture": {"name": f"hf_{c.family}", "display_name": f"{DISPLAY[c.family]} (imported)",
                         "interaction": "none",
                         "config": dict(c.to_json(), max_tokens=max_tokens, source_architecture=arch)},
        "tokenizer": {"level": "subword", "file": TOKENIZER_FILE, "kind": tokenizer_kind(tokenizer_json),
                      "lowercase": False, "max_tokens": max_tokens, "vocab_size": c.vocab_size,
                      "word_tags": "first_subword"},
        "inputs": {"token_ids": {"shape": ["B", "T"], "dtype": "int64"},
                   "mask": {"shape": ["B", "T"], "dtype": "bool"}},
        "outputs": outputs,
        "explanations": [k for k in outputs if k not in artifact.PREDICTIONS],
        "serving": dict(artifact.DEFAULT_SERVING),
        "pt2": pt2.export_status(f"hf_{c.family}"),
        "model_card": {
            "description": description or f"{DISPLAY[c.family]} {c.task} model imported from "
                                          f"{os.path.basename(os.path.abspath(folder))}",
            "source": {"folder": os.path.basename(os.path.abspath(folder)), "architecture": arch,
                       "model_safetensors_sha256": _sha256(os.path.join(folder, "model.safetensors")),
                       "tokenizer_json_sha256": _sha256(os.path.join(folder, TOKENIZER_FILE))},
            "explanations": {
                "attention": "the last layer's attention from the first position ([CLS] or <s>), averaged over "
                             "heads, summed over each word's sub-words",
                "layer_attention": "every layer's and head's self-attention map (rows: from, columns: to)",
                "occlusion": "leave-one-word-out, computed by the server for any model",
            },
            "exporter_version": __version__,
            "torch_version": torch.__version__.split("+")[0],
        },
    }
    if c.task == "classification":
        manifest["labels"] = labels
    else:
        manifest["tags"] = labels
        manifest["tag_scheme"] = tag_scheme(labels)
        manifest["entity_types"] = sorted({t.split("-", 1)[1] for t in labels if "-" in t})
    return manifest


def import_folder(folder: str, store: str, name: str, version: int, max_tokens: Optional[int] = None,
                  description: str = "", fmt: str = "torchscript", device: str = "cpu",
                  cpu_target: str = pt2.DEFAULT_CPU_TARGET, pt2_cache: Optional[str] = None,
                  freezing: str = pt2.DEFAULT_FREEZING, faithfulness: Optional[Dict[str, object]] = None) -> List[str]:
    """Imports `folder` as the formats `fmt` asks for (model.pt, model.<device>.pt2, both: as
    `python -m qvi export` writes them); returns the paths written."""
    config = read_config(folder)
    c, arch = encoder_config(config)
    labels = id2label(config)
    if c.task == "tagging":
        tag_scheme(labels)
    with open(os.path.join(folder, TOKENIZER_FILE), encoding="utf-8") as f:
        tokenizer_text = f.read()
    try:
        tokenizer_json = json.loads(tokenizer_text)
    except json.JSONDecodeError as e:
        raise CannotImport(f"{TOKENIZER_FILE} is not JSON: {e}") from e
    limit = c.max_tokens if max_tokens is None else max_tokens
    if not 2 < limit <= c.max_tokens:
        raise CannotImport(f"--max-tokens {limit} must be above 2 and at most the {c.max_tokens} positions the "
                           "model has")
    model = Encoder(c).eval()
    load_weights(model, c, folder)
    manifest = build_manifest(name, c, arch, labels, folder, tokenizer_json, limit, description)
    if faithfulness is not None:  # a `python -m qvi faithfulness` report of this model, onto its card
        from qvi.faithfulness import card_summary
        if faithfulness.get("model") != name:
            raise CannotImport(f"the faithfulness report measured the model {faithfulness.get('model')!r}, "
                               f"not {name!r}")
        manifest["model_card"]["faithfulness"] = card_summary(faithfulness)  # type: ignore[index]
    written = []
    if fmt in ("torchscript", "both"):
        written.append(artifact.export_files(model, manifest, {TOKENIZER_FILE: tokenizer_text}, store, version))
    if fmt in ("pt2", "both"):
        target = os.path.join(store, name, str(version))
        os.makedirs(target, exist_ok=True)
        written.append(pt2.write_cached(model, manifest, tokenizer_text, target, device, cpu_target, pt2_cache,
                                        freezing=freezing))
    return written


def cmd_import(args: argparse.Namespace) -> None:
    try:
        report = None
        if args.faithfulness:
            with open(args.faithfulness, encoding="utf-8") as f:
                report = json.load(f)
        for path in import_folder(args.source, args.store, args.name, args.version, args.max_tokens, args.description,
                                  args.format, args.device, args.cpu_target, args.pt2_cache, args.cpu_freezing,
                                  report):
            print(path)
    except CannotImport as e:
        raise SystemExit(f"qvi import: {e}") from e


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import a fine-tuned Hugging Face checkpoint folder (BERT, RoBERTa, DistilBERT "
                                      "sequence or token classification) as <store>/<name>/<version>/model.pt")
    p.add_argument("--from", dest="source", required=True,
                   help="the folder save_pretrained wrote: config.json, model.safetensors, tokenizer.json")
    p.add_argument("--store", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--max-tokens", type=int, help="the longest input in sub-words, special tokens included "
                                                  "(default: the model's position embeddings)")
    p.add_argument("--description", default="")
    p.add_argument("--faithfulness", help="a `python -m qvi faithfulness` report of this model (run on the model.pt "
                                          "an earlier import wrote) to put on its card, as export takes one")
    p.add_argument("--format", choices=("torchscript", "pt2", "both"), default="both",
                   help="model.pt (TorchScript), model.<device>.pt2 (AOTInductor, compiled here: a minute or more "
                        "on two cores), or both")
    p.add_argument("--device", choices=tuple(pt2.FILES), default="cpu", help="the device a .pt2 is compiled for")
    p.add_argument("--cpu-target", choices=tuple(pt2.CPU_TARGETS), default=pt2.DEFAULT_CPU_TARGET,
                   help="instruction set of a CPU .pt2 (as `python -m qvi export --help` says)")
    p.add_argument("--pt2-cache", help="reuse packages compiled before from the same weights, code and target")
    add_freezing_arg(p)
    p.set_defaults(func=cmd_import)
