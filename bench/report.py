"""BENCHMARKS.md and its plot from the harness's results (bench/run.py): the in-process limit, every
server's steps, the ratios the issues' targets are read from, the explanations' cost, and the sections
of the null model and the native CPU packages."""
import os

import cpu_packages
import null_bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "sentiment"
IDLE_US = 300  # about the time a lone caller's request spends outside the model (round trip, gRPC)


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


def limit_table(run):
    """The in-process limit's table (qvi-bench-model, one instance, one torch thread)."""
    script = {(s["batch_size"], bool(s.get("cuda_graphs"))): s for s in run["limit"]["steps"]
              if s.get("format") == "torchscript"}
    lines = ["### The limit: the model in-process (qvi-bench-model, one instance, one torch thread)", "",
             "| batch size | format | CUDA graphs | texts/s | batch p50 ms | batch p99 ms | pt2 / TorchScript | graphs / none |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
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
    return lines


def servers_table(run):
    """Every server's steps under qvi-perf."""
    lines = ["### Servers under qvi-perf (closed loop, one text per request)", "",
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
    return lines


def saturation_lines(run, q):
    """qvi-server at saturation against the package's and the model's in-process limits, and its added
    latency at concurrency 1 (with the forward's own part after an idle gap)."""
    lim = {s["batch_size"]: s for s in served_limit(run)}  # what qvi-server runs
    script = {(s["batch_size"], bool(s.get("cuda_graphs"))): s for s in run["limit"]["steps"]
              if s.get("format") == "torchscript"}
    lines = []
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
    return lines


def protocol_lines(run, q):
    """OIP's and HTTP/JSON's costs against gRPC Classify's on the same server."""
    lines = []
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
    return lines


def peer_lines(run, q):
    """qvi-server against TorchServe and the Python server, each at its best throughput."""
    lines = []
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


def run_markdown(run):
    """The tables and ratios of one text length."""
    words, max_batch = run["words"], run["max_batch"]
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
    ]
    lines += limit_table(run) + [""] + servers_table(run) + ["", "### Ratios (same run)", ""]
    if q:
        lines += saturation_lines(run, q) + protocol_lines(run, q) + peer_lines(run, q)
    return lines


def maps_lines(maps):
    """The explanations' cost without and with the per-layer attention maps."""
    lines = ["## Explanations without and with the per-layer attention maps (in-process)", "",
             "Each forward asks for the answer, α and β; *maps on* also asks for every layer's and head's "
             "attention map. Without maps the server runs the model's `forward_without_maps`, which never "
             "forms them (model_store/README.md). Side by side in one qvi-bench-model process per model "
             "(`--maps both --explain`).", "",
             "| model | words | batch size | maps off texts/s | maps on texts/s | off / on |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in maps:
        by = {}
        for st in r["steps"]:
            by.setdefault(st["batch_size"], {})[st["maps"]] = st
        for bs, pair in sorted(by.items()):
            off, on = pair[False]["texts_per_s"], pair[True]["texts_per_s"]
            lines.append(f"| {r['label']} | {r['words']:g} | {bs} | {off:.1f} | {on:.1f} | {off / on:.2f} x |")
    if any(r["label"].startswith("bert_base") for r in maps):
        lines += ["", "`bert_base_qvi*`: UNTRAINED random weights (`python -m qvi bench-model`), BERT-base's "
                  "sizes (12 layers, width 768, 12 heads, 128 tokens); for speed only, its answers mean nothing."]
    return lines + [""]


def markdown(results, info, command):
    runs = results["runs"]
    lines = [
        "# Benchmarks",
        "",
        f"Measured {info['date']} on {info['machine']['cpu']}, {info['machine']['cores']} cores, "
        f"{info['machine']['os']}, torch {info['machine']['torch']}"
        + (f", GPU {info['machine']['gpu']}" if info["machine"]["gpu"] else ", no GPU")
        + f". **The model runs on: {info.get('device', 'cpu')}** (every system, the limit included).",
        f"Model: the demo classifier `{MODEL}` ({info['model']}). Texts: generated, "
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
        lines += maps_lines(results["maps"])
    if "null" in results:
        lines += [null_bench.null_markdown(results["null"], results["null"].get("command", command))]
    if "cpu_packages" in results:
        lines += [cpu_packages.markdown(results["cpu_packages"], results["cpu_packages"].get("command", command))]
    lines += ["Raw results: `bench/results/results.json`. What the profile shows and what stands in the way of the "
              "targets: [docs/performance.md](docs/performance.md).", ""]
    # Sections this run does not measure, kept as they are whenever it rewrites the file: the emulated
    # accelerator's (bench/emulated_device.py, pasted with its command) and the GPU sessions' (from
    # another machine: bench/gpu_session.sh, bench/gpu_report.py).
    for kept in ("emulated.md", "gpu.md"):
        path = os.path.join(REPO, "bench", "results", kept)
        if os.path.exists(path):
            with open(path) as f:
                lines += [f.read()]
    return "\n".join(lines)
