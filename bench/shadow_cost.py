"""What a shadow candidate costs the callers (docs/serving.md, "Shadow versions"): one qvi-server pinned to one
core over `sentiment` v1 and v2 (the null backend's twins, or the demo model's TorchScript file twice), callers on
the other core — `--callers` threads, each sending one test-split text per gRPC Classify and waiting for its answer
(or, with `--rate`, sending at that pace; a late call goes at once and is timed from its send) — timed at the
caller, in rounds that alternate serving.json without a candidate and with v2 as the candidate at each `--fractions` (the server re-reads
it every second; each round waits until the change shows). One server per `--max-cpu-busy` (its
--shadow-max-cpu-busy: mirror only while its CPU is busy less than that share; 1: whenever). Every caller's labels
are checked to be the same with and without the candidate. Prints each condition's median round: caller latency
p50/p99, answers per second, and the texts the candidate compared and those dropped for want of idle CPU.

    .venv/bin/python bench/shadow_cost.py [--backend null|demo] [--callers 4] [--rate 0] [--duration 5] \
        [--rounds 3] [--fractions 0.1 1.0] [--max-cpu-busy 0.5 1]
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time

import grpc
import harness as h
from null_bench import cores, null_store
from qvi_testing import api_stubs, get_json

TEXTS_FILE = os.path.join(h.REPO, "model_store", "data", "sentiment", "test.tsv")


def store_with_two_versions(work, backend):
    store = os.path.join(work, "store")
    if backend == "null":
        made = null_store(work, h.MODEL_PT, h.MODEL, h.PY)
        shutil.copytree(os.path.join(made, h.MODEL, "1"), os.path.join(store, h.MODEL, "1"))
    else:
        os.makedirs(os.path.join(store, h.MODEL, "1"))
        shutil.copy(h.MODEL_PT, os.path.join(store, h.MODEL, "1"))
    shutil.copytree(os.path.join(store, h.MODEL, "1"), os.path.join(store, h.MODEL, "2"))
    return store


def settings_for(backend):
    # the demo model's TorchScript file, not its .pt2 (which the store copy holds none of anyway)
    return {"version_policy": "specific:1,2", **({"format": "torchscript"} if backend == "demo" else {})}


def configure(store, server, channel, backend, fraction):
    """serving.json with v1 serving and, for a fraction, v2 its candidate; returns once the server follows."""
    settings = settings_for(backend)
    if fraction:
        settings["shadow"] = {"version": 2, "fraction": fraction}
    with open(os.path.join(store, h.MODEL, "serving.json"), "w") as f:
        json.dump(settings, f)
    pb, pbg = api_stubs()
    stub = pbg.InferenceStub(channel)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a request that names no version shows whether a candidate samples it
        before = shadow_counts(server)["mirrored"]
        stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name=h.MODEL), texts=["probe"]), timeout=30)
        time.sleep(0.3)
        if (shadow_counts(server)["mirrored"] > before) == bool(fraction) or (fraction and fraction < 1):
            time.sleep(1.5)  # a sampled fraction may miss the probe: give the poll its interval
            return
    raise RuntimeError(f"the server did not take fraction {fraction}")


def shadow_counts(server):
    """Texts sampled, compared, and dropped for want of idle CPU, over every comparison the server holds."""
    c = get_json(server.http_address, f"/v1/models/{h.MODEL}/shadow")["comparisons"]
    return {"mirrored": sum(int(x.get("mirroredTexts", 0)) for x in c),
            "compared": sum(int(x.get("comparedTexts", 0)) for x in c),
            "cpu": sum(int(x.get("droppedTexts", {}).get("cpu", 0)) for x in c)}


def round_of(server, channel, texts, callers, duration, rate):
    pb, pbg = api_stubs()
    stub = pbg.InferenceStub(channel)
    latencies, labels, lock = [], {}, threading.Lock()
    stop = time.monotonic() + duration

    def caller(k):
        i = k
        due = time.monotonic() + (k / (callers * rate) if rate else 0)  # paced callers spread over the period
        while time.monotonic() < stop:
            if rate:  # an open stream: the next call at its time (a late one goes at once, and the pace on)
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                due = max(due, now) + 1.0 / rate
            text = texts[i % len(texts)]
            t0 = time.perf_counter()
            answer = stub.Classify(pb.ClassifyRequest(model=pb.ModelSpec(name=h.MODEL), texts=[text]), timeout=30)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                labels[text] = answer.results[0].labels[0].label
            i += callers
    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    before = shadow_counts(server)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.5)
    after = shadow_counts(server)
    latencies.sort()
    return {"p50_ms": latencies[len(latencies) // 2] * 1e3, "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
            "per_s": len(latencies) / duration, "compared": after["compared"] - before["compared"],
            "cpu": after["cpu"] - before["cpu"], "labels": labels}


def measure(a, store, work, texts, server_cores, max_cpu_busy):
    """One server at --shadow-max-cpu-busy `max_cpu_busy`: each condition's rounds."""
    with open(os.path.join(store, h.MODEL, "serving.json"), "w") as f:
        json.dump(settings_for(a.backend), f)
    conditions = [0.0] + a.fractions
    results = {c: [] for c in conditions}
    with h.serve(store, work, f"qvi-server-shadow-{max_cpu_busy:g}", "--poll-store-seconds", "1",
                 "--shadow-max-cpu-busy", str(max_cpu_busy), cpus=server_cores) as server:
        channel = grpc.insecure_channel(server.address)
        for _ in range(a.rounds):
            for fraction in conditions:
                configure(store, server, channel, a.backend, fraction)
                results[fraction].append(round_of(server, channel, texts, a.callers, a.duration, a.rate))
                h.log(f"max-cpu-busy {max_cpu_busy:g}, fraction {fraction}: "
                      f"{results[fraction][-1]['per_s']:.0f}/s")
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("null", "demo"), default="null")
    p.add_argument("--callers", type=int, default=4)
    p.add_argument("--rate", type=float, default=0, help="calls per second per caller; 0: each waits for its answer")
    p.add_argument("--duration", type=float, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fractions", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--max-cpu-busy", type=float, nargs="+", default=[0.5, 1.0])
    a = p.parse_args()
    with open(TEXTS_FILE) as f:
        texts = [line.rstrip("\n").split("\t", 1)[1] for line in f][:400]
    every = cores()
    server_cores, client_cores = every[:1], every[1:] or every[:1]
    os.sched_setaffinity(0, client_cores)
    work = tempfile.mkdtemp(prefix="qvi_shadow_cost_")
    store = store_with_two_versions(work, a.backend)
    pace = f"each at {a.rate:g}/s" if a.rate else "each waiting for its answer"
    for max_cpu_busy in a.max_cpu_busy:
        results = measure(a, store, work, texts, server_cores, max_cpu_busy)
        off = results[0.0]
        for fraction in a.fractions:
            for r in results[fraction]:
                for text, label in r["labels"].items():
                    for o in off:
                        assert o["labels"].get(text, label) == label, f"{text!r}: {label} with the candidate"
        print(f"\nqvi-server --shadow-max-cpu-busy {max_cpu_busy:g} ({a.backend} backend, sentiment v1 serving, v2 "
              f"the candidate) on core(s) {server_cores}, {a.callers} gRPC callers ({pace}) on {client_cores}, "
              f"{a.rounds} rounds of {a.duration:g} s; the median round; the callers' labels the same in every "
              f"condition:\n")
        print("| shadow fraction | caller p50 ms | caller p99 ms | answers/s | texts compared/s | dropped (cpu)/s "
              "| p50 against off |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        base = statistics.median(r["p50_ms"] for r in off)
        for fraction in [0.0] + a.fractions:
            rs = results[fraction]
            p50 = statistics.median(r["p50_ms"] for r in rs)
            print(f"| {'off' if not fraction else fraction} | {p50:.2f} | "
                  f"{statistics.median(r['p99_ms'] for r in rs):.2f} | {statistics.median(r['per_s'] for r in rs):,.0f} "
                  f"| {statistics.median(r['compared'] for r in rs) / a.duration:,.0f} | "
                  f"{statistics.median(r['cpu'] for r in rs) / a.duration:,.0f} | {p50 / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
