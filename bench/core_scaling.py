"""Does the server's CPU per request grow with its cores? (issue 53, item 4)

qvi-server serves the demo classifier's null twin (no math: the serving path alone) pinned to its first N
cores (taskset), for each N of --cores, under h2load (bench/h2load_bench.py: gRPC Classify over HTTP/2,
HTTP/JSON :classify over HTTP/1.1) pinned to the other cores, or sharing all of them when none are left.
Every figure is the server's own, from its /metrics over the measured window: OK requests/s and
process CPU per request. With a server that scales, the CPU per request stays flat as N grows and
requests/s grows with N until the load generator's cores are the limit. --variants compares sets of
qvi-server flags (e.g. the HTTP threads) at every N.

Usage: .venv/bin/python bench/core_scaling.py [--cores 1,2] [--duration 5] [--warmup 1]
                                             [--grpc-streams 1024] [--http-connections 256]
                                             [--variants 'defaults=;two-http=--http-threads 2'] [--out FILE]
On a GPU machine's 16 cores: --cores 1,2,4,8,16 (bench/gpu_session.sh cores).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2load_bench  # noqa: E402
import null_bench  # noqa: E402
import harness  # noqa: E402


def measure(work, a, store, n, variant, flags, bodies, exe):
    """One server on the first n cores; each protocol under h2load on the others."""
    cores = null_bench.cores()
    server_cores = cores[:n]
    client_cores = cores[n:] or cores
    rows = []
    with harness.serve(store, work, f"qvi-server-{variant}-{n}", "--max-queued-texts", "16384", *flags,
                       cpus=server_cores) as server:
        urls = {"grpc": f"http://{server.address}{h2load_bench.GRPC_PATH}",
                "http": f"http://{server.http_address}/v1/models/{harness.MODEL}:classify"}
        metrics = server.metrics_url
        for protocol, concurrency in (("grpc", a.grpc_streams), ("http", a.http_connections)):
            cmd = h2load_bench.command(exe, protocol, urls[protocol], concurrency, a.duration, a.warmup,
                                       bodies[protocol])
            step = h2load_bench.run(cmd, metrics, harness.MODEL, a.warmup, a.duration,
                                    prefix=null_bench.pin(client_cores), log=harness.log)
            rows.append(dict(step, variant=variant, flags=flags, server_cores=n, client_cores=len(client_cores),
                             protocol=protocol, concurrency=concurrency))
    return rows


def markdown(result):
    lines = [f"Command: `{result['command']}`; the null twin of the demo classifier, one ~20-word text per request; "
             "h2load (gRPC: HTTP/2, 64 streams a connection; HTTP/JSON: HTTP/1.1) on the cores the server does not "
             "have (all of them when it has every core); OK requests/s and CPU from the server's /metrics.", "",
             "| server flags | server cores | h2load cores | protocol | in flight | OK requests/s | "
             "server CPU µs/request |", "|---|---:|---:|---|---:|---:|---:|"]
    for r in result["rows"]:
        flags = f"`{' '.join(r['flags'])}`" if r["flags"] else "(defaults)"
        lines.append(f"| {flags} | {r['server_cores']} | {r['client_cores']} | "
                     f"{'gRPC' if r['protocol'] == 'grpc' else 'HTTP/JSON'} | {r['concurrency']} | "
                     f"{r['ok_per_s']:,.0f} | {r['server_cpu_us_per_request']:.1f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", default="1,2", help="server cores, one server each")
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--grpc-streams", type=int, default=1024)
    ap.add_argument("--http-connections", type=int, default=256)
    ap.add_argument("--variants", default="defaults=", help="';'-separated NAME=FLAGS of qvi-server")
    ap.add_argument("--body", help="the framed gRPC Classify, made beforehand (a machine without grpc_tools)")
    ap.add_argument("--store", help="a store holding the null twin, made beforehand (python -m qvi null)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    a = ap.parse_args()
    exe = h2load_bench.executable(harness.BUILD)
    assert exe, "h2load not found (Debian's nghttp2-client; scripts/setup.sh installs it)"
    work = tempfile.mkdtemp(prefix="qvi_cores_")
    store = a.store or null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)
    bodies = {"grpc": a.body or h2load_bench.grpc_body(work, harness.MODEL), "http": h2load_bench.json_body(work)}
    result = {"command": ".venv/bin/python bench/core_scaling.py " + " ".join(sys.argv[1:]), "rows": []}
    for variant in a.variants.split(";"):
        name, _, flags = variant.partition("=")
        for n in [int(c) for c in a.cores.split(",")]:
            result["rows"] += measure(work, a, store, n, name, flags.split(), bodies, exe)
    print(markdown(result))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
