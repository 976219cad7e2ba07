"""The serving path alone: qvi-server with the null backend (server/core/model/null_model.h: the demo
classifier's manifest and vocabulary, no math) under qvi-perf, one text per request, through gRPC Classify,
OIP ModelInfer and HTTP/JSON :classify, at concurrency 1, 16 and 64, each step --null-rounds times (three;
the protocols take turns, and the median round is reported: one round on a shared VM moved by a third
from run to run). The server runs on one core and the load generator on the others (taskset), so the
server's CPU per request -- from its own process_cpu_seconds_total over each measured window -- is the
cost of serving: receive, parse, check, tokenise, queue, batch, post-process, serialise, metrics and the
thread hand-offs between them.
Triton's docs measure their own overhead the same way, with an identity model.

Beside qvi-perf, the same server under h2load (Debian's nghttp2-client, a load generator this project
did not write; bench/h2load_bench.py): gRPC Classify over HTTP/2 and HTTP/JSON over HTTP/1.1 at the same
concurrency steps, counting only the server's own OK answers. The tables say which generator made each row.

bench/run.py runs it in the full run (and its smoke test) and alone with --null; this file holds the
measuring and the markdown section.
"""
import os
import re
import subprocess
from typing import Dict, List

import h2load_bench

PROTOCOLS = (  # (label, qvi-perf arguments past the target)
    ("gRPC Classify", []),
    ("OIP ModelInfer", ["--protocol", "oip"]),
    ("HTTP/JSON :classify", None),  # --http, built with the port
)
TARGETS_US = {"gRPC Classify": 20, "OIP ModelInfer": 22, "HTTP/JSON :classify": 30}


def cores():
    return sorted(os.sched_getaffinity(0))


def pin(cpus):
    """The command prefix that runs a program on `cpus`."""
    return ["taskset", "-c", ",".join(map(str, cpus))]


def port_files(work, stem, keys):
    """{key: work/stem.key}, none of them left from an earlier run (it would be read as this server's)."""
    files = {k: os.path.join(work, f"{stem}.{k}") for k in keys}
    for path in files.values():
        if os.path.exists(path):
            os.remove(path)
    return files


def null_store(work, model_pt, model, python):
    """A store holding the model's null twin: its manifest and vocabulary in model.null."""
    store = os.path.join(work, "null_store")
    subprocess.run([python, "-m", "qvi", "null", "--artifact", model_pt, "--out", os.path.join(store, model, "1")],
                   check=True, cwd=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                "model_store"), stdout=subprocess.DEVNULL)
    return store


def run_null(work, a, h, server_args=(), store=None, protocols=PROTOCOLS, h2load=True):
    """h: bench/harness.py (BUILD, MODEL, MODEL_PT, PY, perf, serve, log).
    server_args: more qvi-server flags; store: serve this store instead of the null twin's; h2load: also
    the h2load rows.
    The results: {"server_cores", "client_cores", "concurrency", "protocols": {label: qvi-perf's JSON}}."""
    all_cores = cores()
    server_cores, client_cores = all_cores[:1], all_cores[1:] or all_cores[:1]
    if getattr(a, "shared_cores", False):  # as the full run's servers: both on every core, not pinned
        server_cores = client_cores = all_cores
    store = store or null_store(work, h.MODEL_PT, h.MODEL, h.PY)
    out = {"server_cores": server_cores, "client_cores": client_cores, "concurrency": a.null_concurrency,
           "protocols": {}}
    with h.serve(store, work, "qvi-server-null", *server_args, cpus=server_cores) as server:
        metrics = server.metrics_url
        common = ["--model", h.MODEL, "--concurrency", a.null_concurrency, "--duration", str(a.duration),
                  "--warmup", str(a.warmup), "--words", "20", "--metrics", metrics]
        rounds: Dict[str, List[dict]] = {}
        # The protocols take turns, round after round, on the one server: a machine's drift during the
        # run falls on every protocol alike, and the median round of each step is reported.
        for i in range(max(int(getattr(a, "null_rounds", 1)), 1)):
            for label, extra in protocols:
                target = (["--http", f"http://{server.http_address}/v1/models/{h.MODEL}:classify", "--http-body",
                           "json"] if extra is None else ["--server", server.address, *extra])
                name = f"null-{re.sub('[^a-z0-9]+', '-', label.lower()).strip('-')}-{i + 1}"
                rounds.setdefault(label, []).append(h.perf(work, name, target, common, prefix=pin(client_cores)))
        if h2load:
            out["h2load"] = run_h2load(work, a, h, {"grpc": f"http://{server.address}{h2load_bench.GRPC_PATH}",
                                                    "http": f"http://{server.http_address}/v1/models/{h.MODEL}:classify"},
                                       metrics, client_cores)
    out["rounds"] = len(next(iter(rounds.values()), []))
    out["protocols"] = {label: median_round(runs) for label, runs in rounds.items()}
    return out


