"""The serving artifact: model_store/<name>/<version>/model.pt, one TorchScript archive that
carries everything the server needs as extra files (the AOTInductor packages beside it,
model.<device>.pt2, carry the same files: qvi/pt2.py):

    manifest.json   what the model is and how to serve it (format below, FORMAT_VERSION)
    vocab.txt       the vocabulary, one token per line, id = line number from 0

The archive is written to a temporary file in the version folder and renamed into place, so a
server that watches the store never sees a half-written model.pt.
"""
import datetime
import json
import os
import tempfile
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from qvi import __version__
from qvi import pt2
from qvi.models import ModelConfig, build_model, output_spec
from qvi.tokenizer import TokenizerConfig, Vocabulary, config_to_json

FORMAT_VERSION = 1
SUBWORD_FORMAT_VERSION = 2  # a sub-word model's (qvi.hf_import, qvi.finetune): tokenizer.json, no vocab.txt
MANIFEST = "manifest.json"
VOCAB = "vocab.txt"
TOKENIZER = "tokenizer.json"  # a sub-word model's (format 2: qvi.hf_import, qvi.finetune)
PREDICTIONS = ("logits", "emissions", "tags")

# Batching defaults the server starts from; a server-side override file may change them.
DEFAULT_SERVING = {"max_batch_size": 32, "max_batch_tokens": 4096, "max_queue_delay_ms": 2.0}


def build_manifest(name: str, config: ModelConfig, tokenizer: TokenizerConfig, vocab: Vocabulary,
                   labels: List[str], scheme: str, model_card: Dict[str, object],
                   serving: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    outputs = output_spec(config)
    manifest: Dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "task": config.task,
        "architecture": {"name": config.arch, "display_name": config.display_name(),
                         "interaction": config.g, "config": config.to_json()},
        "tokenizer": dict(config_to_json(tokenizer), vocab_file=VOCAB, vocab_size=len(vocab)),
        "inputs": {"token_ids": {"shape": ["B", "T"], "dtype": "int64"},
                   "mask": {"shape": ["B", "T"], "dtype": "bool"}},
        "outputs": outputs,
        "explanations": [k for k in outputs if k not in PREDICTIONS],
        "serving": dict(DEFAULT_SERVING, **(serving or {})),
        "pt2": pt2.export_status(config.arch),
        "model_card": dict(model_card),
    }
    if config.task == "classification":
        manifest["labels"] = list(labels)
    else:
        manifest["tags"] = list(labels)
        manifest["tag_scheme"] = scheme
        manifest["entity_types"] = sorted({t.split("-", 1)[1] for t in labels if "-" in t})
    card = manifest["model_card"]
    assert isinstance(card, dict)
    card.setdefault("date", datetime.date.today().isoformat())
    card.setdefault("torch_version", torch.__version__.split("+")[0])
    card.setdefault("exporter_version", __version__)
    return manifest


def export(model: nn.Module, manifest: Dict[str, object], vocab: Vocabulary, store: str,
           version: int) -> str:
    """Scripts `model` and writes it with its manifest and vocabulary to
    <store>/<manifest name>/<version>/model.pt. Returns the path."""
    return export_files(model, manifest, {VOCAB: vocab.to_text()}, store, version)


def export_files(model: nn.Module, manifest: Dict[str, object], files: Dict[str, str], store: str,
                 version: int) -> str:
    """export() with the artifact's other files given by name (an imported encoder carries its
    tokenizer.json where a zoo model carries vocab.txt)."""
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}")
    folder = os.path.join(store, str(manifest["name"]), str(version))
    os.makedirs(folder, exist_ok=True)
    scripted = torch.jit.script(model.eval())
    extra = dict(files, **{MANIFEST: json.dumps(manifest, ensure_ascii=False, indent=1, sort_keys=True)})
    return _save(scripted, extra, folder)


