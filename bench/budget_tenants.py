"""Busy tenants under a memory budget: the three demo models (sentiment, topics, ner; each declared 100 MiB
in its serving.json) behind --load-on-demand and a --device-memory-budget of 150 MiB, so that one model fits
at a time and each call for another model swaps it in. N gRPC clients (threads, one shared channel), client
i calling model i % 3 back to back with a 10 s deadline each, for --duration seconds. The same store is also
served without a budget (all three loaded), side by side in the same run, for what the swaps cost.

    .venv/bin/python bench/budget_tenants.py [--clients 3 8] [--duration 20]

Prints, per configuration: calls, calls answered OK and every other status seen, calls/s, p50/p99/max
latency, and evictions/s (qvi_model_evictions_total{reason="budget"} over the run).
"""
import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import ServerProcess, api_stubs, metric_sum, metrics_of  # noqa: E402
STORE = os.path.join(REPO, "model_store", "store")
MODELS = ("sentiment", "topics", "ner")
MIB = 1 << 20


def make_store(work):
    store = os.path.join(work, "store")
    for name in MODELS:
        shutil.copytree(os.path.join(STORE, name), os.path.join(store, name))
        with open(os.path.join(store, name, "serving.json"), "w") as f:
            json.dump({"memory_bytes": 100 * MIB}, f)
    return store


def evictions(server):
    return metric_sum(metrics_of(server.metrics_address), "qvi_model_evictions_total", 'reason="budget"')


def run(pb, pbg, work, store, budget, clients, duration, n):
    import grpc
    flags = ["--load-on-demand", "--device-memory-budget", budget] if budget else []
    with ServerProcess(store, work, *flags, http=False, name=f"qvi-server-{n}", plaintext_ready=False) as server:
        channel = grpc.insecure_channel(server.address)
        stub = pbg.InferenceStub(channel)
        for name in MODELS:  # every model answers once before the clock starts
            call(pb, stub, name)
        before = evictions(server)
        latencies, codes = [], collections.Counter()
        lock = threading.Lock()
        stop = time.monotonic() + duration

        def client(i):
            name = MODELS[i % len(MODELS)]
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    call(pb, stub, name)
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name
                with lock:
                    latencies.append(time.monotonic() - t0)
                    codes[code] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        swapped = evictions(server) - before
        channel.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {"calls": len(latencies), "codes": dict(codes), "calls_per_s": len(latencies) / elapsed,
            "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": latencies[-1] * 1000,
            "evictions_per_s": swapped / elapsed}


def call(pb, stub, name):
    if name == "ner":
        return stub.Tag(pb.TagRequest(model=pb.ModelSpec(name=name), texts=["Angela Merkel visited Paris."]),
                        timeout=10)
    return stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name=name), texts=["A moving, funny film."]),
                         timeout=10)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[3, 8])
    p.add_argument("--duration", type=float, default=20)
    a = p.parse_args()
    pb, pbg = api_stubs()
    work = tempfile.mkdtemp(prefix="qvi_budget_bench_")
    try:
        store = make_store(work)
        n = 0
        print(f"{'budget':>8} {'clients':>7} {'calls':>6} {'ok':>6} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'evict/s':>8}  other statuses")
        for clients in a.clients:
            for budget in ("", "150MiB"):
                n += 1
                r = run(pb, pbg, work, store, budget, clients, a.duration, n)
                other = {k: v for k, v in r["codes"].items() if k != "OK"}
                print(f"{budget or 'none':>8} {clients:>7} {r['calls']:>6} {r['codes'].get('OK', 0):>6} "
                      f"{r['calls_per_s']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} "
                      f"{r['evictions_per_s']:>8.2f}  {other or '-'}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
