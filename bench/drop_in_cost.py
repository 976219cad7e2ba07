"""What a drop-in route costs against the native one (docs/serving.md, "Drop-in routes"): qvi-server with the null
backend (the demo classifier's manifest and vocabulary, no math: bench/null_bench.py) on one core, h2load (Debian's
nghttp2-client) on the other, one ~20-word text per HTTP/1.1 POST, to the native `:classify`, TEI's `/predict` and
vLLM's `/classify` in turn, round after round on the one server (a shared VM's drift falls on each alike; the
median round is reported). Each figure is the server's own: its OK answers and its process CPU over the measured
window (bench/h2load_bench.py).

    .venv/bin/python bench/drop_in_cost.py [--concurrency 16] [--duration 5] [--warmup 1] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import tempfile

import h2load_bench
import harness as h
from null_bench import cores, null_store, pin

ROUTES = (  # (label, path, body)
    ("native :classify", "/v1/models/{m}:classify", {"texts": [h2load_bench.TEXT]}),
    ("TEI /predict", "/predict", {"inputs": h2load_bench.TEXT}),
    ("vLLM /classify", "/classify", {"model": "{m}", "input": h2load_bench.TEXT}),
)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the rounds here")
    a = p.parse_args()
    exe = h2load_bench.executable(h.BUILD)
    assert exe, "h2load not found (Debian's nghttp2-client; scripts/setup.sh installs it)"
    every = cores()
    server_cores, client_cores = every[:1], every[1:] or every[:1]
    work = tempfile.mkdtemp(prefix="qvi_drop_in_cost_")
    store = null_store(work, h.MODEL_PT, h.MODEL, h.PY)
    rounds = {label: [] for label, _, _ in ROUTES}
    with h.serve(store, work, "qvi-server-drop-in", "--default-model", h.MODEL, cpus=server_cores) as server:
        for _ in range(a.rounds):
            for label, path, body in ROUTES:
                file = os.path.join(work, "body.json")
                with open(file, "w") as f:
                    f.write(json.dumps(body).replace("{m}", h.MODEL))
                url = f"http://{server.http_address}{path.replace('{m}', h.MODEL)}"
                cmd = h2load_bench.command(exe, "http", url, a.concurrency, a.duration, a.warmup, file)
                rounds[label].append(h2load_bench.run(cmd, server.metrics_url, h.MODEL, a.warmup, a.duration,
                                                      prefix=pin(client_cores), log=h.log))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"concurrency": a.concurrency, "server_cores": server_cores, "rounds": rounds}, f, indent=1)
    native = statistics.median(r["server_cpu_us_per_request"] for r in rounds[ROUTES[0][0]])
    print(f"qvi-server (null backend) on core(s) {server_cores}, h2load --h1 on {client_cores}, concurrency "
          f"{a.concurrency}, {a.rounds} rounds of {a.duration:g} s; the median round:\n")
    print("| route | requests/s | server CPU µs/request | rounds, µs/request | against native |")
    print("|---|---:|---:|---|---:|")
    for label, _, _ in ROUTES:
        runs = rounds[label]
        us = statistics.median(r["server_cpu_us_per_request"] for r in runs)
        rps = statistics.median(r["ok_per_s"] for r in runs)
        each = ", ".join(f"{r['server_cpu_us_per_request']:.1f}" for r in runs)
        print(f"| {label} | {rps:,.0f} | {us:.1f} | {each} | {us / native:.2f}x |")


if __name__ == "__main__":
    main()
