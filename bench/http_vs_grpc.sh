#!/usr/bin/env bash
# HTTP/JSON Classify beside gRPC Classify on one qvi-server, side by side in one run (issue 32's
# targets: HTTP >= 0.85x gRPC at saturation, +0.1 ms at concurrency 1). Short texts (about 20 words),
# one text per request, the demo classifier, the load generator on the same machine:
#   bench/http_vs_grpc.sh [concurrency,...] [seconds]
# qvi-perf drives gRPC asynchronously and HTTP with a blocking thread per connection (httplib), so
# at high concurrency the HTTP side also pays for its client's threads; its JSON lists each side's
# client CPU per request.
set -euo pipefail
cd "$(dirname "$0")/.."
concurrency=${1:-1,8,32}
seconds=${2:-5}
work=$(mktemp -d)
trap 'kill %1 2>/dev/null || true; rm -rf "$work"' EXIT
build/qvi-server --model-store model_store/store --host 127.0.0.1 --port 0 --port-file "$work/port" \
  --metrics-port 0 --metrics-port-file "$work/metrics" --http-port 0 --http-port-file "$work/http" \
  --device cpu > "$work/server.log" 2>&1 &
for _ in $(seq 240); do [[ -s $work/port ]] && break; sleep 0.5; done
common=(--metrics "http://127.0.0.1:$(cat "$work/metrics")/metrics" --concurrency "$concurrency"
  --duration "$seconds" --warmup 1 --words 20)
echo "== gRPC Classify"
build/qvi-perf --server "127.0.0.1:$(cat "$work/port")" "${common[@]}" --json "$work/grpc.json"
echo "== HTTP/JSON POST /v1/models/sentiment:classify"
build/qvi-perf --http "http://127.0.0.1:$(cat "$work/http")/v1/models/sentiment:classify" --http-body json \
  "${common[@]}" --json "$work/http.json"
python3 - "$work/grpc.json" "$work/http.json" <<'PY'
import json, sys
grpc, http = (json.load(open(p))["steps"] for p in sys.argv[1:])
print(f"{'concurrency':>11} {'gRPC texts/s':>13} {'HTTP texts/s':>13} {'HTTP/gRPC':>9} {'gRPC p50 ms':>11} {'HTTP p50 ms':>11}"
      f" {'gRPC p99 ms':>11} {'HTTP p99 ms':>11}")
for g, h in zip(grpc, http):
    print(f"{g['load']:>11g} {g['texts_per_s']:>13.0f} {h['texts_per_s']:>13.0f} {h['texts_per_s'] / g['texts_per_s']:>8.2f}x"
          f" {g['p50_ms']:>11.2f} {h['p50_ms']:>11.2f} {g['p99_ms']:>11.2f} {h['p99_ms']:>11.2f}")
PY
