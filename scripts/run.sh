#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs qvi-server on the demo models.
# Extra arguments go to qvi-server and win over run.sh's defaults (--model-store model_store/store,
# --port 8500), e.g. scripts/run.sh --port 9000 --access-log
# QVI_SKIP_SETUP=1 starts the server without running the set-up first (it must have run before).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${QVI_SKIP_SETUP:-} == 1 ]] || scripts/setup.sh
defaults=()
given() {  # whether the arguments name the flag, as "--flag value" or "--flag=value"
  local flag=$1 arg
  shift
  for arg in "$@"; do [[ $arg == "$flag" || $arg == "$flag="* ]] && return 0; done
  return 1
}
given --model-store "$@" || defaults+=(--model-store model_store/store)
given --port "$@" || defaults+=(--port 8500)
exec build/qvi-server "${defaults[@]}" "$@"
