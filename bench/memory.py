"""What qvi-server holds in memory: at idle, and per request in flight under a given mix.

Starts build/qvi-server (or --server) over the demo store, warms it, and reads its RSS and what its
malloc holds in use (qvi_malloc_bytes) at idle. Then, for each concurrency C of --concurrency, C
client threads (each with its own channel) send the same request back to back for --seconds; RSS is
sampled every 50 ms and the peak and mean above idle are divided by C: the memory one request in
flight costs. After each step the server rests --rest-seconds and RSS is read again (what stays held).

Requests (--mix):
  typical   Classify on sentiment, 8 texts of 40 words, α and β
  maps      Tag on ner, 8 texts of 80 words, α, β, and every layer's and head's attention map and gates
  largest   Classify on sentiment, 256 texts of 120 words (the per-request cap), every layer's maps

  .venv/bin/python bench/memory.py --mix typical maps --concurrency 1 4 16 64

Prints one Markdown table; docs/performance.md ("Memory") quotes it with the machine it ran on.
"""
import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from qvi_testing import ServerProcess, api_stubs, metric_sum, metrics_of  # noqa: E402  (the native API's modules, generated from proto/)

WORDS = ("the film was great and the cast was wonderful but the plot dragged in the middle while "
         "Alice met Bob in Paris at the United Nations on Monday").split()


def text(n, seed):
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] for i in range(n))


def request(pb, mix):
    if mix == "typical":
        return "Classify", pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"),
                                              texts=[text(40, i) for i in range(8)],
                                              options=pb.OutputOptions(attention=True, gates=True))
    if mix == "maps":
        layers = pb.LayerOptions(gates=True, attention_maps=True)
        return "Tag", pb.TagRequest(model=pb.ModelSpec(name="ner"), texts=[text(80, i) for i in range(8)],
                                    options=pb.OutputOptions(attention=True, gates=True, layers=layers))
    layers = pb.LayerOptions(gates=True, attention_maps=True)
    return "Classify", pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"),
                                          texts=[text(120, i) for i in range(256)],
                                          options=pb.OutputOptions(attention=True, gates=True, layers=layers))


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def malloc_in_use_mib(metrics_address):
    samples = metrics_of(metrics_address)
    if not any(s.startswith("qvi_malloc_bytes{") for s in samples):
        return float("nan")
    return metric_sum(samples, "qvi_malloc_bytes", 'state="in_use"') / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=os.path.join(REPO, "build", "qvi-server"))
    ap.add_argument("--store", default=os.path.join(REPO, "model_store", "store"))
    ap.add_argument("--mix", nargs="+", default=["typical", "maps"], choices=("typical", "maps", "largest"))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rest-seconds", type=float, default=5)
    ap.add_argument("--server-args", default="", help="more flags for qvi-server, one string")
    args = ap.parse_args()
    pb, pb_grpc = api_stubs()
    work = tempfile.mkdtemp(prefix="qvi_memory_")
    with ServerProcess(args.store, work, "--max-message-bytes", str(64 << 20), *args.server_args.split(),
                       server=args.server, http=False, plaintext_ready=False, startup_seconds=180) as server:
        proc, address, metrics = server.proc, server.address, server.metrics_address
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        channel = grpc.insecure_channel(address, options=options)
        grpc.channel_ready_future(channel).result(timeout=60)
        for mix in args.mix:  # warm: each request once
            method, req = request(pb, mix)
            getattr(pb_grpc.InferenceStub(channel), method)(req, timeout=120)
        time.sleep(args.rest_seconds)
        idle, idle_malloc = rss_mib(proc.pid), malloc_in_use_mib(metrics)
        print(f"qvi-server {os.path.relpath(args.server, REPO)}, demo store; idle after one call of each mix: "
              f"RSS {idle:.0f} MiB, malloc in use {idle_malloc:.0f} MiB\n")
        print("| mix | in flight | calls | RSS peak above idle | per call in flight (peak) | mean above idle "
              f"| RSS after {args.rest_seconds:g} s rest | malloc in use after |")
        print("|---|---|---|---|---|---|---|---|")
        for mix in args.mix:
            method, req = request(pb, mix)
            for c in args.concurrency:
                base = rss_mib(proc.pid)
                stop = threading.Event()
                calls = [0] * c
                errors = []

                def client(k):
                    ch = grpc.insecure_channel(address, options=options)
                    call = getattr(pb_grpc.InferenceStub(ch), method)
                    while not stop.is_set():
                        try:
                            call(req, timeout=300)
                            calls[k] += 1
                        except grpc.RpcError as e:
                            errors.append(e.code().name)
                    ch.close()

                threads = [threading.Thread(target=client, args=(k,)) for k in range(c)]
                for t in threads:
                    t.start()
                samples = []
                end = time.monotonic() + args.seconds
                while time.monotonic() < end:
                    samples.append(rss_mib(proc.pid))
                    time.sleep(0.05)
                stop.set()
                for t in threads:
                    t.join()
                time.sleep(args.rest_seconds)
                after, after_malloc = rss_mib(proc.pid), malloc_in_use_mib(metrics)
                peak = max(samples) - base
                print(f"| {mix} | {c} | {sum(calls)} | {peak:.0f} MiB | {peak / c:.1f} MiB | "
                      f"{statistics.mean(samples) - base:.0f} MiB | {after:.0f} MiB | {after_malloc:.0f} MiB |"
                      + (f" errors: {sorted(set(errors))}" if errors else ""))


if __name__ == "__main__":
    main()
