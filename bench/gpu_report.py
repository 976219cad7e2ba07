#!/usr/bin/env python3
"""Writes the GPU session's figures (bench/gpu_session.sh's files, unpacked) as markdown tables.

    python3 bench/gpu_report.py bench/results/gpu-h100-2026-11-27

(bench/results/gpu.md holds each GPU session's prose and its tables, newest first.)

The folder holds one sub-folder per device call (call1, call2, ...); in each, the stages' files
(graphs/, bert/, server/, pt2/ as gpu_session.sh packs them, null/ from bench/run.py --null, or a probe
stage's files at the top). Every
table names the call its rows come from: figures from different calls ran on different machines of
the same kind and are compared only with care. bench/run.py appends bench/results/gpu.md to
BENCHMARKS.md.
"""
import glob
import json
import os
import re
import sys
from typing import Dict, List


def load(path: str) -> Dict:
    with open(path) as f:
        return json.load(f)


def limits(call: str) -> List[str]:
    files = sorted(glob.glob(os.path.join(call, "graphs", "limit_*.json")) +
                   glob.glob(os.path.join(call, "bert", "limit_*.json")))
    if not files:
        return []
    out = ["| model | words | batch | texts/s, no graphs | texts/s, graphs | graphs / none | p99 ms, graphs |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for path in files:
        d = load(path)
        model = d["model"].rstrip("/").split("/")[-2]
        by_batch: Dict[int, Dict[bool, Dict]] = {}
        for s in d["steps"]:
            by_batch.setdefault(s["batch_size"], {})[s["cuda_graphs"]] = s
        for b, pair in sorted(by_batch.items()):
            off, on = pair.get(False), pair.get(True)
            if off is None or on is None:
                continue
            out.append(f"| {model} | {d['words']:g} | {b} | {off['texts_per_s']:.0f} | {on['texts_per_s']:.0f} | "
                       f"{on['texts_per_s'] / off['texts_per_s']:.1f} x | {on['p99_ms']:.2f} |")
    return out


def formats(call: str) -> List[str]:
    """pt2/limit_pt2_*.json: TorchScript against the AOTInductor package, each with and without graphs."""
    files = sorted(glob.glob(os.path.join(call, "pt2", "limit_pt2_*.json")))
    if not files:
        return []
    out = ["| model | words | batch | TorchScript | TorchScript, graphs | package | package, graphs | "
           "package / TorchScript, graphs | p99 ms, package, graphs |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for path in files:
        d = load(path)
        model = d["model"].rstrip("/").split("/")[-2]
        by_batch: Dict[int, Dict] = {}
        for s in d["steps"]:
            by_batch.setdefault(s["batch_size"], {})[(s["format"], s["cuda_graphs"])] = s
        for b, cell in sorted(by_batch.items()):
            if len(cell) < 4:
                continue
            ts, tg, ps, pg = (cell[k] for k in (("torchscript", False), ("torchscript", True), ("pt2", False),
                                                 ("pt2", True)))
            out.append(f"| {model} | {d['words']:g} | {b} | {ts['texts_per_s']:.0f} | {tg['texts_per_s']:.0f} | "
                       f"{ps['texts_per_s']:.0f} | {pg['texts_per_s']:.0f} | "
                       f"{pg['texts_per_s'] / tg['texts_per_s']:.2f} x | {pg['p99_ms']:.2f} |")
    return out


def null_model(call: str) -> List[str]:
    """null/null.json: bench/run.py --null's results (the serving path alone, on one pinned core)."""
    path = os.path.join(call, "null", "null.json")
    if not os.path.exists(path):
        return []
    d = load(path)
    out = [f"Server on core(s) {d['server_cores']}, qvi-perf on {len(d['client_cores'])} others.", "",
           "| protocol | concurrency | requests/s | p50 ms | p99 ms | server CPU µs/request |",
           "|---|---:|---:|---:|---:|---:|"]
    for label, r in d["protocols"].items():
        for s in r["steps"]:
            out.append(f"| {label} | {s['load']:g} | {s['requests_per_s']:.0f} | {s['p50_ms']:.2f} | "
                       f"{s['p99_ms']:.2f} | {s.get('server_cpu_us_per_request', 0):.1f} |")
    return out


def server_row(label: str, shape: str, s: Dict, clients: int = 1) -> str:
    errors = sum(s["errors"].values()) if s["errors"] else 0
    return (f"| {label} | {shape} | {s['load']:g} | {s['texts_per_s'] * clients:.0f} | {s['p50_ms']:.2f} | "
            f"{s['p99_ms']:.2f} | {s['p999_ms']:.2f} | {errors} | {s.get('server_batch_size', 0):.1f} | "
            f"{s.get('server_compute_ms', 0):.2f} | {s.get('server_cores', 0):.1f} | "
            f"{s.get('server_cpu_us_per_request', 0):.0f} |")


HEADER = ["| server | requests | concurrency | texts/s | p50 ms | p99 ms | p99.9 ms | errors | server batch | "
          "server compute ms | server cores | server CPU µs/request |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]


def servers(call: str) -> List[str]:
    files = sorted(glob.glob(os.path.join(call, "server", "perf_*.json")))
    if not files:
        return []
    out = list(HEADER)
    for path in files:
        name = os.path.basename(path)[len("perf_"):-len(".json")]
        config, _, kind = name.partition("_1text") if "_1text" in name else name.partition("_32texts")
        d = load(path)
        shape = f"{d['texts_per_request']} text(s)" + (", α and β" if name.endswith("explain") else "")
        for s in d["steps"]:
            out.append(server_row(config, shape, s))
    return out


def probes(call: str) -> List[str]:
    log = os.path.join(call, "probe.txt")
    if not os.path.exists(log):
        return []
    with open(log) as f:
        text = f.read()
    flags = dict(re.findall(r"^== server (\S+): ?(.*)$", text, re.M))
    perf = dict(re.findall(r"^-- (\S+) client 1: (.*)$", text, re.M))
    out = ["| probe | qvi-server flags | batches of up to | load generators × qvi-perf flags | texts/s (all) | "
           "server batch | server CPU µs/request | errors |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for name in flags:
        runs = sorted(glob.glob(os.path.join(call, f"probe_{name}_[0-9]*.json")))
        if not runs:
            continue
        steps = [load(p)["steps"] for p in runs]
        with open(os.path.join(call, f"server_{name}.log")) as f:
            batch = re.search(r"batches of up to (\d+) texts", f.read())
        for i in range(len(steps[0])):
            row = [s[i] for s in steps]
            texts = sum(r["texts_per_s"] for r in row)
            errors = sum(sum(r["errors"].values()) for r in row if r["errors"])
            # The server's CPU over every generator's requests (each generator's own figure divides the
            # server's whole CPU by its share of the requests).
            us = row[0].get("server_cores", 0) / sum(r["requests_per_s"] for r in row) * 1e6
            out.append(f"| {name} | {flags[name] or '(defaults)'} | {batch.group(1) if batch else '?'} | "
                       f"{len(runs)} × `{perf.get(name, '')}` (step {row[0]['load']:g}) | {texts:.0f} | "
                       f"{row[0].get('server_batch_size', 0):.1f} | {us:.0f} | {errors} |")
    return out


def main() -> None:
    root = sys.argv[1]
    lines: List[str] = []
    for call in sorted(glob.glob(os.path.join(root, "call*"))):
        name = os.path.basename(call)
        for title, table in (("in-process limit, `qvi-bench-model --cuda-graphs both --explain`", limits(call)),
                             ("qvi-server under `qvi-perf --threads 8 --channels 16`", servers(call)),
                             ("probes: what moves one text per request", probes(call)),
                             ("TorchScript against the CUDA package, `qvi-bench-model --format both "
                              "--cuda-graphs both --explain`", formats(call)),
                             ("the serving path alone (null model), `bench/run.py --null`", null_model(call))):
            if table:
                lines += [f"#### {name}: {title}", ""] + table + [""]
    sys.stdout.write("\n".join(lines))


if __name__ == "__main__":
    main()
