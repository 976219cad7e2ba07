#!/usr/bin/env bash
# Where the serving path's CPU goes (docs/performance.md, "The cost of serving itself"): qvi-server on the
# demo classifier's null twin (no math), pinned to core 0, under qvi-perf on core 1 (gRPC Classify, one
# ~20-word text per request, concurrency 64 unless given), with `perf record -g` on the server for 12 s in
# the middle of the load; prints qvi-perf's line (server CPU µs per request) and perf's shares by library
# and by symbol. Needs perf (Debian's linux-perf) and scripts/setup.sh's build and demo store.
#
#   bash bench/profile_null.sh [CONCURRENCY]      (about 40 s)
#   KEEP=1 bash bench/profile_null.sh 1           (keeps the work folder, perf.data in it, and names it)
set -euo pipefail
cd "$(dirname "$0")/.."
concurrency=${1:-64}
work=$(mktemp -d /tmp/qvi-null-profile.XXXXXX)
trap '[[ -n ${KEEP:-} ]] && echo "kept: $work" || rm -rf "$work"' EXIT
(cd model_store && ../.venv/bin/python -m qvi null --artifact store/sentiment/1/model.pt \
  --out "$work/store/sentiment/1" > /dev/null)
taskset -c 0 build/qvi-server --model-store "$work/store" --host 127.0.0.1 --port 0 --port-file "$work/port" \
  --metrics-port 0 --metrics-port-file "$work/mport" --device cpu > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 300); do [[ -s $work/port && -s $work/mport ]] && break; sleep 0.1; done
taskset -c 1 build/qvi-perf --server "127.0.0.1:$(cat "$work/port")" --model sentiment --concurrency "$concurrency" \
  --duration 25 --warmup 2 --words 20 --metrics "http://127.0.0.1:$(cat "$work/mport")/metrics" > "$work/load.txt" 2>&1 &
load=$!
sleep 6
perf record -g -F 1999 -p "$server" -o "$work/perf.data" -- sleep 12 > /dev/null 2>&1
wait "$load"
kill "$server"
wait "$server" || true
tail -2 "$work/load.txt"
echo
perf report -i "$work/perf.data" --no-children --sort dso --stdio -g none 2> /dev/null | grep -v '^#' | grep -v '^$' | head -16
echo
perf report -i "$work/perf.data" --no-children --sort dso,sym --stdio -g none 2> /dev/null | grep -v '^#' | grep -v '^$' |
  head -30 | cut -c1-160
