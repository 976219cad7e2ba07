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
    .venv/bin/python bench/run.py --smoke         # seconds-long check that every part works (CI), the
                                                  # CPU packages' section on the demo store's packages;
                                                  # writes into a temporary folder, gates on no timing
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
from report import IDLE_US, markdown, plot, served_limit, SYSTEMS

import harness  # noqa: E402  (what every benchmark shares: paths, the demo model, starting and stopping)
from harness import BUILD, MODEL, MODEL_DIR, MODEL_PT, PY, REPO, log, perf, stop, wait_for_file  # noqa: E402


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
    # A copy of the store whose serving.json sets the batch size the limit found fastest; everything else
    # (instances, torch threads) at the server's defaults.
    store = os.path.join(work, "qvi_store")
    shutil.copytree(os.path.join(REPO, "model_store", "store", MODEL), os.path.join(store, MODEL))
    with open(os.path.join(store, MODEL, "serving.json"), "w") as f:
        json.dump({"max_batch_size": run["max_batch"]}, f)
    with harness.serve(store, work, "qvi-server", device=a.device) as server:
        target = ["--server", server.address, "--metrics", server.metrics_url]
        r = perf(work, "qvi-server", target, common)
        # The same server and texts through the Open Inference Protocol (ModelInfer), right after.
        r["oip"] = perf(work, "qvi-server-oip", [*target, "--protocol", "oip"], common)
        # And through the HTTP/JSON route (POST /v1/models/{m}:classify), by a blocking client thread per
        # connection (qvi-perf --http, as for TorchServe).
        r["http"] = perf(work, "qvi-server-http",
                         ["--http", f"http://{server.http_address}/v1/models/{MODEL}:classify", "--http-body", "json",
                          "--metrics", server.metrics_url], common)
    # What its defaults chose on this machine, from its start-up line.
    with open(server.log_path) as f:
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


def parse_args():
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
                         "--smoke measures the demo store's sentiment packages for a moment instead)")
    ap.add_argument("--cpu-packages-only", action="store_true",
                    help="measure only the native CPU packages and rewrite their section of BENCHMARKS.md")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: rewrite BENCHMARKS.md and the plot from bench/results/results.json")
    return ap.parse_args()


def rewrite_report(a):
    """--report-only, --null, --cpu-packages-only: BENCHMARKS.md rewritten from the saved results, with
    the one section measured now when asked."""
    out_dir = os.path.join(REPO, "bench", "results")
    with open(os.path.join(out_dir, "results.json")) as f:
        saved = json.load(f)
    info, results = saved["info"], saved["results"]
    info.setdefault("model", model_line())  # results saved before the model line was kept
    if a.null or a.cpu_packages_only:  # measured now, with its own command; the rest as saved
        work = tempfile.mkdtemp(prefix="qvi_bench_part_")
        section = "null" if a.null else "cpu_packages"
        if a.null:
            results["null"] = null_bench.run_null(work, a, harness)
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


def measure_length(work, a, words, skip):
    """One text length: the limit, then each server at the batch size its model is fastest at."""
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
    return run


def check_answered(runs, results, text):
    """Every system answered, and the report holds the added latency's in-process part."""
    for run in runs:
        for name in SYSTEMS:
            if name in run:
                ok = sum(s.get("ok", 1) for s in run[name]["steps"])
                assert ok > 0, f"{name} answered nothing at ~{run['words']:g} words"
    if any("qvi-server" in run for run in runs):
        assert "Of that, the forward itself" in text, "the added latency's in-process part is missing"
    for label, r in results.get("null", {}).get("protocols", {}).items():
        assert sum(s.get("ok", 0) for s in r["steps"]) > 0, f"the null model answered nothing through {label}"
    for model, r in results.get("cpu_packages", {}).get("models", {}).items():
        assert any(s.get("package") == "base" for run in r["runs"] for s in run["steps"]), \
            f"the CPU packages section measured no package of {model}"
        assert "## Native CPU packages" in text, "the CPU packages section is missing from the report"


def measure_sections(work, a, skip, command, words):
    """The sections beside the servers': the maps' cost, the null model, the native CPU packages."""
    results = {"maps": [run_maps(work, a, MODEL_PT, MODEL, a.batch_sizes, words)]}
    if "null" not in skip:
        if a.smoke:
            a.null_concurrency, a.null_rounds = "1,4", 2
        results["null"] = null_bench.run_null(work, a, harness)
        results["null"]["command"], results["null"]["date"] = command, datetime.date.today().isoformat()
    if "cpu-packages" not in skip and a.smoke:  # its code on the demo store's packages, for a moment
        results["cpu_packages"] = cpu_packages.smoke(work, log, BUILD)
        results["cpu_packages"]["command"] = command
    elif "cpu-packages" not in skip and a.cpu_packages:
        results["cpu_packages"] = run_cpu_packages(work, a)
        results["cpu_packages"]["command"] = ("scripts/setup.sh && .venv/bin/python bench/run.py --cpu-packages-only "
                                              f"--cpu-packages {a.cpu_packages}")
    if a.bert_base:
        for name, path in bert_base_models().items():
            results["maps"].append(run_maps(work, a, path, name, a.bert_base, 128))
    return results


def main():
    a = parse_args()
    if a.report_only or ((a.null or a.cpu_packages_only) and not a.smoke):
        return rewrite_report(a)
    word_counts = [float(w) for w in a.words.split(",") if w]
    if a.smoke:
        a.duration, a.warmup, a.concurrency, a.batch_sizes = 0.5, 0.2, "1,4", "1,4"
        word_counts = word_counts[:1]
    command = "scripts/setup.sh && .venv/bin/python bench/run.py " + " ".join(sys.argv[1:])
    work = tempfile.mkdtemp(prefix="qvi_bench_")
    out_dir = work if a.smoke else os.path.join(REPO, "bench", "results")
    os.makedirs(out_dir, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    runs = [measure_length(work, a, words, skip) for words in word_counts]
    results = {"runs": runs, **measure_sections(work, a, skip, command, word_counts[0])}
    info = {"date": datetime.date.today().isoformat(), "machine": machine(), "command": command,
            "device": a.device, "model": model_line()}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"info": info, "results": results}, f, indent=2)
    plot(runs, os.path.join(out_dir, "throughput_p99.png"))
    text = markdown(results, info, command)
    with open(os.path.join(out_dir if a.smoke else REPO, "BENCHMARKS.md"), "w") as f:
        f.write(text)
    check_answered(runs, results, text)
    log(f"results in {out_dir}" + ("" if a.smoke else " and BENCHMARKS.md"))
    if a.smoke:
        print("\n".join(line for line in text.splitlines() if line.startswith("- Added") or "forward itself" in line))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
