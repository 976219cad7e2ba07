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

--store demo serves the demo classifier itself (model_store/store/sentiment) instead of its null twin,
and --shared-cores runs server and qvi-perf on every core unpinned, as the full run does (so the server
sizes two instances on a 2-core machine): together, the full run's concurrency-1 set-up, alternated.
"""
import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import harness  # noqa: E402

NAMES = {"grpc": "gRPC Classify", "oip": "OIP ModelInfer", "http": "HTTP/JSON :classify"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the build folder of the other qvi-server")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--protocols", default="grpc,http", help="of grpc, oip, http")
    ap.add_argument("--store", choices=("null", "demo"), default="null",
                    help="the demo classifier's null twin, or the demo classifier itself")
    ap.add_argument("--shared-cores", action="store_true",
                    help="server and qvi-perf on every core, unpinned (default: server on one core)")
    a = ap.parse_args()
    a.null_concurrency = "1,16,64"
    wanted = [NAMES[p] for p in a.protocols.split(",")]
    protocols = [p for p in null_bench.PROTOCOLS if p[0] in wanted]
    before = os.path.abspath(a.before)
    builds = (("after", harness), ("before", types.SimpleNamespace(**{
        k: getattr(harness, k) for k in ("MODEL", "MODEL_PT", "PY", "perf", "log")},
        BUILD=before, serve=functools.partial(harness.serve, build=before))))
    rows = {}  # (protocol, concurrency, build) -> [(requests/s, p50, p99, µs)]
    with tempfile.TemporaryDirectory(prefix="qvi_ab_") as work:
        if a.store == "demo":  # the demo classifier alone, so that the server loads nothing else
            store = os.path.join(work, "demo_store")
            shutil.copytree(os.path.dirname(harness.MODEL_PT), os.path.join(store, harness.MODEL, "1"))
        else:
            store = null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)
        for _ in range(a.rounds):
            for name, h in builds:
                out = null_bench.run_null(work, a, h, store=store, protocols=protocols)
                for label, r in out["protocols"].items():
                    for s in r["steps"]:
                        rows.setdefault((label, int(s["load"]), name), []).append(
                            (s["requests_per_s"], s["p50_ms"], s["p99_ms"], s.get("server_cpu_us_per_request"),
                             s.get("server_switches_per_request", float("nan"))))
    print(f"{'protocol':20} {'conc':>4} {'build':7} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv µs/req':>10} "
          f"{'sw/req':>6}   (median of {a.rounds} rounds; each round's µs/req)")
    for (label, conc, name), v in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "before")):
        med = [statistics.median(x[i] for x in v) for i in range(5)]
        each = " ".join(f"{x[3]:.1f}" for x in v)
        print(f"{label:20} {conc:>4} {name:7} {med[0]:>8,.0f} {med[1]:>7.3f} {med[2]:>7.3f} {med[3]:>10.1f} "
              f"{med[4]:>6.2f}   ({each})")


if __name__ == "__main__":
    main()
