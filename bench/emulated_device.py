"""How well the engine keeps an accelerator busy with one-text requests, measured on the CPU.

qvi-server serves the demo classifier's null twin (server/core/model/null_model.h: its manifest and
vocabulary, no math) with a GPU's batching (max_batch_size 256, one instance), twice in turn on the same
cores: as it is, and on an emulated device that holds every batch for per_batch + per_text x its texts
microseconds (model.null's "device_us"), a timed wait that uses no CPU. One ~20-word text per gRPC
Classify at each concurrency, from qvi-perf and from h2load (Debian's nghttp2-client: gRPC as HTTP/2
POSTs of one framed request, a load generator this project did not write). Every figure comes from the server over the same window:
OK texts/s (qvi_requests_total: h2load counts a gRPC error as an HTTP 200), the device's busy share (qvi_device_busy_seconds_total), the mean batch
(qvi_batch_size), the server's CPU per request (process_cpu_seconds_total) and the instance threads' CPU
per batch and per text (/proc/PID/task/TID/schedstat of the threads named qvi-instance).

Issue 53's targets on the 2-core machine (per_batch 300 µs, per_text 3 µs, 1,024 in flight): texts/s at
least 0.9x the null model's on the same cores, the instance thread's CPU at most 5 µs per text, a mean
batch of at least 64.

Usage: .venv/bin/python bench/emulated_device.py [--concurrency 256,1024] [--load qvi-perf,h2load]
                                                  [--duration 10] [--out FILE]
                                                  [--variants 'pool=;inline=--answer-threads 0']
--variants measures each named set of qvi-server flags in turn (null model, then emulated device), so
that their rows compare side by side from one run; the default is the server's defaults alone.
--store DIR --device cuda measures that store's model instead of the null twins (a GPU machine:
bench/gpu_session.sh pipeline), --body FILE a framed Classify made beforehand (no grpc_tools there).
Prints a markdown table; --out also writes the figures as JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import h2load_bench  # noqa: E402
import null_bench  # noqa: E402
import harness  # noqa: E402

from qvi_testing import metric_sum, metrics_of  # noqa: E402  (harness put tests/python on the path)

grpc_body = h2load_bench.grpc_body


def thread_cpu_seconds(pid, name):
    """CPU seconds the process's threads named `name` have run (schedstat: nanoseconds on a CPU)."""
    seconds = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                seconds += int(f.read().split()[0]) / 1e9
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
    return seconds


def snapshot(url, pid, model):
    m = metrics_of(url)
    labels = f'model="{model}"'
    return {"time": time.monotonic(), "ok": metric_sum(m, "qvi_requests_total", labels, 'code="OK"'),
            "cpu": metric_sum(m, "process_cpu_seconds_total"), "busy": metric_sum(m, "qvi_device_busy_seconds_total", labels),
            "batches": metric_sum(m, "qvi_batch_size_count", labels), "texts": metric_sum(m, "qvi_batch_size_sum", labels),
            "compute_s": metric_sum(m, "qvi_compute_duration_seconds_sum", labels),
            "answer_wait_s": metric_sum(m, "qvi_answer_wait_seconds_sum", labels),
            "answer_s": metric_sum(m, "qvi_answer_duration_seconds_sum", labels),
            "shares": metric_sum(m, "qvi_answer_duration_seconds_count", labels),
            "queue_s": metric_sum(m, "qvi_queue_duration_seconds_sum", labels),
            "instance_cpu": thread_cpu_seconds(pid, "qvi-instance"),
            "answer_cpu": thread_cpu_seconds(pid, "qvi-answer")}


def window(before, after):
    """The figures of one measured window."""
    d = {k: after[k] - before[k] for k in before}
    assert d["ok"] > 0, "the server answered no call OK in the window (h2load counts gRPC errors as HTTP 200)"
    wall, ok, batches, texts = d["time"], max(d["ok"], 1), max(d["batches"], 1), max(d["texts"], 1)
    return {"seconds": wall, "texts_per_s": d["ok"] / wall, "device_busy": d["busy"] / wall,
            "mean_batch": d["texts"] / batches, "server_cpu_us_per_request": d["cpu"] / ok * 1e6,
            "instance_cpu_us_per_batch": d["instance_cpu"] / batches * 1e6,
            "instance_cpu_us_per_text": d["instance_cpu"] / texts * 1e6,
            "answer_cpu_us_per_text": d["answer_cpu"] / texts * 1e6,
            # One batch's timeline from the server's histograms: a text's wait in the queue, the
            # instance thread's turn, the hand-off to an answer thread, one share of the answers.
            "timeline_ms": {"queue_per_text": d.get("queue_s", 0) / texts * 1e3,
                            "instance_turn_per_batch": d.get("compute_s", 0) / batches * 1e3,
                            "answer_wait_per_share": d.get("answer_wait_s", 0) / max(d.get("shares", 0), 1) * 1e3,
                            "answer_per_share": d.get("answer_s", 0) / max(d.get("shares", 0), 1) * 1e3,
                            "shares_per_batch": d.get("shares", 0) / batches}}


