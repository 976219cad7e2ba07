"""The response cache under a skewed mix: 10,000 distinct texts asked with Zipf frequencies (s = 1.1, the
most frequent first), one text per gRPC Classify with α and β, the demo classifier on the CPU, qvi-perf
at a fixed concurrency. The same server is started without and with --response-cache-bytes, taking turns
for --rounds rounds; it prints texts/s, p50 and p99 of each run and the cache's hit rate, then the medians
and the ratio.

    .venv/bin/python bench/response_cache_zipf.py [--rounds 2] [--duration 15] [--concurrency 16]

The texts are made here from a fixed word list with a fixed seed (about 12 words each), so the mix is the
same for every run and every machine; qvi-perf sends the Zipf-drawn sequence in order, cycling.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF = os.path.join(REPO, "build", "qvi-perf")
STORE = os.path.join(REPO, "model_store", "store")
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import ServerProcess, metrics_of  # noqa: E402  (the one launcher, the one reader of /metrics)
WORDS = ("a film story actor scene plot moving funny dull long short bright dark slow quick warm cold "
         "tender cruel clever silly honest hollow great poor fine awful charming tedious gripping flat rich "
         "thin bold timid sharp vague lovely ugly fresh stale brave weak the and but with of in on at as "
         "it is was not very too quite rather").split()


def texts(n, seed):
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        t = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))) + "."
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def zipf_sequence(distinct, length, s, seed):
    weights = [1.0 / (k ** s) for k in range(1, len(distinct) + 1)]
    return random.Random(seed).choices(distinct, weights=weights, k=length)


def metric(server, series):
    return metrics_of(server.metrics_address).get(series, 0.0)


def run(work, texts_file, cache_bytes, a, n):
    flags = ["--response-cache-bytes", str(cache_bytes)] if cache_bytes else []
    with ServerProcess(STORE, work, *flags, http=False, name=f"qvi-server-{n}", plaintext_ready=False) as server:
        out = os.path.join(work, f"perf{n}.json")
        subprocess.run([PERF, "--server", server.address, "--texts-file", texts_file, "--attention", "--gates",
                        "--concurrency", str(a.concurrency), "--duration", str(a.duration), "--warmup",
                        str(a.warmup), "--json", out], check=True, stdout=subprocess.DEVNULL)
        step = json.load(open(out))["steps"][0]
        hits = metric(server, 'qvi_response_cache_hits_total{model="sentiment"}')
        misses = metric(server, 'qvi_response_cache_misses_total{model="sentiment"}')
        return {"texts_per_s": step["texts_per_s"], "p50_ms": step["p50_ms"], "p99_ms": step["p99_ms"],
                "errors": sum(step.get("errors", {}).values()), "hit_rate": hits / (hits + misses) if hits + misses else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--cache-bytes", type=int, default=256 << 20)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="qvi_cache_bench_")
    texts_file = os.path.join(work, "zipf.txt")
    with open(texts_file, "w") as f:
        f.write("\n".join(zipf_sequence(texts(10_000, 1), 200_000, 1.1, 2)) + "\n")
    configs = [("no cache", 0), (f"--response-cache-bytes {a.cache_bytes}", a.cache_bytes)]
    results = {label: [] for label, _ in configs}
    n = 0
    for r in range(a.rounds):
        for label, cache in configs:
            n += 1
            out = run(work, texts_file, cache, a, n)
            results[label].append(out)
            print(f"round {r + 1} {label:34s} {out['texts_per_s']:8.1f} texts/s  p50 {out['p50_ms']:7.2f} ms  "
                  f"p99 {out['p99_ms']:7.2f} ms  hit rate {out['hit_rate']:.3f}  errors {out['errors']}", flush=True)
    print(f"\nmedians ({a.rounds} rounds; Zipf s=1.1 over 10,000 texts, concurrency {a.concurrency}, "
          f"α and β asked, one text per call):")
    med = {}
    for label, _ in configs:
        med[label] = {k: statistics.median(o[k] for o in results[label]) for k in ("texts_per_s", "p50_ms", "p99_ms",
                                                                                   "hit_rate")}
        m = med[label]
        print(f"  {label:34s} {m['texts_per_s']:8.1f} texts/s  p50 {m['p50_ms']:7.2f} ms  p99 {m['p99_ms']:7.2f} ms"
              f"  hit rate {m['hit_rate']:.3f}")
    base, cached = med[configs[0][0]], med[configs[1][0]]
    print(f"  with the cache: {cached['texts_per_s'] / base['texts_per_s']:.2f}x the texts/s, "
          f"p99 {cached['p99_ms'] / base['p99_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
