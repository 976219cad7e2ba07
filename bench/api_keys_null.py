"""What --api-keys costs a call end to end: the null-model server (bench/null_bench.py: the demo
classifier's null twin, no math; the server on one core, qvi-perf on the other) under gRPC Classify at
concurrency 64, one text per request, without keys and with a key file of 1,000 keys (the caller's key
among them, no limits; then with a requests-per-second limit far above the load, so that every call also
takes a bucket), the three configurations taking turns for --rounds rounds. It prints the server's CPU
per request (its process_cpu_seconds_total over each measured window, as null_bench.py reads it) and the
throughput of each run, then the medians.

    .venv/bin/python bench/api_keys_null.py [--rounds 3] [--duration 10]
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import harness as h  # noqa: E402

KEY = "bench-secret-7c21"


def key_file(work, limits):
    keys = [{"name": f"k{i}", "sha256": hashlib.sha256(f"other-{i}".encode()).hexdigest(), "scopes": ["infer"]}
            for i in range(999)]
    mine = {"name": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), "scopes": ["infer", "read"]}
    if limits:
        mine["limits"] = limits
    path = os.path.join(work, f"keys-{'limited' if limits else 'plain'}.json")
    with open(path, "w") as f:
        json.dump({"keys": keys + [mine]}, f)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="qvi_keys_bench_")
    store = null_bench.null_store(work, h.MODEL_PT, h.MODEL, h.PY)
    null_bench.run_h2load = lambda *args, **kwargs: {}  # h2load sends no key: qvi-perf alone here
    configs = [("no --api-keys", [], None),
               ("1,000 keys", ["--api-keys", key_file(work, None)], KEY),
               ("1,000 keys + a request bucket", ["--api-keys", key_file(work, {"requests_per_second": 1e9})], KEY)]
    opts = types.SimpleNamespace(null_concurrency="64", duration=a.duration, warmup=a.warmup, null_rounds=1)
    results = {label: [] for label, _, _ in configs}
    for r in range(a.rounds):
        for label, args, key in configs:
            if key:
                os.environ["QVI_API_KEY"] = key
            else:
                os.environ.pop("QVI_API_KEY", None)
            out = null_bench.run_null(work, opts, h, server_args=args, store=store,
                                      protocols=(("gRPC Classify", []),))
            step = out["protocols"]["gRPC Classify"]["steps"][0]
            cpu = step.get("server_cpu_us_per_request")
            results[label].append((cpu, step.get("requests_per_s")))
            print(f"round {r + 1}  {label:32s} server CPU {cpu:.1f} µs/request  {step.get('requests_per_s', 0):.0f} requests/s  "
                  f"errors {step.get('errors', 0)}", flush=True)
    print("\nmedians (gRPC Classify, concurrency 64, one text per request):")
    base = statistics.median(c for c, _ in results[configs[0][0]])
    for label, _, _ in configs:
        cpu = statistics.median(c for c, _ in results[label])
        rps = statistics.median(r for _, r in results[label])
        print(f"  {label:32s} {cpu:6.1f} µs/request ({cpu - base:+.1f})  {rps:7.0f} requests/s")


if __name__ == "__main__":
    main()
