"""The benchmark harness: in ONE run, on the same model and the same texts, for short (~20 words) and
long (~100 words) texts (--words), it measures

  1. the limit: the model called in-process from C++ (qvi-bench-model), both formats side by side (the
     AOTInductor package qvi-server loads and the TorchScript file the peers run), batch sizes 1..max;
  2. qvi-server at its defaults under qvi-perf at increasing concurrency (with the server's own
     queue/compute split);
  3. a plain Python gRPC server (bench/python_server.py: grpcio + torch, one forward per request);
  4. TorchServe (from PyPI, JDK from Debian) serving the same model.pt through its own inference API
     with its default of one worker per core,

and writes the results as JSON, markdown tables and a PNG plot (throughput against p99 latency, one
line per system, one panel per text length) into BENCHMARKS.md, with the command that reproduces them
and the machine.

    .venv/bin/python bench/run.py                 # the full run; rewrites BENCHMARKS.md
    .venv/bin/python bench/run.py --smoke         # seconds-long check that every part works (CI);
                                                  # writes into a temporary folder, gates on nothing
    .venv/bin/python bench/run.py --null          # only the serving path alone (null_bench.py, three
                                                  # rounds, ~5 min), into bench/results/results.json
                                                  # and BENCHMARKS.md

The full run also measures the serving path alone (5.): qvi-server with the null backend, which does
no math, through gRPC, OIP and HTTP/JSON, pinned apart from its load generator (bench/null_bench.py);
and (6.) the native CPU packages (x86-64-v4, bf16, int8) of the demo models and of the BERT-base-sized
bench model against their TorchScript files, through the exporter's gates (bench/cpu_packages.py; about
40 minutes more the first time, for the exports, 10 after):

    .venv/bin/python bench/run.py --cpu-packages-only   # only (6.), into results.json and BENCHMARKS.md
Needs scripts/setup.sh (the build, the demo models, TorchServe and matplotlib in .venv).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import cpu_packages
import null_bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(REPO, "build")
PY = sys.executable
MODEL = "sentiment"
MODEL_DIR = os.path.join(REPO, "model_store", "store", MODEL, "1")
MODEL_PT = os.path.join(MODEL_DIR, "model.pt")


def log(msg):
    print(f"[bench] {msg}", flush=True)


def wait_for_file(path, proc, what, timeout=180):
    deadline = time.monotonic() + timeout
    while not (os.path.exists(path) and os.path.getsize(path) > 0):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in {timeout} s")
        time.sleep(0.1)
    with open(path) as f:
        return int(f.read())


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def perf(work, label, args, common, prefix=()):
    out = os.path.join(work, f"{label}.json")
    cmd = [*prefix, os.path.join(BUILD, "qvi-perf"), *args, *common, "--json", out, "--label", label]
    log(" ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd))
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def model_line():
    """What the demo classifier is, from its manifest (inside model.pt, a zip archive)."""
    import zipfile
    with zipfile.ZipFile(MODEL_PT) as z:
        manifest = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/manifest.json"))))
    arch = manifest["architecture"]
    c = arch["config"]
    return (f"{arch['display_name']}, {c.get('layers')} layers, {c.get('heads')} heads, width {c.get('hidden')}, "
            f"{c.get('emb_dim')}-d embeddings")


def machine():
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    import torch
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def served_format(version_dir):
    """The format qvi-server loads from a version folder by default: its .pt2 for the CPU when there is one."""
    return "pt2" if os.path.exists(os.path.join(version_dir, "model.cpu.pt2")) else "torchscript"


def bench_model(work, a, name, version_dir, fmt, batch_sizes, words, *extra):
    """Runs qvi-bench-model on one version folder (its command logged) and returns its JSON report,
    written to <work>/<name>.json."""
    out = os.path.join(work, f"{name}.json")
    cmd = [os.path.join(BUILD, "qvi-bench-model"), "--model", version_dir, "--format", fmt,
           "--batch-sizes", batch_sizes, *extra, "--seconds", str(a.duration), "--words", str(words),
           "--device", a.device, "--json", out]
    log(" ".join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd))
    subprocess.run(cmd, check=True)
    with open(out) as f:
        return json.load(f)


def run_limit(work, a, words):
    """Both backends' in-process limits, side by side at each batch size (qvi-bench-model --format both)."""
    fmt = "both" if served_format(MODEL_DIR) == "pt2" else "torchscript"
    # On a GPU, with and without CUDA graphs side by side (what the server does: with).
    graphs = ["--cuda-graphs", "both"] if a.device != "cpu" else []
    return bench_model(work, a, "limit", MODEL_DIR, fmt, a.batch_sizes, words, *graphs)


