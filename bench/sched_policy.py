"""SCHED_BATCH against the default policy, side by side (docs/performance.md, "The cost of serving
itself"): the null benchmark's run (bench/null_bench.py: qvi-server on one core, qvi-perf on another,
one ~20-word text per request, concurrency 1, 16, 64 in that order on one server) with qvi-server's
default `--sched-batch` and with `--sched-batch=false`, alternating, three rounds; then the same for
the demo classifier itself (its served package) through gRPC Classify. Prints one line per step.

    .venv/bin/python bench/sched_policy.py [--rounds 3] [--duration 6]   (about 8 minutes)
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import harness  # noqa: E402

POLICIES = (("SCHED_BATCH", ()), ("default", ("--sched-batch=false",)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=1)
    a = ap.parse_args()
    a.null_concurrency = "1,16,64"
    rows = {}  # (model, protocol, concurrency, policy) -> [(requests/s, p50, p99, µs)]
    with tempfile.TemporaryDirectory(prefix="qvi_sched_") as work:
        null = null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)
        demo = os.path.join(harness.REPO, "model_store", "store")
        runs = [("null", null, null_bench.PROTOCOLS), ("demo", demo, null_bench.PROTOCOLS[:1])]
        for model, store, protocols in runs:
            for _ in range(a.rounds):
                for policy, args in POLICIES:
                    out = null_bench.run_null(work, a, harness, server_args=args, store=store, protocols=protocols)
                    for label, r in out["protocols"].items():
                        for s in r["steps"]:
                            rows.setdefault((model, label, int(s["load"]), policy), []).append(
                                (s["requests_per_s"], s["p50_ms"], s["p99_ms"], s.get("server_cpu_us_per_request")))
    print(f"{'model':5} {'protocol':20} {'conc':>4} {'policy':11} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'srv µs/req':>10}   (median of {a.rounds} rounds; each round's µs/req)")
    for (model, label, conc, policy), v in rows.items():
        med = [statistics.median(x[i] for x in v) for i in range(4)]
        each = " ".join(f"{x[3]:.1f}" for x in v)
        print(f"{model:5} {label:20} {conc:>4} {policy:11} {med[0]:>8,.0f} {med[1]:>7.3f} {med[2]:>7.3f} "
              f"{med[3]:>10.1f}   ({each})")


if __name__ == "__main__":
    main()
