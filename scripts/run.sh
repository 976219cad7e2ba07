#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs qvi-server on the demo models.
# Extra arguments go to qvi-server, e.g. scripts/run.sh --port 9000 --access-log
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec build/qvi-server --model-store model_store/store --port 8500 "$@"
