#!/usr/bin/env python3
"""Soak: runs qvi-server under mixed traffic with a version rollout every minute, and reports how its
resources moved.

Traffic (--clients threads, each its own channel): Classify on `sentiment` and Tag on `ner`, one to
eight texts of 1 to 120 words, with a random mix of explanations (α, β, per-layer gates, averaged
attention maps of a layer); one call in ten has a deadline too short to meet, one in ten is cancelled
by the client soon after it is sent. Every --rollout-seconds a new version of one of the two models is
staged and renamed into the store (the server polls it every second), and the version before the one
it replaces is deleted, so the store stays two versions deep.

With --floods N, N more threads send, one after another, requests of 16 MiB made of nothing but empty
repeated elements (Classify texts, ModelInfer inputs, outputs, raw contents, parameters) — what cost
the server ~100x their size before the wire walk refused them — each to be answered INVALID_ARGUMENT
(or RESOURCE_EXHAUSTED when the bytes in flight are over their limit); any other code fails the soak.

Reported at the start (after a warm-up) and at the end: the server's RSS, open file descriptors,
threads, and the number of series on /metrics (and the same before each rollout, or every
--sample-seconds, in the JSON's "samples"); and every status code the clients saw. Exits 1 when a
client saw a code other than OK, DEADLINE_EXCEEDED or CANCELLED, when the server died or did not
exit cleanly on SIGTERM, or (with --max-growth) when RSS, descriptors, threads or series grew more
than that fraction. Timings are printed, never gated.

  scripts/soak.py                      # 30 minutes, the issue-13 soak
  scripts/soak.py --seconds 60 --rollout-seconds 15   # the test command's short run
  scripts/soak.py --seconds 3600 --rollout-seconds 1e9 --clients 12 --floods 2 --sample-seconds 60 \
      --warmup-seconds 300 --max-growth 0.05          # issue 29: its mix and the floods, an hour
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import api_stubs, metrics_of  # noqa: E402  (the native API's modules, generated from proto/)
ALLOWED = {"OK", "DEADLINE_EXCEEDED", "CANCELLED"}
FLOOD_ALLOWED = {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}
FLOOD_BYTES = (16 << 20) - 1024  # within the default message limit


def flood(field, size=FLOOD_BYTES):
    """Message field `field` (< 16) as empty length-delimited elements, repeated to `size` bytes."""
    return (bytes([(field << 3) | 2]) + b"\x00") * (size // 2)


FLOODS = [("/qvi.serving.v1.Inference/Classify", flood(2)), ("/qvi.serving.v1.Inference/Tag", flood(2))] + [
    ("/inference.GRPCInferenceService/ModelInfer", flood(f)) for f in (4, 5, 6, 7)]
WORDS = ("the film was great and the cast was wonderful but the plot dragged in the middle while "
         "Alice met Bob in Paris at the United Nations on Monday and nobody liked the ending at all").split()


def proc_stats(pid):
    stats = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                stats["rss_mib"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("RssAnon:"):  # the heap, stacks, anonymous mappings
                stats["rss_anon_mib"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("RssFile:"):  # pages of the binary and its libraries touched so far
                stats["rss_file_mib"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("Threads:"):
                stats["threads"] = int(line.split()[1])
    stats["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return stats


MALLOC_SERIES = re.compile(r'^qvi_malloc_bytes\{allocator="(\w+)",state="(\w+)"\}$')


def metric_figures(address):
    """The number of metric series, and what malloc holds (in use by the server, free for reuse)."""
    samples = metrics_of(address)
    figures = {"series": len(samples)}
    for series, value in samples.items():
        m = MALLOC_SERIES.match(series)
        if m:
            figures["allocator"] = m.group(1)
            figures[f"malloc_{m.group(2)}_mib"] = round(value / 2**20, 1)
    return figures


class Store:
    """A copy of the three GloVe demo models (whatever else the demo store holds) whose models get a new version
    on each roll()."""

    def __init__(self, root):
        self.root = root
        for name in ("ner", "sentiment", "topics"):
            shutil.copytree(os.path.join(REPO, "model_store", "store", name), os.path.join(root, name))
        self.latest = {m: max(int(v) for v in os.listdir(os.path.join(root, m)) if v.isdigit())
                       for m in ("sentiment", "ner")}
        self.rolls = 0

    def roll(self):
        model = ("sentiment", "ner")[self.rolls % 2]
        self.rolls += 1
        old = self.latest[model]
        new = old + 1
        staging = os.path.join(self.root, model, f".{new}.tmp")
        shutil.copytree(os.path.join(self.root, model, str(old)), staging)
        os.rename(staging, os.path.join(self.root, model, str(new)))
        self.latest[model] = new
        # The version before `old` was replaced at the previous roll and has long drained.
        shutil.rmtree(os.path.join(self.root, model, str(old - 1)), ignore_errors=True)
        return f"{model} {old} -> {new}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--rollout-seconds", type=float, default=60)
    ap.add_argument("--warmup-seconds", type=float, default=None, help="before the start figures (default: 10%%)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--server", default=os.environ.get("QVI_SERVER", os.path.join(REPO, "build", "qvi-server")))
    ap.add_argument("--max-growth", type=float, default=None, help="fail when a figure grows by more (0.05 = 5%%)")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--floods", type=int, default=0, help="threads sending 16 MiB floods of empty elements")
    ap.add_argument("--sample-seconds", type=float, default=None,
                    help="take the figures this often (default: before each rollout)")
    args = ap.parse_args()
    import grpc
    pb, pb_grpc = api_stubs()

    work = tempfile.mkdtemp(prefix="qvi_soak_")
    store = Store(os.path.join(work, "store"))
    port_file, metrics_file = os.path.join(work, "port"), os.path.join(work, "metrics_port")
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen([args.server, "--model-store", store.root, "--host", "127.0.0.1", "--port", "0",
                               "--port-file", port_file, "--metrics-port", "0", "--metrics-port-file", metrics_file,
                               "--http-port", "-1", "--device", "cpu", "--poll-store-seconds", "1"],
                              stdout=log, stderr=subprocess.STDOUT)
    started = time.monotonic()
    while not (os.path.exists(port_file) and os.path.exists(metrics_file)):
        if server.poll() is not None or time.monotonic() - started > 120:
            sys.exit(f"soak: qvi-server did not start; see {log.name}")
        time.sleep(0.05)
    address = f"127.0.0.1:{int(open(port_file).read())}"
    metrics_address = f"127.0.0.1:{int(open(metrics_file).read())}"

    codes, flood_codes = Counter(), Counter()
    codes_mu = threading.Lock()
    stop = threading.Event()

    def count(counter, allowed, who, code, details=""):
        """Counts one answer; one the soak does not allow is also printed."""
        if code not in allowed:
            print(f"soak: {who}: {code}: {details}", file=sys.stderr)
        with codes_mu:
            counter[code] += 1

    def client(i):
        rng = random.Random(args.seed * 1000 + i)
        channel = grpc.insecure_channel(address)
        stub = pb_grpc.InferenceStub(channel)
        while not stop.is_set():
            texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))) for _ in range(rng.randint(1, 8))]
            options = pb.OutputOptions(attention=rng.random() < 0.5, gates=rng.random() < 0.5,
                                       top_k=rng.randint(0, 2))
            if rng.random() < 0.2:
                options.layers.gates = True
                options.layers.attention_maps = rng.random() < 0.5
                options.layers.layers.append(rng.randint(0, 1))
                options.layers.reduction = pb.LayerReduction.Value("LAYER_REDUCTION_MEAN_HEADS")
            if rng.random() < 0.5:
                call = stub.Classify.future
                request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts, options=options)
            else:
                call = stub.Tag.future
                request = pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=texts, options=options)
            roll = rng.random()
            timeout = 0.0005 if roll < 0.1 else 30
            future = call(request, timeout=timeout)
            if roll > 0.9:
                time.sleep(rng.random() * 0.003)
                future.cancel()
            try:
                future.result()
                count(codes, ALLOWED, f"client {i}", "OK")
            except grpc.FutureCancelledError:
                count(codes, ALLOWED, f"client {i}", "CANCELLED")
            except grpc.RpcError as e:
                count(codes, ALLOWED, f"client {i}", e.code().name, e.details())
        channel.close()

    def flooder(i):
        channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 32 << 20)])
        n = i
        while not stop.is_set():
            method, body = FLOODS[n % len(FLOODS)]
            n += 1
            try:
                channel.unary_unary(method)(body, timeout=60)
                count(flood_codes, FLOOD_ALLOWED, f"flood {method}", "OK", "a flood was accepted")
            except grpc.RpcError as e:
                count(flood_codes, FLOOD_ALLOWED, f"flood {method}", e.code().name, e.details())
        channel.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    threads += [threading.Thread(target=flooder, args=(i,), daemon=True) for i in range(args.floods)]
    for t in threads:
        t.start()
    warmup = args.warmup_seconds if args.warmup_seconds is not None else args.seconds * 0.1
    rollouts = []
    samples = []  # the figures just before each rollout: shows whether growth levels off
    begin = time.monotonic()
    next_roll = begin + args.rollout_seconds
    next_sample = begin + (args.sample_seconds or float("inf"))
    start_figures = None
    while time.monotonic() - begin < args.seconds and server.poll() is None:
        now = time.monotonic()
        if start_figures is None and now - begin >= warmup:
            start_figures = {**proc_stats(server.pid), **metric_figures(metrics_address),
                             "at_s": round(now - begin, 1)}
            print(f"soak: start {start_figures}", flush=True)
        if now >= next_sample:
            samples.append({**proc_stats(server.pid), **metric_figures(metrics_address), "at_s": round(now - begin, 1)})
            print(f"soak: {now - begin:7.1f} s  rss {samples[-1]['rss_mib']} MiB  codes so far {dict(codes)}"
                  f"{f'  floods {dict(flood_codes)}' if args.floods else ''}", flush=True)
            next_sample += args.sample_seconds
        if now >= next_roll:
            if not args.sample_seconds:
                samples.append({**proc_stats(server.pid), **metric_figures(metrics_address),
                                "at_s": round(now - begin, 1)})
            rollouts.append(store.roll())
            print(f"soak: {now - begin:7.1f} s  rollout {rollouts[-1]}  codes so far {dict(codes)}", flush=True)
            next_roll += args.rollout_seconds
        time.sleep(0.2)
    crashed = server.poll() is not None
    end_figures = None if crashed else {**proc_stats(server.pid), **metric_figures(metrics_address),
                                        "at_s": round(time.monotonic() - begin, 1)}
    stop.set()
    for t in threads:
        t.join(timeout=60)
    exit_code = server.poll()
    if exit_code is None:
        server.send_signal(signal.SIGTERM)
        exit_code = server.wait(timeout=120)
    log.close()

    growth = {}
    if start_figures and end_figures:
        for k in ("rss_mib", "rss_anon_mib", "rss_file_mib", "fds", "threads", "series", "malloc_in_use_mib"):
            growth[k] = round((end_figures[k] - start_figures[k]) / max(start_figures[k], 1), 4)
    # One sample is one instant: RSS swings with the calls in flight. The medians of the first and
    # last five samples before rollouts say whether it trends.
    trend = {}
    if len(samples) >= 10:
        for k in ("rss_mib", "malloc_in_use_mib"):
            first, last = statistics.median(x[k] for x in samples[:5]), statistics.median(x[k] for x in samples[-5:])
            trend[k] = {"first5": first, "last5": last, "growth": round((last - first) / max(first, 1), 4)}
    bad = {c: n for c, n in codes.items() if c not in ALLOWED}
    bad.update({f"flood {c}": n for c, n in flood_codes.items() if c not in FLOOD_ALLOWED})
    report = {"seconds": args.seconds, "clients": args.clients, "rollouts": len(rollouts), "codes": dict(codes),
              "floods": args.floods, "flood_codes": dict(flood_codes),
              "start": start_figures, "end": end_figures, "growth": growth, "median_trend": trend, "server_exit": exit_code,
              "samples": samples}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    failures = []
    if bad:
        failures.append(f"codes other than {sorted(ALLOWED)}: {bad}")
    if crashed or exit_code != 0:
        failures.append(f"qvi-server exited with {exit_code}")
    if codes["OK"] == 0:
        failures.append("no call succeeded")
    if len(rollouts) == 0 and args.seconds >= args.rollout_seconds:
        failures.append("no rollout happened")
    if args.max_growth is not None:
        for k, g in growth.items():
            if g > args.max_growth:
                failures.append(f"{k} grew by {g:.1%}, over {args.max_growth:.0%}")
    if args.floods and sum(flood_codes.values()) == 0:
        failures.append("no flood was answered")
    if failures:
        print(f"soak: FAILED: {'; '.join(failures)}; server log: {os.path.join(work, 'server.log')}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print("soak: passed")


if __name__ == "__main__":
    main()
