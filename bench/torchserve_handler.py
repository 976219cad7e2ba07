"""TorchServe handler for the benchmark: serves the same model.pt as qvi-server through TorchServe's
own inference API (POST /predictions/<model>, one text per request body). TorchServe batches the
requests (batch size and delay set when the model is registered); the handler tokenises with the
model zoo's reference tokenizer, pads, runs the TorchScript model once per batch and returns each
text's best label and score.

QVI_MODEL_STORE_PY names the folder that holds the `qvi` package (the harness sets it)."""
import os
import sys

import torch
from ts.torch_handler.base_handler import BaseHandler


class QviHandler(BaseHandler):
    def initialize(self, context):
        sys.path.insert(0, os.environ["QVI_MODEL_STORE_PY"])
        from qvi import artifact
        from qvi.tokenizer import config_from_json, encode
        torch.set_num_threads(int(os.environ.get("QVI_TORCH_THREADS", "1")))
        model_dir = context.system_properties.get("model_dir")
        self.module, manifest, self.vocab = artifact.load(os.path.join(model_dir, "model.pt"))
        self.dev = torch.device(os.environ.get("QVI_DEVICE", "cpu"))
        self.module = self.module.to(self.dev)
        self.cfg = config_from_json(manifest["tokenizer"])
        self.labels = manifest["labels"]
        self.encode = encode
        self.initialized = True

    def handle(self, data, context):
        texts = []
        for row in data:
            body = row.get("data") or row.get("body") or b""
            texts.append(body.decode("utf-8") if isinstance(body, (bytes, bytearray)) else str(body))
        encs = [self.encode(t, self.cfg, self.vocab) for t in texts]
        width = max(1, max(len(e.ids) for e in encs))
        ids = torch.zeros(len(encs), width, dtype=torch.long)
        mask = torch.zeros(len(encs), width, dtype=torch.bool)
        for i, e in enumerate(encs):
            ids[i, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
            mask[i, :len(e.ids)] = True
        with torch.inference_mode():
            probs = self.module(ids.to(self.dev), mask.to(self.dev))["logits"].softmax(-1).cpu()
        out = []
        for row in probs:
            best = int(row.argmax())
            out.append({"label": self.labels[best], "score": float(row[best])})
        return out
