"""The fine-tuned MiniLM encoder (qvi/finetune.py) served by QVI Serve, side by side with ONNX Runtime -- the CPU
runtime users reach for -- running the same model in-process (issue 75, item 4). In one run on the same cores:

  ORT in-process        the encoder exported to ONNX (logits only, what a user would export), onnxruntime (pinned
                        in requirements-test.txt) with every graph optimisation, the machine's threads; and the
                        same graph through ORT's transformer optimizer (onnxruntime.transformers, model type
                        bert: the fusions optimum applies), the fused operators it made counted
  TorchScript / pt2     the artifact's model.pt and its AOTInductor package (the server's runtime, here called from
                        Python), forward without maps: logits, α, β and contributions; and each reduced-precision
                        package the version holds (`python -m qvi finetune-packages` writes those that pass the
                        fidelity gate and beat float32: model.cpu.x86-64-v4-bf16.pt2, ...-int8.pt2)
  server end to end     build/qvi-server on the artifact (its "auto" package: the first of int8, bf16, float32 the
                        version holds), build/qvi-perf over gRPC (Classify): one text per request from 1 caller
                        and from 8 (the server batches their texts), 32 per request from 2 callers; tokenization
                        and the answer's explanations per word included

on the same texts: ~20-word texts (the sentiment test split) and ~100-word texts (BBC test articles cut to their
first 100 words), tokenized once with the model's tokenizer.json for the in-process rows (the server tokenizes
itself). Every row is texts/s; the in-process rows pad each batch to its longest text, as the server batches.

    .venv/bin/python bench/ort_side_by_side.py [--model model_store/store/sentiment-minilm/1] [--seconds 10]

With the bf16 package (a copy of the demo model, so that the demo store stays float32):

    mkdir -p /tmp/v && cp -a model_store/store/sentiment-minilm /tmp/v/ && (cd model_store &&
      ../.venv/bin/python -m qvi finetune-packages --model /tmp/v/sentiment-minilm/1/model.pt --pt2-cache work/pt2)
    .venv/bin/python bench/ort_side_by_side.py --model /tmp/v/sentiment-minilm/1 --seconds 5

Without the demo model (scripts/run.sh fine-tunes it), --build makes one of the same architecture with an
untrained head into bench/models/minilm-qvi (speed does not depend on the weights).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "model_store"))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import torch  # noqa: E402

DATA = os.path.join(REPO, "model_store", "data")
PRETRAINED = os.path.join(REPO, "model_store", "pretrained", "all-minilm-l6-v2")


def texts():
    short = [line.rstrip("\n").split("\t", 1)[1] for line in open(os.path.join(DATA, "sentiment", "test.tsv"),
                                                                   encoding="utf-8")]
    long = [" ".join(line.rstrip("\n").split("\t", 1)[1].split()[:100])
            for line in open(os.path.join(DATA, "bbc", "test.tsv"), encoding="utf-8")]
    return {"~20 words": short[:512], "~100 words": long}


def build(folder_root):
    """An artifact of the demo model's architecture (QVI pooling on MiniLM), head untrained, with its pt2."""
    from qvi.finetune import FinetuneOptions, export, pretrained_encoder
    model, c = pretrained_encoder(PRETRAINED, "classification", ["negative", "positive"],
                                  FinetuneOptions(pooling="qvi", dropout=0.0))
    report = {"task": "sentiment", "options": {"max_tokens": 128}, "history": [], "test": {},
              "note": "UNTRAINED head: for speed measurements only"}
    path = export(model.eval(), c, ["negative", "positive"], report, PRETRAINED, folder_root, "minilm-qvi", 1,
                  package=True)
    return os.path.dirname(path)


def encoder_of(version):
    """The artifact's model as the zoo's Encoder (for the ONNX export), its weights from model.pt."""
    from qvi.hf_encoders import Encoder, EncoderConfig
    config = dict(manifest_of(version)["architecture"]["config"])
    for extra in ("max_tokens", "source_architecture"):
        config.pop(extra, None)
    c = EncoderConfig(**config)
    model = Encoder(c).eval()
    model.load_state_dict(torch.jit.load(os.path.join(version, "model.pt")).state_dict())
    return model


class LogitsOnly(torch.nn.Module):
    """A model's logits alone, `logits(model, token_ids, mask)`: what a user would export to ONNX."""

    def __init__(self, model, logits):
        super().__init__()
        self.model = model  # registered: its weights are the graph's
        self.logits = logits

    def forward(self, token_ids, mask):
        return self.logits(self.model, token_ids, mask)