def store_for(work, model_pt, model, python, device_us):
    """The null twin's store with the GPU's batching in serving.json, on an emulated device if asked."""
    store = null_bench.null_store(os.path.join(work, "emulated" if device_us else "plain"), model_pt, model, python)
    path = os.path.join(store, model, "1", "model.null")
    with open(path) as f:
        twin = json.load(f)
    if device_us:
        twin["device_us"] = device_us
    with open(path, "w") as f:
        json.dump(twin, f)
    with open(os.path.join(store, model, "serving.json"), "w") as f:
        # No "instances" here: measure() passes one instance unless a variant's flags choose another.
        json.dump({"max_batch_size": 256, "max_batch_tokens": 32768, "max_queued_texts": 16384}, f)
    return store


def h2load(port, concurrency, a, body):
    """h2load at `concurrency` streams in flight (64 on each connection), one client thread."""
    exe = h2load_bench.executable(harness.BUILD)
    assert exe, "h2load not found (Debian's nghttp2-client; scripts/setup.sh installs it)"
    cmd = h2load_bench.command(exe, "grpc", f"http://127.0.0.1:{port}{h2load_bench.GRPC_PATH}", concurrency,
                               a.duration, a.warmup, body)
    harness.log(" ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 0, f"h2load failed: {run.stdout[-2000:]}{run.stderr[-2000:]}"
    done = h2load_bench.requests_done(run.stdout)
    return {"client_requests_per_s": done / a.duration if done is not None else None, "p99_ms": None}


def measure(work, a, store, label, flags=()):
    """One server on `store` (with extra `flags`), each load generator at each concurrency; a window's
    figures per step."""
    # One instance, as on a GPU, unless the variant sets the count (a store's serving.json may too).
    instances = [] if any(f.startswith("--instances-per-model") for f in flags) else ["--instances-per-model", "1"]
    rows = []
    with harness.serve(store, work, f"qvi-server-{label}", "--max-queued-texts", "16384", *instances, *flags,
                       device=a.device, http=False) as server:
        port, url, proc = server.port, server.metrics_url, server.proc
        for load, concurrency in [(g, c) for g in a.load.split(",") for c in a.concurrency.split(",")]:
            samples = {}

            def sample_window():
                # The window starts after qvi-perf's warm-up and ends before its last answers.
                time.sleep(a.warmup + 0.2)
                samples["before"] = snapshot(url, proc.pid, harness.MODEL)
                dmon = None
                if a.device.startswith("cuda"):  # the GPU's SM busy share, a sample a second
                    dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-c",
                                             str(max(1, int(a.duration - 0.4)))], stdout=subprocess.PIPE, text=True)
                time.sleep(a.duration - 0.4)
                samples["after"] = snapshot(url, proc.pid, harness.MODEL)
                if dmon is not None:
                    sm = [float(line.split()[1]) for line in dmon.communicate()[0].splitlines()
                          if line.strip() and not line.startswith("#")]
                    samples["gpu_sm_busy"] = sum(sm) / len(sm) / 100 if sm else None

            sampler = threading.Thread(target=sample_window)
            sampler.start()
            if load == "h2load":
                client = h2load(port, int(concurrency), a, a.body)
            else:
                step = harness.perf(work, f"{label}-{concurrency}", ["--server", f"127.0.0.1:{port}"],
                                    ["--model", harness.MODEL, "--concurrency", concurrency, "--duration",
                                     str(a.duration), "--warmup", str(a.warmup), "--words", "20"])["steps"][0]
                client = {"client_requests_per_s": step["requests_per_s"], "p99_ms": step["p99_ms"]}
            sampler.join()
            row = window(samples["before"], samples["after"])
            if samples.get("gpu_sm_busy") is not None:
                row["gpu_sm_busy"] = samples["gpu_sm_busy"]
            row.update(load=load, concurrency=int(concurrency), **client)
            rows.append(row)
    return rows