IDLE_US = 300  # about the time a lone caller's request spends outside the model (round trip, gRPC)


def run_idle(work, a, words):
    """The served format's batch-1 forward back to back and after an IDLE_US sleep, side by side
    (qvi-bench-model --idle-us): what the forward of a lone caller's request costs once the instance
    thread has slept between requests, the in-process part of the added latency at concurrency 1."""
    r = bench_model(work, a, "idle", MODEL_DIR, served_format(MODEL_DIR), "1", words, "--idle-us", f"0,{IDLE_US}")
    return {st["idle_us"]: st for st in r["steps"]}


def run_maps(work, a, model_pt, label, batch_sizes, words):
    """The in-process forward asking for α and β, without and with the per-layer attention maps,
    side by side at each batch size (qvi-bench-model --maps both)."""
    version_dir = os.path.dirname(model_pt)
    r = bench_model(work, a, f"maps_{label}", version_dir, served_format(version_dir), batch_sizes, words,
                    "--maps", "both", "--explain")
    r["label"] = label
    return r


def bert_base_models():
    """The UNTRAINED BERT-base-sized bench models (python -m qvi bench-model), exported once into
    bench/models/ (ignored by git; about 660 MB for both)."""
    store = os.path.join(REPO, "bench", "models")
    paths = {}
    for dtype, name in (("float32", "bert_base_qvi"), ("bfloat16", "bert_base_qvi_bf16")):
        path = os.path.join(store, name, "1", "model.pt")
        if not os.path.exists(path):
            log(f"exporting {name} (untrained, benchmarks only) into bench/models")
            subprocess.run([PY, "-m", "qvi", "bench-model", "--store", store, "--dtype", dtype], check=True,
                           cwd=os.path.join(REPO, "model_store"))
        paths[name] = path
    return paths


def run_cpu_packages(work, a):
    """The native CPU packages side by side (bench/cpu_packages.py)."""
    models = [m for m in a.cpu_packages.split(",") if m]
    unknown = sorted(set(models) - set(cpu_packages.MODELS))
    if unknown:
        raise SystemExit(f"--cpu-packages: no such model {', '.join(unknown)} (one of {', '.join(cpu_packages.MODELS)})")
    return cpu_packages.run(work, models, log, BUILD)


def run_qvi_server(work, a, common, run):
    port_file, metrics_file = os.path.join(work, "qvi.port"), os.path.join(work, "qvi.metrics")
    http_file = os.path.join(work, "qvi.http")
    # A copy of the store whose serving.json sets the batch size the limit found fastest; everything else
    # (instances, torch threads) at the server's defaults.
    store = os.path.join(work, "qvi_store")
    shutil.copytree(os.path.join(REPO, "model_store", "store", MODEL), os.path.join(store, MODEL))
    with open(os.path.join(store, MODEL, "serving.json"), "w") as f:
        json.dump({"max_batch_size": run["max_batch"]}, f)
    log_path = os.path.join(work, "qvi-server.log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([os.path.join(BUILD, "qvi-server"), "--model-store", store,
                                 "--port", "0", "--port-file", port_file, "--metrics-port", "0",
                                 "--metrics-port-file", metrics_file, "--host", "127.0.0.1", "--device", a.device,
                                 "--http-port", "0", "--http-port-file", http_file],
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        port = wait_for_file(port_file, proc, "qvi-server")
        metrics = wait_for_file(metrics_file, proc, "qvi-server")
        target = ["--server", f"127.0.0.1:{port}", "--metrics", f"http://127.0.0.1:{metrics}/metrics"]
        r = perf(work, "qvi-server", target, common)
        # The same server and texts through the Open Inference Protocol (ModelInfer), right after.
        r["oip"] = perf(work, "qvi-server-oip", [*target, "--protocol", "oip"], common)
        # And through the HTTP/JSON route (POST /v1/models/{m}:classify), by a blocking client thread per
        # connection (qvi-perf --http, as for TorchServe).
        http_port = wait_for_file(http_file, proc, "qvi-server")
        r["http"] = perf(work, "qvi-server-http",
                         ["--http", f"http://127.0.0.1:{http_port}/v1/models/{MODEL}:classify", "--http-body", "json",
                          "--metrics", f"http://127.0.0.1:{metrics}/metrics"], common)
    finally:
        stop(proc)
    # What its defaults chose on this machine, from its start-up line.
    with open(log_path) as f:
        m = re.search(r"models on the \w+: (\d+) instance\(s\) per model, (\d+) torch thread", f.read())
    if m:
        r["instances"], r["torch_threads"] = int(m.group(1)), int(m.group(2))
    return r


