"""`python -m qvi faithfulness` on an imported sub-word model (qvi.hf_import): the model seen word by word.

qvi.faithfulness ranks, deletes and keeps *tokens*; the server answers an imported model per *word* (the
tokenizer's pre-tokenizer pieces, server/core/serving/subwords.h). `WordLevel` makes the words the tokens:
its ids are word ids of a table built from the split (each word the sub-word ids the tokenizer reads it as),
and each forward pass spells every row out in sub-words with the special tokens around them, runs the
encoder, and groups its outputs into words by the server's rules (attention summed over a word's sub-words,
a tagger's emissions and tags its first sub-word's, maps averaged over the rows and summed over the columns
of a word; a fine-tuned model's contributions summed and β averaged; a CRF tagger's tags Viterbi's over the
sub-words). Deleting a token is then deleting a word, as the server's occlusion does; the "pad" removal
replaces a word by the tokenizer's padding token. Gradient methods are not offered: their attributions
would be per sub-word embedding.
"""
import json
from dataclasses import dataclass, fields
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from qvi.hf_encoders import Encoder, EncoderConfig

METHODS = ("random", "alpha", "contribution", "last_layer", "rollout", "occlusion")  # those a word-level view supports


@dataclass
class WordConfig:
    """What qvi.faithfulness reads of a model's config."""
    task: str
    name: str

    def display_name(self) -> str:
        return self.name


class WordLevel(nn.Module):
    def __init__(self, encoder: Encoder, words: List[List[int]], prefix: List[int], suffix: List[int]):
        """words[i]: the sub-word ids of word id i (word id 0 is the padding token)."""
        super().__init__()
        self.encoder = encoder.eval()
        self.words = words
        self.prefix = prefix
        self.suffix = suffix
        self.tagging = encoder.task == "tagging"

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        b, w = ids.shape
        rows: List[List[int]] = []
        spans: List[List[Tuple[int, int]]] = []
        for r in range(b):
            row, at = list(self.prefix), []
            for word in ids[r][mask[r]].tolist():
                at.append((len(row), len(row) + len(self.words[word])))
                row.extend(self.words[word])
            rows.append(row + self.suffix)
            spans.append(at)
        t = max(len(row) for row in rows)
        sub = torch.zeros(b, t, dtype=torch.long)
        sub_mask = torch.zeros(b, t, dtype=torch.bool)
        summed = torch.zeros(b, w, t)
        for r, row in enumerate(rows):
            sub[r, :len(row)] = torch.tensor(row)
            sub_mask[r, :len(row)] = True
            for k, (s, e) in enumerate(spans[r]):
                summed[r, k, s:e] = 1.0
        mean = summed / summed.sum(-1, keepdim=True).clamp(min=1.0)
        out = self.encoder._run(sub, sub_mask, True)
        words: Dict[str, torch.Tensor] = {
            "attention": torch.bmm(summed, out["attention"].unsqueeze(-1)).squeeze(-1),
            # [B,L,H,T,T] -> [B,L,H,W,W]: from a word the mean of its rows, to a word the sum of its columns
            "layer_attention": mean[:, None, None] @ out["layer_attention"] @ summed[:, None, None].transpose(-1, -2),
        }
        if "gates" in out:  # β of a fine-tuned QVI model, averaged over a word's sub-words as the server does
            words["gates"] = torch.bmm(mean, out["gates"].unsqueeze(-1)).squeeze(-1)
        if not self.tagging:
            words["logits"] = out["logits"]
            if "contribution" in out:  # a word's exact share: its sub-words' summed
                words["contribution"] = torch.bmm(summed, out["contribution"])
            return words
        first = torch.tensor([[s for s, _ in at] + [0] * (w - len(at)) for at in spans])
        emissions = out["emissions"].gather(1, first.unsqueeze(-1).expand(-1, -1, out["emissions"].size(-1)))
        words["emissions"] = emissions
        # A CRF tagger's tags are Viterbi's over the sub-words (as the server decodes), each word its first's.
        decoded = out["tags"].gather(1, first) if "tags" in out and self.encoder.crf is not None else emissions.argmax(-1)
        words["tags"] = torch.where(mask, decoded, torch.full_like(ids, -1))
        return words


def special_tokens(tokenizer) -> Tuple[List[int], List[int]]:
    """The ids the post-processor puts before and after a text ([CLS] / [SEP]; <s> / </s>)."""
    enc = tokenizer.encode("x")
    real = [i for i, w in enumerate(enc.word_ids) if w is not None]
    return enc.ids[:real[0]], enc.ids[real[-1] + 1:]


def word_level(path: str, texts: Sequence[str]) -> Tuple[WordLevel, WordConfig, Dict[str, object], List[List[int]]]:
    """The artifact `path` (an imported model.pt) seen word by word, its config and manifest, and `texts`
    as word ids, truncated as the server truncates them (at max_tokens, special tokens included)."""
    from tokenizers import Tokenizer  # pinned in requirements-test.txt, which both README commands install
    extra = {"manifest.json": "", "tokenizer.json": ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    manifest = json.loads(extra["manifest.json"])
    config = manifest["architecture"]["config"]
    # Fields a later zoo added (pooling, qvi_layers, crf, dropout) are absent from older models: their defaults.
    encoder = Encoder(EncoderConfig(**{f.name: config[f.name] for f in fields(EncoderConfig)
                                       if f.name in config})).eval()
    encoder.load_state_dict(module.state_dict())
    tokenizer = Tokenizer.from_str(extra["tokenizer.json"] if isinstance(extra["tokenizer.json"], str)
                                   else extra["tokenizer.json"].decode("utf-8"))
    tokenizer.no_padding()  # the server ignores the file's padding and truncation, and truncates at max_tokens
    prefix, suffix = special_tokens(tokenizer)
    tokenizer.enable_truncation(int(manifest["tokenizer"]["max_tokens"]))
    table: Dict[Tuple[int, ...], int] = {}
    words: List[List[int]] = [[encoder.pad_id]]  # word id 0: the padding token (config.json's pad_token_id)
    encoded = []
    for text in texts:
        enc = tokenizer.encode(text)
        pieces: Dict[int, List[int]] = {}
        for i, w in zip(enc.ids, enc.word_ids):
            if w is not None:
                pieces.setdefault(w, []).append(i)
        row = []
        for w in sorted(pieces):
            key = tuple(pieces[w])
            if key not in table:
                table[key] = len(words)
                words.append(list(key))
            row.append(table[key])
        encoded.append(row)
    name = f"{manifest['architecture']['display_name']}"
    return WordLevel(encoder, words, prefix, suffix), WordConfig(manifest["task"], name), manifest, encoded
