"""Two qvi-server builds side by side on the null benchmark (bench/null_bench.py: the server on one core,
qvi-perf on another, one ~20-word text per request, concurrency 1, 16, 64 in that order on one server),
alternating, several rounds: a change against the commit before it, on the same machine in one run.
The load generator is this checkout's qvi-perf for both. Prints one line per step: medians over the
rounds, and each round's server µs per request.

    git worktree add /tmp/qvi-before HEAD~1
    (cd /tmp/qvi-before && export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1 &&
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQVI_TORCH_DIR=$(.../torch) &&
     ninja -C build qvi-server)
    .venv/bin/python bench/ab_builds.py --before /tmp/qvi-before/build [--rounds 3] [--protocols grpc,http]

(about 5 minutes for three rounds of two protocols.)
"""
import argparse
import os
import statistics
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import run as harness  # noqa: E402

NAMES = {"grpc": "gRPC Classify", "oip": "OIP ModelInfer", "http": "HTTP/JSON :classify"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the build folder of the other qvi-server")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--protocols", default="grpc,http", help="of grpc, oip, http")
    a = ap.parse_args()
    a.null_concurrency = "1,16,64"
    wanted = [NAMES[p] for p in a.protocols.split(",")]
    protocols = [p for p in null_bench.PROTOCOLS if p[0] in wanted]
    builds = (("after", harness), ("before", types.SimpleNamespace(**{
        k: getattr(harness, k) for k in ("MODEL", "MODEL_PT", "PY", "perf", "wait_for_file", "stop", "log")},
        BUILD=os.path.abspath(a.before))))
    rows = {}  # (protocol, concurrency, build) -> [(requests/s, p50, p99, µs)]
    with tempfile.TemporaryDirectory(prefix="qvi_ab_") as work:
        store = null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)
        for _ in range(a.rounds):
            for name, h in builds:
                out = null_bench.run_null(work, a, h, store=store, protocols=protocols)
                for label, r in out["protocols"].items():
                    for s in r["steps"]:
                        rows.setdefault((label, int(s["load"]), name), []).append(
                            (s["requests_per_s"], s["p50_ms"], s["p99_ms"], s.get("server_cpu_us_per_request")))
    print(f"{'protocol':20} {'conc':>4} {'build':7} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv µs/req':>10}   "
          f"(median of {a.rounds} rounds; each round's µs/req)")
    for (label, conc, name), v in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "before")):
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        each = " ".join(f"{x[3]:.1f}" for x in v)
        print(f"{label:20} {conc:>4} {name:7} {med[0]:>8,.0f} {med[1]:>7.3f} {med[2]:>7.3f} {med[3]:>10.1f}   ({each})")


if __name__ == "__main__":
    main()