def update_card(path: str, entries: Dict[str, object]) -> str:
    """Puts `entries` on the card of the artifact `path` (model.pt, rewritten atomically with the same weights
    and the files it carries: the zoo's vocab.txt, or a sub-word model's tokenizer.json). The native packages
    beside it keep the card they were compiled with: say so."""
    extra = {MANIFEST: "", VOCAB: "", TOKENIZER: ""}  # a file the artifact lacks reads as ""
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    manifest = json.loads(extra[MANIFEST])
    if manifest.get("format_version") not in (FORMAT_VERSION, SUBWORD_FORMAT_VERSION):
        raise ValueError(f"{path}: manifest format_version {manifest.get('format_version')} is not "
                         f"{FORMAT_VERSION} or {SUBWORD_FORMAT_VERSION}")
    card = manifest.setdefault("model_card", {})
    card.update(entries)
    files = {name: text if isinstance(text, str) else text.decode("utf-8") for name, text in extra.items()
             if name != MANIFEST and text}
    files[MANIFEST] = json.dumps(manifest, ensure_ascii=False, indent=1, sort_keys=True)
    written = _save(module, files, os.path.dirname(os.path.abspath(path)))
    stale = [f for f in os.listdir(os.path.dirname(written)) if f.endswith(".pt2")]
    if stale:
        written += f" (its packages {', '.join(sorted(stale))} keep their old card until compiled again from it)"
    return written


def _save(scripted: torch.jit.ScriptModule, extra: Dict[str, str], folder: str) -> str:
    """Writes folder/model.pt atomically, readable by any user."""
    fd, tmp = tempfile.mkstemp(prefix=".model.pt.", dir=folder)
    os.close(fd)
    try:
        torch.jit.save(scripted, tmp, _extra_files=extra)
        # mkstemp makes the file private (0600); give it the mode of any new file, so that a server
        # running as another user (the image's uid 10001) can read it.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        path = os.path.join(folder, "model.pt")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load(path: str, device: str = "cpu") -> Tuple[torch.jit.ScriptModule, Dict[str, object], Vocabulary]:
    """Loads an artifact: (scripted model in eval mode, manifest, vocabulary). An imported sub-word model
    (qvi.hf_import, manifest format 2) has no vocab.txt: its tokenizer.json is read by the server, and the
    zoo's commands that tokenize (evaluate, faithfulness, export of packages) refuse it, naming why."""
    extra = {MANIFEST: "", VOCAB: ""}
    module = torch.jit.load(path, map_location=device, _extra_files=extra)
    manifest = json.loads(extra[MANIFEST])
    if manifest.get("format_version") not in (FORMAT_VERSION, SUBWORD_FORMAT_VERSION):
        raise ValueError(f"{path}: manifest format_version {manifest.get('format_version')} is not {FORMAT_VERSION}")
    if manifest.get("tokenizer", {}).get("level") == "subword":
        raise ValueError(f"{path} is a sub-word model (imported with `python -m qvi import`): the zoo's word "
                         "tokenizer cannot read for it; serve it, and ask the server for its answers")
    vocab = Vocabulary.from_text(extra[VOCAB] if isinstance(extra[VOCAB], str) else extra[VOCAB].decode("utf-8"))
    module.eval()
    return module, manifest, vocab


def write_null(model_pt: str, folder: str) -> str:
    """Writes <folder>/model.null: the manifest and vocabulary of the artifact `model_pt`, which the
    server's null backend serves with no math (bench/run.py --null measures the serving path with it)."""
    _, manifest, vocab = load(model_pt)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.null")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"manifest": manifest, "vocab": vocab.to_text().splitlines()}, f, ensure_ascii=False)
    return path


def package_artifact(model_pt: str, device: str = "cpu", cpu_target: str = pt2.DEFAULT_CPU_TARGET,
                     cache: Optional[str] = None, freezing: str = pt2.DEFAULT_FREEZING) -> str:
    """Compiles the model of a TorchScript artifact (its weights, manifest and vocabulary) into the
    .pt2 beside it (see write_cached)."""
    module, manifest, vocab = load(model_pt)
    model = build_model(ModelConfig(**manifest["architecture"]["config"])).eval()  # type: ignore[index]
    model.load_state_dict(module.state_dict())
    folder = os.path.dirname(os.path.abspath(model_pt))
    return pt2.write_cached(model, manifest, vocab.to_text(), folder, device, cpu_target, cache, freezing=freezing)
