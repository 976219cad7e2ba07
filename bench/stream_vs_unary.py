"""ClassifyStream against unary Classify at one text per message: the null benchmark's set-up
(bench/null_bench.py: qvi-server on one core, qvi-perf on the others, ~20-word texts, concurrency 1, 16
and 64), the two protocols taking turns on one server, several rounds, the median round reported; once
over the demo classifier's null twin (the serving path alone: what a call costs beside a message) and
once over the demo classifier itself.

    .venv/bin/python bench/stream_vs_unary.py [--rounds 3] [--duration 6]

Unary calls are spread over qvi-perf's 4 connections; the stream run opens one stream on each of them,
with the same requests in flight in all.
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import null_bench  # noqa: E402
import harness  # noqa: E402

PROTOCOLS = (("unary Classify", []), ("ClassifyStream", ["--protocol", "stream"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--concurrency", default="1,16,64")
    a = ap.parse_args()
    a.null_concurrency = a.concurrency
    a.null_rounds = a.rounds
    rows = []
    with tempfile.TemporaryDirectory(prefix="qvi_stream_") as work:
        demo = os.path.join(work, "demo_store")  # the demo classifier alone
        shutil.copytree(os.path.dirname(harness.MODEL_PT), os.path.join(demo, harness.MODEL, "1"))
        stores = (("null twin", null_bench.null_store(work, harness.MODEL_PT, harness.MODEL, harness.PY)),
                  ("demo classifier", demo))
        for store_name, store in stores:
            out = null_bench.run_null(work, a, harness, store=store, protocols=PROTOCOLS, h2load=False)
            for label, result in out["protocols"].items():
                for s in result["steps"]:
                    rows.append((store_name, int(s["load"]), label, s))
            cores = (out["server_cores"], out["client_cores"])
    print(f"qvi-server on core(s) {cores[0]}, qvi-perf on {cores[1]}; one ~20-word text per request; median of "
          f"{a.rounds} rounds ({a.duration:g} s each)")
    print(f"{'model':16} {'conc':>4} {'protocol':15} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'srv µs/req':>10} "
          f"{'cli µs/req':>10} {'errors':>6}")
    for store_name, conc, label, s in sorted(rows, key=lambda r: (r[0] != "null twin", r[1], r[2] != "unary Classify")):
        errors = sum(s.get("errors", {}).values()) if isinstance(s.get("errors"), dict) else s.get("errors", 0)
        print(f"{store_name:16} {conc:>4} {label:15} {s['requests_per_s']:>8,.0f} {s['p50_ms']:>7.3f} "
              f"{s['p99_ms']:>7.3f} {_num(s.get('server_cpu_us_per_request')):>10} "
              f"{_num(s.get('client_cpu_us_per_request')):>10} {errors:>6}")
    for store_name in dict.fromkeys(r[0] for r in rows):
        for conc in sorted({r[1] for r in rows if r[0] == store_name}):
            pair = {r[2]: r[3] for r in rows if r[0] == store_name and r[1] == conc}
            if len(pair) == 2:
                u, st = pair["unary Classify"], pair["ClassifyStream"]
                print(f"{store_name}, concurrency {conc}: stream/unary requests/s "
                      f"{st['requests_per_s'] / u['requests_per_s']:.2f}x, p99 {st['p99_ms'] / u['p99_ms']:.2f}x"
                      + (f", server µs/request {st['server_cpu_us_per_request'] / u['server_cpu_us_per_request']:.2f}x"
                         if u.get("server_cpu_us_per_request") and st.get("server_cpu_us_per_request") else ""))


def _num(x):
    return "-" if x is None else f"{x:.1f}"


if __name__ == "__main__":
    main()