def markdown(result):
    dev = result["device_us"]
    what = (f"{result['store']} on {result['device']}" if result.get("store")
            else f"Emulated device: per_batch {dev['per_batch']} µs, per_text {dev['per_text']} µs")
    lines = [f"{what}; "
             f"{result['cores']} cores, server and load generator unpinned on them; one ~20-word text per gRPC "
             "Classify; OK texts/s from the server's own counters. "
             f"Command: `{result['command']}`.", "",
             "| server flags | model | load | in flight | OK texts/s | vs null | device busy | mean batch | "
             "server CPU µs/request | instance CPU µs/batch | instance CPU µs/text | answer threads CPU µs/text | "
             "p99 ms |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        plain = {(r["load"], r["concurrency"]): r for r in run["null"]}
        flags = f"`{run['flags']}`" if run["flags"] else "(defaults)"
        for label, rows in (("null", run["null"]), ("emulated device", run["emulated"]),
                            ("emulated device, no pipeline", run.get("unpipelined", [])), ("served", run["served"])):
            for r in rows:
                ratio = f"{r['texts_per_s'] / plain[(r['load'], r['concurrency'])]['texts_per_s']:.2f}" if plain else "–"
                # A served model's backend does not measure its device time (nvidia-smi does).
                busy = (f"{100 * r['device_busy']:.0f} %" if label.startswith("emulated device")
                        else f"{100 * r['gpu_sm_busy']:.0f} % (SM)" if "gpu_sm_busy" in r else "–")
                p99 = f"{r['p99_ms']:.2f}" if r.get("p99_ms") is not None else "–"
                lines.append(f"| {flags} | {label} | {r['load']} | {r['concurrency']} | {r['texts_per_s']:,.0f} | "
                             f"{ratio} | {busy} | {r['mean_batch']:.1f} | {r['server_cpu_us_per_request']:.1f} | "
                             f"{r['instance_cpu_us_per_batch']:,.0f} | {r['instance_cpu_us_per_text']:.1f} | "
                             f"{r.get('answer_cpu_us_per_text', 0):.1f} | {p99} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="256,1024", help="calls in flight, one step each")
    ap.add_argument("--load", default="qvi-perf,h2load", help="load generators, each at every concurrency")
    ap.add_argument("--duration", type=float, default=10, help="seconds measured per step")
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--per-batch", type=float, default=300, help="device µs per batch")
    ap.add_argument("--per-text", type=float, default=3, help="device µs per text of a batch")
    ap.add_argument("--out", help="also write the figures as JSON here")
    ap.add_argument("--store", help="serve this store's model instead of the null twins")
    ap.add_argument("--device", default="cpu", help="qvi-server's --device")
    ap.add_argument("--body", help="the framed gRPC Classify for h2load, made beforehand")
    ap.add_argument("--unpipelined", action="store_true",
                    help="also measure the emulated device with \"asynchronous\": false (each batch collected "
                         "before the next is launched: the engine without its pipeline)")
    ap.add_argument("--variants", default="defaults=",
                    help="';'-separated NAME=FLAGS: each a qvi-server measured in turn with these extra flags")
    a = ap.parse_args()
    device_us = {"per_batch": a.per_batch, "per_text": a.per_text}
    work = tempfile.mkdtemp(prefix="qvi_emulated_")
    a.body = a.body or (grpc_body(work, harness.MODEL) if "h2load" in a.load else None)
    result = {"device_us": device_us, "cores": len(os.sched_getaffinity(0)), "store": a.store, "device": a.device,
              "command": ".venv/bin/python bench/emulated_device.py " + " ".join(sys.argv[1:])}
    result["runs"] = []
    if not a.store:
        plain = store_for(work, harness.MODEL_PT, harness.MODEL, harness.PY, None)
        emulated = store_for(work, harness.MODEL_PT, harness.MODEL, harness.PY, device_us)
        if a.unpipelined:
            unpipelined = store_for(os.path.join(work, "sync"), harness.MODEL_PT, harness.MODEL, harness.PY,
                                    dict(device_us, asynchronous=False))
    for variant in a.variants.split(";"):
        name, _, flags = variant.partition("=")
        if a.store:
            result["runs"].append({"variant": name, "flags": flags.strip(), "null": [], "emulated": [],
                                   "served": measure(work, a, a.store, f"served-{name}", flags.split())})
            continue
        # In turn on the same cores: the null model as it is, then on the emulated device.
        result["runs"].append({"variant": name, "flags": flags.strip(),
                               "null": measure(work, a, plain, f"null-{name}", flags.split()),
                               "emulated": measure(work, a, emulated, f"emulated-{name}", flags.split()),
                               "served": []})
        if a.unpipelined:
            result["runs"][-1]["unpipelined"] = measure(work, a, unpipelined, f"unpipelined-{name}", flags.split())
    text = markdown(result)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
