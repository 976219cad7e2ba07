#!/usr/bin/env bash
# One command to see why the demo classifier chose its label: sets everything up
# (scripts/setup.sh), starts qvi-server on a free port, asks it about the text, shows α and β as
# a heat-map in the terminal, writes explain.html (α, β and the attention maps) to open in a
# browser, and stops the server.
# Usage: scripts/explain.sh ["text" ...]        (default: a sample review)
#        MODEL=ner METHOD=tag scripts/explain.sh "Barack Obama flew to Paris"
#        MODEL=topics scripts/explain.sh "Shares in the carmaker rose after record profits."
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
MODEL=${MODEL:-sentiment}
METHOD=${METHOD:-classify}
OUT=${OUT:-explain.html}
[[ $# -gt 0 ]] || set -- "A smart, funny and moving film."
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$work"' EXIT
build/qvi-server --model-store model_store/store --port 0 --port-file "$work/port" --metrics-port -1 --http-port -1 \
  --log-level warn &
server=$!
for _ in $(seq 600); do [[ -s $work/port ]] && break; kill -0 "$server" || exit 1; sleep 0.1; done
[[ -s $work/port ]] || { echo "qvi-server did not start" >&2; exit 1; }
extra=(); [[ $METHOD == classify ]] && extra=(--top-k 3)
build/qvi-client --server "127.0.0.1:$(cat "$work/port")" "$METHOD" --model "$MODEL" "${extra[@]}" \
  --html "$OUT" "$@"
echo "open $OUT in a browser for the full report" >&2