def batches(encodings, size):
    out = []
    for i in range(0, len(encodings), size):
        chunk = encodings[i:i + size]
        t = max(len(e) for e in chunk)
        ids = torch.zeros(len(chunk), t, dtype=torch.long)
        mask = torch.zeros(len(chunk), t, dtype=torch.bool)
        for r, e in enumerate(chunk):
            ids[r, :len(e)] = torch.tensor(e)
            mask[r, :len(e)] = True
        out.append((ids, mask))
    return out


def rate(run, work, seconds):
    """texts/s of `run` over the batches `work`, cycled for `seconds` after one warm-up pass."""
    for ids, mask in work:
        run(ids, mask)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for ids, mask in work:
            run(ids, mask)
            n += ids.size(0)
    return n / (time.perf_counter() - t0)


def manifest_of(version):
    """The manifest model.pt carries."""
    extra = {"manifest.json": ""}
    torch.jit.load(os.path.join(version, "model.pt"), map_location="cpu", _extra_files=extra)
    text = extra["manifest.json"]
    return json.loads(text if isinstance(text, str) else text.decode("utf-8"))


def server_rates(version, sets, seconds):
    """texts/s of the server end to end: {(texts, per request, callers): rate}."""
    from qvi_testing import ServerProcess
    work = tempfile.mkdtemp(prefix="qvi_ort_")
    store = os.path.join(work, "store")
    name = manifest_of(version)["name"]  # the server serves a version only under its manifest's name
    os.makedirs(os.path.join(store, name))
    os.symlink(os.path.abspath(version), os.path.join(store, name, "1"))
    proc = ServerProcess(store, work)  # its own thread choice, as deployed
    out = {}
    try:
        loaded = re.search(r"from (\S+\.pt2) \(pt2, (\w+)", proc.log())
        print(f"the server serves {name} from {loaded.group(1)} ({loaded.group(2)})" if loaded else
              f"the server's log does not say which package it loaded for {name}", flush=True)
        for label, items in sets.items():
            path = os.path.join(work, "texts.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(t.replace("\n", " ") for t in items) + "\n")
            for per_request, concurrency in ((1, 1), (1, 8), (32, 2)):
                result = os.path.join(work, "perf.json")
                subprocess.run([os.path.join(REPO, "build", "qvi-perf"), "--server", proc.address, "--model", name,
                                "--texts-file", path, "--texts-per-request", str(per_request), "--concurrency",
                                str(concurrency), "--duration", str(seconds), "--json", result],
                               check=True, capture_output=True, timeout=seconds * 4 + 120)
                with open(result, encoding="utf-8") as f:
                    steps = json.load(f)
                out[(label, per_request, concurrency)] = steps["steps"][0]["texts_per_s"]
    finally:
        proc.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def export_onnx(module, example, path):
    torch.onnx.export(module, example, path, input_names=["token_ids", "mask"], output_names=["logits"],
                      dynamic_axes={"token_ids": {0: "B", 1: "T"}, "mask": {0: "B", 1: "T"}}, dynamo=False,
                      opset_version=17)
    return path


def ort_sessions(model, example, heads, hidden, threads):
    """{row name: ONNX Runtime session}: the artifact's own model as exported and after the transformer optimizer,
    and transformers' BertForSequenceClassification of the same MiniLM ([CLS] head, untrained), optimized: the
    graph a user exporting a plain fine-tuned MiniLM with optimum would run (its attention fuses; ours does not)."""
    import onnxruntime as ort
    import transformers
    from onnxruntime.transformers import optimizer
    from safetensors.torch import load_file
    # The graphs (350 MB) are read into the sessions; the folder goes when they are made.
    with tempfile.TemporaryDirectory(prefix="qvi_onnx_") as work:
        cfg = transformers.BertConfig.from_json_file(os.path.join(PRETRAINED, "config.json"))
        cfg.num_labels = 2
        bert = transformers.BertForSequenceClassification._from_config(cfg, attn_implementation="eager").eval()
        state = {"bert." + k: v for k, v in load_file(os.path.join(PRETRAINED, "model.safetensors")).items()}
        bert.load_state_dict(state, strict=False)
        # eval(): the exporter puts a wrapper back in the mode it found it in, and a new module is in training mode
        ours = LogitsOnly(model, lambda m, ids, mask: m._run(ids, mask, False)["logits"]).eval()
        theirs = LogitsOnly(bert, lambda m, ids, mask: m(input_ids=ids, attention_mask=mask.long()).logits).eval()
        paths = {"ORT, this model": export_onnx(ours, example, os.path.join(work, "qvi.onnx")),
                 "ORT, transformers' BERT": export_onnx(theirs, example, os.path.join(work, "bert.onnx"))}
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sessions = {}
        for name, path in paths.items():
            if name == "ORT, this model":
                sessions[name] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            fused = optimizer.optimize_model(path, model_type="bert", num_heads=heads, hidden_size=hidden)
            fused.save_model_to_file(path + ".fused")
            stats = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
            print(f"{name}: the transformer optimizer fused {stats}", flush=True)
            sessions[name + " (optimized)"] = ort.InferenceSession(path + ".fused", so,
                                                                   providers=["CPUExecutionProvider"])
        return sessions


def same_function(runners, scripted, tok):
    """The ORT rows of this model compute what model.pt computes: their logits on two padded batches of test texts."""
    items = texts()["~20 words"]
    for ids, mask in batches([e.ids for e in tok.encode_batch(items[:64])], 32):
        with torch.no_grad():
            want = scripted.forward_without_maps(ids, mask)["logits"]
        for name, run in runners.items():
            if "this model" in name:
                gap = float((torch.from_numpy(run(ids, mask)[0]) - want).abs().max())
                print(f"{name}: logits within {gap:.1e} of model.pt's", flush=True)
                if gap > 1e-3:
                    raise SystemExit(f"{name} does not compute this model (logits {gap:.3g} apart)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(REPO, "model_store", "store", "sentiment-minilm", "1"))
    p.add_argument("--build", action="store_true", help="build an untrained-head model of the same architecture")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    a = p.parse_args()
    version = build(os.path.join(REPO, "bench", "models")) if a.build else a.model
    from tokenizers import Tokenizer
    torch.set_num_threads(a.threads)
    manifest = manifest_of(version)
    tok = Tokenizer.from_file(os.path.join(PRETRAINED, "tokenizer.json"))  # the one model.pt carries
    tok.no_padding()
    tok.enable_truncation(int(manifest["tokenizer"]["max_tokens"]))  # as the server truncates
    config = manifest["architecture"]["config"]
    example = batches([tok.encode("a short example text").ids] * 2, 2)[0]
    runners = {name: (lambda s: lambda i, m: s.run(None, {"token_ids": i.numpy(), "mask": m.numpy()}))(session)
               for name, session in ort_sessions(encoder_of(version), example, int(config["heads"]),
                                                 int(config["hidden"]), a.threads).items()}
    scripted = torch.jit.load(os.path.join(version, "model.pt"))
    same_function(runners, scripted, tok)
    runners.update(in_process(version, scripted))
    sets = texts()
    rows = {}
    for name, items in sets.items():
        enc = [e.ids for e in tok.encode_batch(items)]
        for size in (1, 32):
            work = batches(enc, size)
            with torch.no_grad():
                rates = {runner: rate(run, work, a.seconds) for runner, run in runners.items()}
            rows[(name, size)] = (sum(len(e) for e in enc) / len(enc), rates)
            print(f"{name}, {size} per call: " + ", ".join(f"{k} {v:.1f}" for k, v in rates.items()), flush=True)
    served = server_rates(version, sets, a.seconds)
    print(f"\n{os.cpu_count()} cores ({a.threads} threads in-process); texts/s; x: against the fastest ORT row at the "
          "same texts per call\n")
    table(rows, served)


def in_process(version, scripted):
    """{row name: runner} of the server's runtimes called from Python: model.pt's TorchScript, and each package the
    version holds (model.cpu.pt2, and the bf16 and int8 ones where `qvi finetune-packages` kept them)."""
    from qvi import pt2
    runners = {"TorchScript in-process": lambda i, m: scripted.forward_without_maps(i, m)}
    for variant in ("base", "x86-64-v4-bf16", "x86-64-v4-int8"):
        file = pt2.FILES["cpu"] if variant == "base" else pt2.variant_file(variant)
        if os.path.exists(os.path.join(version, file)):
            package = pt2.load_methods(os.path.join(version, file))["without_maps"]  # as the server loads it
            name = "pt2 in-process" if variant == "base" else f"pt2 {pt2.CPU_VARIANTS[variant][1]} in-process"
            runners[name] = (lambda p: lambda i, m: p(i, m))(package)
    return runners


def table(rows, served):
    """The markdown table: each in-process row and the server's, x against the fastest ORT row of its kind."""
    names = list(next(iter(rows.values()))[1])
    print("| texts | sub-words | per call | " + " | ".join(names) + " | server, 1 caller | server, 8 callers (1 per "
          "call) or 2 (32) |")
    print("|---|---:|---:|" + "---:|" * (len(names) + 2))
    for (name, size), (tokens, rates) in rows.items():
        base = max(v for n, v in rates.items() if n.startswith("ORT"))
        cells = [f"{rates[n]:,.1f}" + ("" if n.startswith("ORT") else f" ({rates[n] / base:.2f}x)") for n in names]
        for key in ((name, size, 1), (name, size, 8 if size == 1 else 2)):
            cells.append(f"{served[key]:,.1f} ({served[key] / base:.2f}x)" if key in served else "")
        print(f"| {name} | {tokens:.0f} | {size} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
