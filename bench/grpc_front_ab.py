"""gRPC's own cost per call on its callback API against its completion-queue API, side by side, before
a front end is rewritten (docs/performance.md, "gRPC's APIs measured alone"): qvi-bench-grpc-front
(bench/bench_grpc_front.cc: a Classify server that answers one fixed message and does nothing else) in
each configuration below, and qvi-server itself on the null model (bench/null_bench.py) as the
reference, each on core 0 with qvi-perf on core 1, one ~20-word text per request, concurrency 1, 16,
64 in that order on a fresh server; the configurations take turns, --rounds rounds; medians, and each
round's server CPU µs per request.

    .venv/bin/python bench/grpc_front_ab.py [--rounds 3] [--duration 4] [--set api|args|http]   (about 5 minutes)

--set http does the same for the HTTP/JSON route: qvi-server's own HTTP server answering every POST with
one fixed JSON answer (--api http), inline and from a worker thread, beside qvi-server's
POST /v1/models/sentiment:classify on the null model.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import harness  # noqa: E402

CONFIGS = (  # (label, qvi-bench-grpc-front arguments; None: qvi-server on the null model)
    ("callback, inline", ["--api", "callback", "--handoff", "inline"]),
    ("callback, worker", ["--api", "callback", "--handoff", "worker"]),
    ("async 1 CQ, inline", ["--api", "async", "--threads", "1", "--handoff", "inline"]),
    ("async 1 CQ, worker", ["--api", "async", "--threads", "1", "--handoff", "worker"]),
    ("async 2 CQ, worker", ["--api", "async", "--threads", "2", "--handoff", "worker"]),
    ("qvi-server, null model", None),
)
# --set args: gRPC's channel arguments that could trim its own per-call work, on the callback API
# with a worker thread (qvi-server's layout).
ARG_CONFIGS = (
    ("callback, worker", ["--api", "callback", "--handoff", "worker"]),
    ("+ minimal stack", ["--api", "callback", "--handoff", "worker", "--channel-arg", "grpc.minimal_stack=1"]),
    ("+ no BDP probe", ["--api", "callback", "--handoff", "worker", "--channel-arg", "grpc.http2.bdp_probe=0"]),
    ("+ no SCHED_BATCH", ["--api", "callback", "--handoff", "worker", "--sched-batch", "false"]),
)
# --set http: qvi-server's HTTP server alone, and qvi-server's HTTP/JSON route on the null model.
HTTP_CONFIGS = (
    ("HTTP server, inline", ["--api", "http", "--handoff", "inline"]),
    ("HTTP server, worker", ["--api", "http", "--handoff", "worker"]),
    ("qvi-server HTTP, null", None),
)


def front(work, a, label, args, server_cores, client_cores):
    """One round of qvi-bench-grpc-front in one configuration: qvi-perf's steps."""
    files = null_bench.port_files(work, "front", ("port", "metrics"))
    proc = subprocess.Popen([*null_bench.pin(server_cores), os.path.join(harness.BUILD, "qvi-bench-grpc-front"), *args,
                             "--port-file", files["port"], "--metrics-port-file", files["metrics"]])
    try:
        port = harness.wait_for_file(files["port"], proc, "qvi-bench-grpc-front")
        metrics = harness.wait_for_file(files["metrics"], proc, "qvi-bench-grpc-front")
        common = ["--model", harness.MODEL, "--concurrency", a.null_concurrency, "--duration", str(a.duration),
                  "--warmup", str(a.warmup), "--words", "20", "--metrics", f"http://127.0.0.1:{metrics}/metrics"]
        name = "front-" + "".join(c if c.isalnum() else "-" for c in label)
        target = (["--http", f"http://127.0.0.1:{port}/v1/models/{harness.MODEL}:classify", "--http-body", "json"]
                  if "http" in args else ["--server", f"127.0.0.1:{port}"])
        return harness.perf(work, name, target, common, prefix=null_bench.pin(client_cores))["steps"]
    finally:
        harness.stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--set", choices=("api", "args", "http"), default="api",
                    help="api: the APIs and hand-offs, and qvi-server; args: channel arguments on the callback API; "
                         "http: the HTTP server alone, and qvi-server's HTTP/JSON route")
    ap.add_argument("--server-variants", default="",
                    help="';'-separated NAME=FLAGS: more qvi-server rows on the null model, each with these flags "
                         "(e.g. 'no pool=--answer-threads 0')")
    a = ap.parse_args()
    configs = {"api": CONFIGS, "args": ARG_CONFIGS, "http": HTTP_CONFIGS}[a.set]
    # A qvi-server row is (label, None) or, with flags of its own, (label, ("qvi-server", flags)).
    configs += tuple((f"qvi-server, {name.strip()}", ("qvi-server", flags.split()))
                     for name, _, flags in (v.partition("=") for v in a.server_variants.split(";") if v.strip()))
    # qvi-server's reference row: gRPC Classify, or the HTTP/JSON route for --set http.
    wanted = "HTTP/JSON :classify" if a.set == "http" else "gRPC Classify"
    reference = [p for p in null_bench.PROTOCOLS if p[0] == wanted]
    a.null_concurrency = "1,16,64"
    cores = null_bench.cores()
    server_cores, client_cores = cores[:1], cores[1:] or cores[:1]
    rows = {}  # (config, concurrency) -> [(requests/s, p50, p99, µs)]
    with tempfile.TemporaryDirectory(prefix="qvi_front_") as work:
        null = null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)
        for _ in range(a.rounds):
            for label, args in configs:
                if args is None or args[0] == "qvi-server":
                    out = null_bench.run_null(work, a, harness, server_args=args[1] if args else (), store=null,
                                              protocols=reference)
                    steps = next(iter(out["protocols"].values()))["steps"]
                else:
                    steps = front(work, a, label, args, server_cores, client_cores)
                for s in steps:
                    rows.setdefault((label, int(s["load"])), []).append(
                        (s["requests_per_s"], s["p50_ms"], s["p99_ms"], s.get("server_cpu_us_per_request", 0.0)))
    print(f"{'server':24} {'conc':>4} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv µs/req':>10}   "
          f"(median of {a.rounds} rounds; each round's µs/req)")
    for (label, conc), v in sorted(rows.items(), key=lambda kv: (kv[0][1], [c[0] for c in configs].index(kv[0][0]))):
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        each = " ".join(f"{x[3]:.1f}" for x in v)
        print(f"{label:24} {conc:>4} {med[0]:>8,.0f} {med[1]:>7.3f} {med[2]:>7.3f} {med[3]:>10.1f}   ({each})")


if __name__ == "__main__":
    main()