def run_h2load(work, a, h, urls, metrics, client_cores):
    """Each protocol under h2load at each concurrency step, pinned as qvi-perf was: {label: [steps]}, or
    {"missing": why} without h2load."""
    exe = h2load_bench.executable(h.BUILD)
    if exe is None:
        return {"missing": "h2load not found (Debian's nghttp2-client; scripts/setup.sh installs it)"}
    bodies = {"grpc": h2load_bench.grpc_body(work, h.MODEL), "http": h2load_bench.json_body(work)}
    out = {}
    for label, protocol in (("gRPC Classify", "grpc"), ("HTTP/JSON :classify", "http")):
        for load in a.null_concurrency.split(","):
            cmd = h2load_bench.command(exe, protocol, urls[protocol], int(load), a.duration, a.warmup, bodies[protocol])
            step = h2load_bench.run(cmd, metrics, h.MODEL, a.warmup, a.duration, prefix=pin(client_cores), log=h.log)
            out.setdefault(label, []).append(dict(step, load=int(load)))
    return out


def median_round(runs: List[dict]) -> dict:
    """qvi-perf's JSON of one protocol's rounds: each step is the round whose server CPU per request is
    the median (the lower middle of an even count), so its figures belong together, with every round's
    CPU per request beside it in "rounds_us"."""
    merged = dict(runs[0], steps=[])
    for i, step in enumerate(runs[0]["steps"]):
        column = [r["steps"][i] for r in runs]
        measured = [s for s in column if s.get("server_cpu_us_per_request") is not None]
        ordered = sorted(measured, key=lambda s: s["server_cpu_us_per_request"])
        chosen = dict(ordered[(len(ordered) - 1) // 2] if ordered else step)
        chosen["rounds_us"] = [s.get("server_cpu_us_per_request") for s in column]
        merged["steps"].append(chosen)
    return merged


def null_markdown(null, command):
    """The section of BENCHMARKS.md."""
    lines = ["## The serving path alone (null model)", "",
             f"Command: `{command}`. qvi-server on core(s) {null['server_cores']} and qvi-perf on "
             f"{null['client_cores']} (taskset), serving the demo classifier's null twin (`python -m qvi null`: "
             "its manifest and vocabulary, no math), one ~20-word text per request. Server CPU per request is "
             "its own `process_cpu_seconds_total` over each measured window divided by the requests answered; "
             "requests/s per server core is its inverse. Context switches per request are its threads' voluntary "
             "ones (`qvi_process_context_switches_total`): each is a thread that blocked to wait and was woken "
             "again, the hand-offs of the path, counted rather than timed. Targets (issue 33), at concurrency 64: "
             "gRPC ≤ 20 µs, OIP within 10 % of it (≤ 22 µs), HTTP/JSON ≤ 30 µs.", "",
             f"Each step ran {null.get('rounds', 1)} time(s), the protocols taking turns on one server; the row "
             "is the round with the median server CPU per request, and every round's figure is beside it.", "",
             "Rows made by **qvi-perf** (this project's load generator):", "",
             "| protocol | concurrency | requests/s | server cores busy | server CPU µs/request | "
             "rounds, µs/request | requests/s per server core | context switches/request | p50 ms | p99 ms | target |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for label, r in null["protocols"].items():
        for s in r["steps"]:
            us = s.get("server_cpu_us_per_request")
            target = TARGETS_US[label]
            verdict = ""
            if int(s["load"]) == 64 and us is not None:
                verdict = f"{'met' if us <= target else 'not met'} (≤ {target} µs)"
            spread = ", ".join(f"{u:.1f}" if u is not None else "–" for u in s.get("rounds_us", [us]))
            sw = s.get("server_switches_per_request")
            switches = f"{sw:.2f}" if sw is not None else "–"
            lines.append(f"| {label} | {int(s['load'])} | {s['requests_per_s']:,.0f} | {s.get('server_cores', 0):.2f} | "
                         f"{us:.1f} | {spread} | {1e6 / us:,.0f} | {switches} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | "
                         f"{verdict} |"
                         if us else f"| {label} | {int(s['load'])} | {s['requests_per_s']:,.0f} | – | – | – | – | "
                         f"{switches} | {s['p50_ms']:.3f} | {s['p99_ms']:.3f} | |")
    lines += h2load_lines(null.get("h2load"))
    return "\n".join(lines) + "\n"


def h2load_lines(h2load):
    """The same server under h2load: its own OK answers a second and CPU per request."""
    if not h2load:
        return []
    if "missing" in h2load:
        return ["", f"Not measured with h2load: {h2load['missing']}."]
    lines = ["", "The same server and cores under **h2load** (Debian's nghttp2-client; gRPC as HTTP/2 POSTs of one "
             "framed Classify, 64 streams a connection; HTTP/JSON over HTTP/1.1, one connection per call in "
             "flight), one round; OK answers and CPU from the server's own /metrics over the measured window "
             "(h2load counts a gRPC error as an HTTP 200):", "",
             "| generator | protocol | concurrency | OK requests/s | server CPU µs/request |",
             "|---|---|---:|---:|---:|"]
    for label, steps in h2load.items():
        for s in steps:
            lines.append(f"| h2load | {label} | {s['load']} | {s['ok_per_s']:,.0f} | "
                         f"{s['server_cpu_us_per_request']:.1f} |")
    return lines