def run_python_server(work, a, common, run):
    port_file = os.path.join(work, "py.port")
    proc = subprocess.Popen([PY, os.path.join(REPO, "bench", "python_server.py"), "--model-pt", MODEL_PT,
                             "--port-file", port_file, "--workers", "4", "--device", a.device])
    try:
        port = wait_for_file(port_file, proc, "python_server.py")
        return perf(work, "python-grpc", ["--server", f"127.0.0.1:{port}"], common)
    finally:
        stop(proc, signal.SIGKILL)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchserve(work, a, common, run):
    bindir = os.path.dirname(PY)
    store = os.path.join(work, "ts_store")
    os.makedirs(store)
    subprocess.run([os.path.join(bindir, "torch-model-archiver"), "--model-name", MODEL, "--version", "1.0",
                    "--serialized-file", MODEL_PT, "--handler", os.path.join(REPO, "bench", "torchserve_handler.py"),
                    "--export-path", store], check=True)
    inference, management, metrics = free_port(), free_port(), free_port()
    config = os.path.join(work, "ts.properties")
    # TorchServe's own default on a machine without a GPU: one worker per core, each with one torch thread.
    workers = os.cpu_count()
    models = {MODEL: {"1.0": {"defaultVersion": True, "marName": f"{MODEL}.mar", "minWorkers": workers,
                              "maxWorkers": workers, "batchSize": run["torchserve_batch"], "maxBatchDelay": 2,
                              "responseTimeout": 120}}}
    with open(config, "w") as f:
        f.write(f"inference_address=http://127.0.0.1:{inference}\nmanagement_address=http://127.0.0.1:{management}\n"
                f"metrics_address=http://127.0.0.1:{metrics}\nmodel_store={store}\nload_models={MODEL}.mar\n"
                f"models={json.dumps(models)}\ndisable_system_metrics=true\ninstall_py_dep_per_model=false\n"
                f"default_workers_per_model={workers}\njob_queue_size=1000\nnumber_of_netty_threads=2\n")
    env = dict(os.environ, QVI_MODEL_STORE_PY=os.path.join(REPO, "model_store"), QVI_TORCH_THREADS="1",
               QVI_DEVICE=a.device,
               PATH=bindir + os.pathsep + os.environ.get("PATH", ""), LOG_LOCATION=os.path.join(work, "ts_logs"),
               METRICS_LOCATION=os.path.join(work, "ts_logs"))
    log_file = open(os.path.join(work, "torchserve.log"), "w")
    proc = subprocess.Popen([os.path.join(bindir, "torchserve"), "--start", "--foreground", "--ncs", "--model-store",
                             store, "--ts-config", config, "--disable-token-auth"],
                            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{inference}/predictions/{MODEL}"
        while True:  # ready when the model answers
            if proc.poll() is not None:
                raise RuntimeError(f"torchserve exited; see {log_file.name}")
            try:
                req = urllib.request.Request(url, data=b"a good film", method="POST")
                with urllib.request.urlopen(req, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"torchserve did not serve in 120 s; see {log_file.name}")
            time.sleep(0.5)
        r = perf(work, "torchserve", ["--http", url], common)
        r["workers"] = workers
        return r
    finally:
        subprocess.run([os.path.join(bindir, "torchserve"), "--stop"], env=env, cwd=work, capture_output=True)
        stop(proc)
        log_file.close()


def served_limit(run):
    """The limit steps of the format qvi-server serves (the first the limit lists: pt2 when measured)."""
    steps = run["limit"]["steps"]
    fmt = "pt2" if any(s.get("format") == "pt2" for s in steps) else steps[0].get("format", "torchscript")
    graphs = any(s.get("cuda_graphs") for s in steps)  # the server replays graphs where it has them
    return [s for s in steps if s.get("format", fmt) == fmt and bool(s.get("cuda_graphs")) == graphs]


def best_step(system):
    return max(system["steps"], key=lambda s: s["texts_per_s"])


SYSTEMS = ("qvi-server", "qvi-server-oip", "qvi-server-http", "python-grpc", "torchserve")


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(runs), figsize=(7 * len(runs), 5), squeeze=False)
    for ax, run in zip(axes[0], runs):
        for name in SYSTEMS:
            if name not in run:
                continue
            steps = run[name]["steps"]
            ax.plot([s["texts_per_s"] for s in steps], [s["p99_ms"] for s in steps], marker="o", label=name)
            for s in steps:
                ax.annotate(f"c{int(s['load'])}", (s["texts_per_s"], s["p99_ms"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        limit = max(s["texts_per_s"] for s in served_limit(run))
        ax.axvline(limit, color="grey", linestyle="--", label="in-process limit, one instance (best batch)")
        ax.set_xlabel("throughput (texts/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.set_title(f"Demo classifier, ~{run['words']:g}-word texts")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def length_name(words):
    return "Short" if words <= 40 else "Long"


def against_classify(other, q, what, name, ratio_target, latency_target):
    """Two lines: another protocol's best throughput against gRPC Classify's on the same server, and its
    p50 at concurrency 1 against Classify's (when both ran it)."""
    ob, qb = best_step(other), best_step(q)
    lines = [f"- {what}: best {ob['texts_per_s']:.0f} against {qb['texts_per_s']:.0f} texts/s "
             f"(**{ob['texts_per_s'] / qb['texts_per_s']:.2f} x**{ratio_target})."]
    o1 = next((s for s in other["steps"] if int(s["load"]) == 1), None)
    c1 = next((s for s in q["steps"] if int(s["load"]) == 1), None)
    if c1 and o1:
        lines.append(f"- At concurrency 1: {name} p50 {o1['p50_ms']:.3f} ms against Classify {c1['p50_ms']:.3f} ms "
                     f"(**{o1['p50_ms'] - c1['p50_ms']:+.3f} ms**{latency_target}).")
    return lines


def run_markdown(run):
    """The tables and ratios of one text length."""
    words, max_batch = run["words"], run["max_batch"]
    lim = {s["batch_size"]: s for s in served_limit(run)}  # what qvi-server runs
    script = {(s["batch_size"], bool(s.get("cuda_graphs"))): s for s in run["limit"]["steps"]
              if s.get("format") == "torchscript"}
    q = run.get("qvi-server")
    setup = []
    if q and "instances" in q:
        setup.append(f"qvi-server at its defaults: {q['instances']} instance(s) of the model with "
                     f"{q['torch_threads']} torch thread(s) each")
    if "torchserve" in run:
        setup.append(f"TorchServe: {run['torchserve'].get('workers', 1)} worker(s), one torch thread each")
    if "python-grpc" in run:
        setup.append("the Python server: 4 gRPC threads sharing one model, one torch thread")
    lines = [
        f"## {length_name(words)} texts (about {words:g} words)",
        "",
        f"qvi-server batches up to {max_batch} text(s), TorchServe up to {run.get('torchserve_batch', max_batch)}: "
        "the batch sizes at which the model each serves (package, TorchScript) is fastest here (the limit "
        "table). " + ("; ".join(setup) + "." if setup else ""),
        "",
        "### The limit: the model in-process (qvi-bench-model, one instance, one torch thread)",
        "",
        "| batch size | format | CUDA graphs | texts/s | batch p50 ms | batch p99 ms | pt2 / TorchScript | graphs / none |",
        "|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    by_key = {(s["batch_size"], s.get("format", "torchscript"), bool(s.get("cuda_graphs"))): s
              for s in run["limit"]["steps"]}
    for s in run["limit"]["steps"]:
        bs, fmt, graphs = s["batch_size"], s.get("format", "torchscript"), bool(s.get("cuda_graphs"))
        base = script.get((bs, graphs))
        ratio = f"{s['texts_per_s'] / base['texts_per_s']:.2f} x" if fmt == "pt2" and base else ""
        plain = by_key.get((bs, fmt, False))
        gain = f"{s['texts_per_s'] / plain['texts_per_s']:.2f} x" if graphs and plain else ""
        lines.append(f"| {bs} | {fmt} | {'on' if graphs else 'off'} | {s['texts_per_s']:.0f} | {s['p50_ms']:.3f} "
                     f"| {s['p99_ms']:.3f} | {ratio} | {gain} |")
    lines += ["", "### Servers under qvi-perf (closed loop, one text per request)", "",
              "| system | concurrency | texts/s | p50 ms | p90 ms | p99 ms | errors | server queue ms | server compute ms | server batch | server CPU µs/request |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in SYSTEMS:
        if name not in run:
            continue
        for s in run[name]["steps"]:
            err = sum(s["errors"].values())
            extra = [f"{s[k]:.2f}" if k in s else "-" for k in ("server_queue_ms", "server_compute_ms", "server_batch_size")]
            extra.append(f"{s['server_cpu_us_per_request']:.0f}" if "server_cpu_us_per_request" in s else "-")
            lines.append(f"| {name} | {int(s['load'])} | {s['texts_per_s']:.0f} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | "
                         f"{s['p99_ms']:.2f} | {err} | {' | '.join(extra)} |")
    lines += ["", "### Ratios (same run)", ""]
    if q:
        qb = best_step(q)
        formed = qb.get("server_batch_size", 1)
        nearest = min(lim, key=lambda b: abs(b - formed))
        same = script.get((nearest, bool(lim[nearest].get("cuda_graphs"))))
        if same and lim[nearest].get("format") == "pt2":
            lines.append(f"- The package against TorchScript at the batch the server forms at saturation "
                         f"({formed:.1f}, nearest measured {nearest}): {lim[nearest]['texts_per_s']:.0f} against "
                         f"{same['texts_per_s']:.0f} texts/s: "
                         f"**{lim[nearest]['texts_per_s'] / same['texts_per_s']:.2f} x** (target >= 1.5 x).")
        lines.append(f"- qvi-server at saturation: {qb['texts_per_s']:.0f} texts/s at concurrency {int(qb['load'])}, "
                     f"batches of {formed:.1f} texts; one instance's in-process limit at batch {nearest} is "
                     f"{lim[nearest]['texts_per_s']:.0f} texts/s: **{qb['texts_per_s'] / lim[nearest]['texts_per_s']:.2f} x** "
                     f"that limit (the server runs {q.get('instances', 1)} instance(s); load generator on the same cores).")
        c1 = next((s for s in q["steps"] if int(s["load"]) == 1), None)
        if c1 and 1 in lim:
            lines.append(f"- Added latency at concurrency 1: qvi-server p50 {c1['p50_ms']:.3f} ms against the in-process "
                         f"batch-1 forward p50 {lim[1]['p50_ms']:.3f} ms: **+{c1['p50_ms'] - lim[1]['p50_ms']:.3f} ms** "
                         f"(targets: <= 0.3 ms, issue 15; <= 0.15 ms, issue 33; includes the client's own gRPC time "
                         f"and tokenisation).")
            idle = {int(k): v for k, v in run.get("idle", {}).items()}
            if 0 in idle and IDLE_US in idle:
                warm, cold = idle[0]["p50_ms"], idle[IDLE_US]["p50_ms"]
                lines.append(f"- Of that, the forward itself: the batch-1 forward after a {IDLE_US} µs sleep (the "
                             f"instance thread's wait between a lone caller's requests) p50 {cold:.3f} ms against "
                             f"{warm:.3f} ms back to back in the same process (**{cold - warm:+.3f} ms**); against "
                             f"it, qvi-server adds **+{c1['p50_ms'] - cold:.3f} ms** (`qvi-bench-model --batch-sizes 1 "
                             f"--idle-us 0,{IDLE_US}`).")
        oip = run.get("qvi-server-oip")
        if oip:
            lines += against_classify(oip, q, "The Open Inference Protocol (ModelInfer, default outputs: label and "
                                      "probabilities) against Classify on the same server", "ModelInfer", "", "")
            pairs = [(o, n) for o, n in zip(oip["steps"], q["steps"])
                     if "server_cpu_us_per_request" in o and "server_cpu_us_per_request" in n]
            if pairs:
                o, n = pairs[-1]  # the highest concurrency: the cost per request with batching at work
                lines.append(f"- Server CPU per request at concurrency {int(o['load'])}: ModelInfer "
                             f"{o['server_cpu_us_per_request']:.0f} µs, Classify {n['server_cpu_us_per_request']:.0f} µs.")
        http = run.get("qvi-server-http")
        if http:
            lines += against_classify(http, q, f"HTTP/JSON Classify (`POST /v1/models/{MODEL}:classify`) against gRPC "
                                      "Classify on the same server", "HTTP/JSON", ", target >= 0.85 x",
                                      ", target <= +0.1 ms")
        for peer, target in (("torchserve", 5), ("python-grpc", 3)):
            if peer not in run:
                continue
            # The peer at its best throughput, against qvi-server's best throughput at an equal or better p99.
            pb = best_step(run[peer])
            fair = [st for st in q["steps"] if st["p99_ms"] <= pb["p99_ms"]]
            if not fair:
                lines.append(f"- vs {peer}: no qvi-server step reached {peer}'s p99 of {pb['p99_ms']:.2f} ms.")
                continue
            qf = max(fair, key=lambda st: st["texts_per_s"])
            lines.append(f"- vs {peer}: its best throughput is {pb['texts_per_s']:.0f} texts/s (concurrency {int(pb['load'])}, "
                         f"p99 {pb['p99_ms']:.2f} ms); qvi-server's best at an equal or better p99 is "
                         f"{qf['texts_per_s']:.0f} texts/s (concurrency {int(qf['load'])}, p99 {qf['p99_ms']:.2f} ms): "
                         f"**{qf['texts_per_s'] / pb['texts_per_s']:.2f} x** (target >= {target} x).")
    return lines


def markdown(results, info, command):
    runs = results["runs"]
    lines = [
        "# Benchmarks",
        "",
        f"Measured {info['date']} on {info['machine']['cpu']}, {info['machine']['cores']} cores, "
        f"{info['machine']['os']}, torch {info['machine']['torch']}"
        + (f", GPU {info['machine']['gpu']}" if info["machine"]["gpu"] else ", no GPU")
        + f". **The model runs on: {info.get('device', 'cpu')}** (every system, the limit included).",
        f"Model: the demo classifier `{MODEL}` ({info.get('model') or model_line()}). Texts: generated, "
        + " and ".join(f"about {r['words']:g} words" for r in runs)
        + ", one text per request. Every system ran in this one run, on the same machine, with the load "
        f"generator on the same cores (the machine has {info['machine']['cores']}). qvi-server serves the "
        "AOTInductor package `model.cpu.pt2` (compiled for x86-64-v3, AVX2) at its defaults, which size the "
        "instances and torch threads from the CPUs; TorchServe and the Python server run the TorchScript "
        "`model.pt`, as their users do. TorchServe waits up to 2 ms to fill a batch, qvi-server batches while "
        "its instances are busy (batch_when_idle), the Python server runs one forward per request. qvi-perf "
        "drives the gRPC servers asynchronously; `qvi-server-oip` is the same qvi-server run driven right after "
        "through the Open Inference Protocol (`qvi-perf --protocol oip`: ModelInfer, a BYTES tensor, the default "
        "outputs), so the two APIs' costs stand side by side; `qvi-server-http` is the same server again through "
        "its HTTP/JSON route (`POST /v1/models/sentiment:classify`, `qvi-perf --http --http-body json`). "
        "TorchServe's HTTP API is driven by one blocking client thread "
        "per connection (so is qvi-server's HTTP route), which on two cores also competes with the server.",
        "",
        "Reproduce with:",
        "",
        "```sh",
        command,
        "```",
        "",
        "![throughput against p99 latency](bench/results/throughput_p99.png)",
        "",
    ]
    for run in runs:
        lines += run_markdown(run) + [""]
    if results.get("maps"):
        lines += ["## Explanations without and with the per-layer attention maps (in-process)", "",
                  "Each forward asks for the answer, α and β; *maps on* also asks for every layer's and head's "
                  "attention map. Without maps the server runs the model's `forward_without_maps`, which never "
                  "forms them (model_store/README.md). Side by side in one qvi-bench-model process per model "
                  "(`--maps both --explain`).", "",
                  "| model | words | batch size | maps off texts/s | maps on texts/s | off / on |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in results["maps"]:
            by = {}
            for st in r["steps"]:
                by.setdefault(st["batch_size"], {})[st["maps"]] = st
            for bs, pair in sorted(by.items()):
                off, on = pair[False]["texts_per_s"], pair[True]["texts_per_s"]
                lines.append(f"| {r['label']} | {r['words']:g} | {bs} | {off:.1f} | {on:.1f} | {off / on:.2f} x |")
        if any(r["label"].startswith("bert_base") for r in results["maps"]):
            lines += ["", "`bert_base_qvi*`: UNTRAINED random weights (`python -m qvi bench-model`), BERT-base's "
                      "sizes (12 layers, width 768, 12 heads, 128 tokens); for speed only, its answers mean nothing."]
        lines.append("")
    if "null" in results:
        lines += [null_bench.null_markdown(results["null"], results["null"].get("command", command))]
    if "cpu_packages" in results:
        lines += [cpu_packages.markdown(results["cpu_packages"], results["cpu_packages"].get("command", command))]
    lines += ["Raw results: `bench/results/results.json`. What the profile shows and what stands in the way of the "
              "targets: [docs/performance.md](docs/performance.md).", ""]
    # The GPU session's figures (bench/gpu_session.sh, bench/gpu_report.py) come from another machine:
    # kept as they are whenever this run rewrites the file.
    gpu = os.path.join(REPO, "bench", "results", "gpu.md")
    if os.path.exists(gpu):
        with open(gpu) as f:
            lines += [f.read()]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="a seconds-long run that checks every part works (the first --words only)")
    ap.add_argument("--duration", type=float, default=10, help="seconds measured per step")
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    ap.add_argument("--words", default="20,100", help="mean text lengths in words, one measured set each")
    ap.add_argument("--device", default="cpu",
                    help="where every system runs the model: cpu, or cuda (the first GPU) for the GPU comparison")
    ap.add_argument("--skip", default="",
                    help="comma-separated systems to leave out (qvi-server,python-grpc,torchserve,null,cpu-packages)")
    ap.add_argument("--bert-base", default="",
                    help="also measure the UNTRAINED BERT-base-sized bench models (float32 and bfloat16, maps off "
                         "and on) at these batch sizes, e.g. 1,8 (exported into bench/models on first use)")
    ap.add_argument("--null", action="store_true",
                    help="measure only the serving path alone (the null model; bench/null_bench.py) and rewrite "
                         "its section of BENCHMARKS.md")
    ap.add_argument("--null-concurrency", default="1,16,64", help="the null benchmark's concurrency steps")
    ap.add_argument("--null-rounds", type=int, default=3,
                    help="how many times the null benchmark runs each step (the median round is reported)")
    ap.add_argument("--cpu-packages", default=",".join(cpu_packages.MODELS),
                    help="the models whose native CPU packages the full run measures (bench/cpu_packages.py; "
                         "not in --smoke)")
    ap.add_argument("--cpu-packages-only", action="store_true",
                    help="measure only the native CPU packages and rewrite their section of BENCHMARKS.md")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite BENCHMARKS.md and the plot from bench/results/results.json")
    a = ap.parse_args()
    if a.report_only or ((a.null or a.cpu_packages_only) and not a.smoke):
        out_dir = os.path.join(REPO, "bench", "results")
        with open(os.path.join(out_dir, "results.json")) as f:
            saved = json.load(f)
        info, results = saved["info"], saved["results"]
        if a.null or a.cpu_packages_only:  # measured now, with its own command; the rest as saved
            work = tempfile.mkdtemp(prefix="qvi_bench_part_")
            section = "null" if a.null else "cpu_packages"
            if a.null:
                results["null"] = null_bench.run_null(work, a, sys.modules[__name__])
            else:
                results["cpu_packages"] = run_cpu_packages(work, a)
            results[section]["command"] = "scripts/setup.sh && .venv/bin/python bench/run.py " + " ".join(sys.argv[1:])
            results[section]["date"] = datetime.date.today().isoformat()
            with open(os.path.join(out_dir, "results.json"), "w") as f:
                json.dump({"info": info, "results": results}, f, indent=2)
            shutil.rmtree(work, ignore_errors=True)
        plot(results["runs"], os.path.join(out_dir, "throughput_p99.png"))
        with open(os.path.join(REPO, "BENCHMARKS.md"), "w") as f:
            f.write(markdown(results, info, info["command"]))
        log("rewrote BENCHMARKS.md from bench/results/results.json")
        return
    word_counts = [float(w) for w in a.words.split(",") if w]
    if a.smoke:
        a.duration, a.warmup, a.concurrency, a.batch_sizes = 0.5, 0.2, "1,4", "1,4"
        word_counts = word_counts[:1]
    command = "scripts/setup.sh && .venv/bin/python bench/run.py " + " ".join(sys.argv[1:])
    work = tempfile.mkdtemp(prefix="qvi_bench_")
    out_dir = work if a.smoke else os.path.join(REPO, "bench", "results")
    os.makedirs(out_dir, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    runs = []
    for words in word_counts:
        run_dir = os.path.join(work, f"words_{words:g}")
        os.makedirs(run_dir)
        run = {"words": words, "limit": run_limit(run_dir, a, words), "idle": run_idle(run_dir, a, words)}
        # Each batching server gets the batch size at which the model it serves is fastest here:
        # qvi-server its package's, TorchServe its TorchScript model's.
        run["max_batch"] = max(served_limit(run), key=lambda s: s["texts_per_s"])["batch_size"]
        script = [s for s in run["limit"]["steps"] if s.get("format", "torchscript") == "torchscript"]
        run["torchserve_batch"] = max(script, key=lambda s: s["texts_per_s"])["batch_size"]
        log(f"~{words:g} words: fastest batch {run['max_batch']} (served format), {run['torchserve_batch']} "
            "(TorchScript): qvi-server and TorchServe batch up to those")
        common = ["--model", MODEL, "--concurrency", a.concurrency, "--duration", str(a.duration), "--warmup",
                  str(a.warmup), "--words", str(words)]
        for name, fn in (("qvi-server", run_qvi_server), ("python-grpc", run_python_server),
                         ("torchserve", run_torchserve)):
            if name not in skip:
                run[name] = fn(run_dir, a, common, run)
        if "qvi-server" in run:
            run["qvi-server-oip"] = run["qvi-server"].pop("oip")
            run["qvi-server-http"] = run["qvi-server"].pop("http")
        runs.append(run)
    results = {"runs": runs, "maps": [run_maps(work, a, MODEL_PT, MODEL, a.batch_sizes, word_counts[0])]}
    if "null" not in skip:
        if a.smoke:
            a.null_concurrency, a.null_rounds = "1,4", 2
        results["null"] = null_bench.run_null(work, a, sys.modules[__name__])
        results["null"]["command"], results["null"]["date"] = command, datetime.date.today().isoformat()
    if "cpu-packages" not in skip and not a.smoke and a.cpu_packages:
        results["cpu_packages"] = run_cpu_packages(work, a)
        results["cpu_packages"]["command"] = ("scripts/setup.sh && .venv/bin/python bench/run.py --cpu-packages-only "
                                              f"--cpu-packages {a.cpu_packages}")
    if a.bert_base:
        for name, path in bert_base_models().items():
            results["maps"].append(run_maps(work, a, path, name, a.bert_base, 128))
    info = {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command,
            "device": a.device, "model": model_line()}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"info": info, "results": results}, f, indent=2)
    plot(runs, os.path.join(out_dir, "throughput_p99.png"))
    text = markdown(results, info, command)
    with open(os.path.join(out_dir if a.smoke else REPO, "BENCHMARKS.md"), "w") as f:
        f.write(text)
    for run in runs:
        for name in SYSTEMS:
            if name in run:
                ok = sum(s.get("ok", 1) for s in run[name]["steps"])
                assert ok > 0, f"{name} answered nothing at ~{run['words']:g} words"
    if any("qvi-server" in run for run in runs):
        assert "Of that, the forward itself" in text, "the added latency's in-process part is missing"
    for label, r in results.get("null", {}).get("protocols", {}).items():
        assert sum(s.get("ok", 0) for s in r["steps"]) > 0, f"the null model answered nothing through {label}"
    log(f"results in {out_dir}" + ("" if a.smoke else " and BENCHMARKS.md"))
    if a.smoke:
        print("\n".join(line for line in text.splitlines() if line.startswith("- Added") or "forward itself" in line))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
