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
import sys
import tempfile
import threading
import time
from collections import Counter

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import ServerProcess, api_stubs, metrics_of  # noqa: E402  (the native API's modules, generated from proto/)
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


def parse_args():
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
    return ap.parse_args()


class Load:
    """The soak's callers: `clients` threads of random Classify and Tag calls (short deadlines and
    cancellations among them) and `floods` threads of oversized requests, each answer's code counted."""

    def __init__(self, args, address):
        self.args, self.address = args, address
        self.pb, self.pb_grpc = api_stubs()
        self.codes, self.flood_codes = Counter(), Counter()
        self.mu = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(args.clients)]
        self.threads += [threading.Thread(target=self.flooder, args=(i,), daemon=True) for i in range(args.floods)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)

    def count(self, counter, allowed, who, code, details=""):
        """Counts one answer; one the soak does not allow is also printed."""
        if code not in allowed:
            print(f"soak: {who}: {code}: {details}", file=sys.stderr)
        with self.mu:
            counter[code] += 1

    def request(self, stub, rng):
        pb = self.pb
        texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))) for _ in range(rng.randint(1, 8))]
        options = pb.OutputOptions(attention=rng.random() < 0.5, gates=rng.random() < 0.5, top_k=rng.randint(0, 2))
        if rng.random() < 0.2:
            options.layers.gates = True
            options.layers.attention_maps = rng.random() < 0.5
            options.layers.layers.append(rng.randint(0, 1))
            options.layers.reduction = pb.LayerReduction.Value("LAYER_REDUCTION_MEAN_HEADS")
        if rng.random() < 0.5:
            return stub.Classify.future, pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                                                            options=options)
        return stub.Tag.future, pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=texts, options=options)

    def client(self, i):
        import grpc
        rng = random.Random(self.args.seed * 1000 + i)
        channel = grpc.insecure_channel(self.address)
        stub = self.pb_grpc.InferenceStub(channel)
        while not self.stopping.is_set():
            call, request = self.request(stub, rng)
            roll = rng.random()
            future = call(request, timeout=0.0005 if roll < 0.1 else 30)
            if roll > 0.9:
                time.sleep(rng.random() * 0.003)
                future.cancel()
            try:
                future.result()
                self.count(self.codes, ALLOWED, f"client {i}", "OK")
            except grpc.FutureCancelledError:
                self.count(self.codes, ALLOWED, f"client {i}", "CANCELLED")
            except grpc.RpcError as e:
                self.count(self.codes, ALLOWED, f"client {i}", e.code().name, e.details())
        channel.close()

    def flooder(self, i):
        import grpc
        channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", 32 << 20)])
        n = i
        while not self.stopping.is_set():
            method, body = FLOODS[n % len(FLOODS)]
            n += 1
            try:
                channel.unary_unary(method)(body, timeout=60)
                self.count(self.flood_codes, FLOOD_ALLOWED, f"flood {method}", "OK", "a flood was accepted")
            except grpc.RpcError as e:
                self.count(self.flood_codes, FLOOD_ALLOWED, f"flood {method}", e.code().name, e.details())
        channel.close()


