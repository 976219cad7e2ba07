#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh: packages, .venv, corpora, demo models) and runs every test.
# Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "[test] model zoo (pytest)"
cd model_store
# One torch thread per process: the machine has two cores.
OMP_NUM_THREADS=1 ../.venv/bin/python -m pytest -p no:cacheprovider
