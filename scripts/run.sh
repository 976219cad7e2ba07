#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs qvi-server on the demo models.
# Extra arguments go to qvi-server and win over run.sh's defaults (--model-store model_store/store,
# --port 8500), e.g. scripts/run.sh --port 9000 --access-log
# QVI_SKIP_SETUP=1 starts the server without running the set-up first (it must have run before).
#
# On a machine where the demo models are not made yet it serves early: set-up builds the server and
# trains the first model (sentiment) side by side, the server starts on it, and the other two models,
# then every model's faithfulness figures and native package, arrive while it serves (the server loads
# what appears in the store; a line says when each model is in and how to try it). Ctrl-C stops the
# server and that background work together; the next run goes on where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
defaults=()
given() {  # whether the arguments name the flag, as "--flag value" or "--flag=value"
  local flag=$1 arg
  shift
  for arg in "$@"; do [[ $arg == "$flag" || $arg == "$flag="* ]] && return 0; done
  return 1
}
value() {  # the value the arguments give the flag (the last one), or nothing
  local flag=$1 found="" next=0 arg
  shift
  for arg in "$@"; do
    if ((next)); then found=$arg next=0; elif [[ $arg == "$flag" ]]; then next=1; elif [[ $arg == "$flag="* ]]; then found=${arg#*=}; fi
  done
  echo "$found"
}
given --model-store "$@" || defaults+=(--model-store model_store/store)
given --port "$@" || defaults+=(--port 8500)
port=$(value --port "$@")
# The lines that say how to try a model name the server when it is not the client's default.
[[ -n $port && $port != 8500 ]] && export QVI_RUN_SERVER=localhost:$port
[[ ${QVI_SKIP_SETUP:-} == 1 ]] || scripts/setup.sh --serve-early
pidfile=.stamps/demo-models.pid
models=$(cat "$pidfile" 2>/dev/null || true)
if [[ -z $models ]] || ! kill -0 "$models" 2>/dev/null; then
  exec build/qvi-server "${defaults[@]}" "$@"
fi
# The demo models are still being made (in their own process group): the server runs beside them and
# both end together, whichever way run.sh ends.
build/qvi-server "${defaults[@]}" "$@" &
server=$!
stop() {
  kill -TERM -- "-$models" 2>/dev/null && rm -f "$pidfile"
  kill -TERM "$server" 2>/dev/null || true
}
trap stop INT TERM
trap 'kill -TERM -- "-$models" 2>/dev/null && rm -f "$pidfile"; true' EXIT
while :; do
  rc=0
  wait "$server" || rc=$?
  # Over 128 with the server still running: a signal run.sh trapped ended the wait, not the server.
  ((rc > 128)) && kill -0 "$server" 2>/dev/null || break
done
exit "$rc"