def observe(args, store, server, load):
    """Until --seconds pass or the server exits: rollouts every --rollout-seconds, the figures after the
    warm-up (start), before each rollout or every --sample-seconds (samples) and at the end (None if it
    crashed)."""
    proc, metrics_address = server.proc, server.metrics_address

    def figures(begin):
        return {**proc_stats(proc.pid), **metric_figures(metrics_address), "at_s": round(time.monotonic() - begin, 1)}

    warmup = args.warmup_seconds if args.warmup_seconds is not None else args.seconds * 0.1
    seen = {"rollouts": [], "samples": [], "start": None}  # samples: shows whether growth levels off
    begin = time.monotonic()
    next_roll = begin + args.rollout_seconds
    next_sample = begin + (args.sample_seconds or float("inf"))
    while time.monotonic() - begin < args.seconds and proc.poll() is None:
        now = time.monotonic()
        if seen["start"] is None and now - begin >= warmup:
            seen["start"] = figures(begin)
            print(f"soak: start {seen['start']}", flush=True)
        if now >= next_sample:
            seen["samples"].append(figures(begin))
            print(f"soak: {now - begin:7.1f} s  rss {seen['samples'][-1]['rss_mib']} MiB  codes so far "
                  f"{dict(load.codes)}{f'  floods {dict(load.flood_codes)}' if args.floods else ''}", flush=True)
            next_sample += args.sample_seconds
        if now >= next_roll:
            if not args.sample_seconds:
                seen["samples"].append(figures(begin))
            seen["rollouts"].append(store.roll())
            print(f"soak: {now - begin:7.1f} s  rollout {seen['rollouts'][-1]}  codes so far {dict(load.codes)}",
                  flush=True)
            next_roll += args.rollout_seconds
        time.sleep(0.2)
    seen["crashed"] = proc.poll() is not None
    seen["end"] = None if seen["crashed"] else figures(begin)
    return seen


def growth_of(start, end, samples):
    """Each figure's growth from start to end, and the trend of the medians of the first and last five samples
    (one sample is one instant: RSS swings with the calls in flight)."""
    growth, trend = {}, {}
    if start and end:
        for k in ("rss_mib", "rss_anon_mib", "rss_file_mib", "fds", "threads", "series", "malloc_in_use_mib"):
            growth[k] = round((end[k] - start[k]) / max(start[k], 1), 4)
    if len(samples) >= 10:
        for k in ("rss_mib", "malloc_in_use_mib"):
            first, last = statistics.median(x[k] for x in samples[:5]), statistics.median(x[k] for x in samples[-5:])
            trend[k] = {"first5": first, "last5": last, "growth": round((last - first) / max(first, 1), 4)}
    return growth, trend


def failures_of(args, load, seen, exit_code, growth):
    failures = []
    bad = {c: n for c, n in load.codes.items() if c not in ALLOWED}
    bad.update({f"flood {c}": n for c, n in load.flood_codes.items() if c not in FLOOD_ALLOWED})
    if bad:
        failures.append(f"codes other than {sorted(ALLOWED)}: {bad}")
    if seen["crashed"] or exit_code != 0:
        failures.append(f"qvi-server exited with {exit_code}")
    if load.codes["OK"] == 0:
        failures.append("no call succeeded")
    if len(seen["rollouts"]) == 0 and args.seconds >= args.rollout_seconds:
        failures.append("no rollout happened")
    if args.max_growth is not None:
        for k, g in growth.items():
            if g > args.max_growth:
                failures.append(f"{k} grew by {g:.1%}, over {args.max_growth:.0%}")
    if args.floods and sum(load.flood_codes.values()) == 0:
        failures.append("no flood was answered")
    return failures


def main():
    args = parse_args()
    work = tempfile.mkdtemp(prefix="qvi_soak_")
    store = Store(os.path.join(work, "store"))
    # Stopped below by hand: the soak reads a crash, and the exit code, itself.
    server = ServerProcess(store.root, work, "--poll-store-seconds", "1", server=args.server, http=False,
                           plaintext_ready=False)
    load = Load(args, server.address)
    seen = observe(args, store, server, load)
    load.stop()
    exit_code = server.proc.poll()
    if exit_code is None:
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(timeout=120)
    growth, trend = growth_of(seen["start"], seen["end"], seen["samples"])
    report = {"seconds": args.seconds, "clients": args.clients, "rollouts": len(seen["rollouts"]),
              "codes": dict(load.codes), "floods": args.floods, "flood_codes": dict(load.flood_codes),
              "start": seen["start"], "end": seen["end"], "growth": growth, "median_trend": trend,
              "server_exit": exit_code, "samples": seen["samples"]}
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    failures = failures_of(args, load, seen, exit_code, growth)
    if failures:
        print(f"soak: FAILED: {'; '.join(failures)}; server log: {server.log_path}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    print("soak: passed")


if __name__ == "__main__":
    main()
