#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh: packages, .venv, corpora, demo models) and runs every test.
# Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# One torch thread per process: the machine has two cores.
export OMP_NUM_THREADS=1
status=0
echo "[test $(date +%T)] C++ formatting: clang-format with .clang-format (scripts/format.sh --check)"
scripts/format.sh --check || status=1
echo "[test $(date +%T)] complexity: no function over 80 lines or CCN 20 outside the allow-list, no file over its size (scripts/complexity.sh)"
scripts/complexity.sh || status=1
echo "[test $(date +%T)] layers: every include of server/ is of a library the target links, every link is used (scripts/check_layers.py)"
.venv/bin/python scripts/check_layers.py build || status=1
echo "[test $(date +%T)] C++ unit and end-to-end tests (ctest)"
(cd build && ctest --output-on-failure -j1) || status=1
echo "[test $(date +%T)] scheduler and serving-core stress tests under ASan/UBSan and TSan; the e2e suite against an ASan qvi-server"
scripts/sanitize.sh || status=1
echo "[test $(date +%T)] lock annotations: clang -Wthread-safety -Werror=thread-safety (scripts/thread_safety.sh)"
scripts/thread_safety.sh || status=1
echo "[test $(date +%T)] fuzz smoke: every libFuzzer target 10 s under ASan/UBSan (scripts/fuzz.sh; long runs: scripts/fuzz.sh 600)"
scripts/fuzz.sh 10 || status=1
echo "[test $(date +%T)] soak, short: 60 s of mixed traffic with cancellations, short deadlines and a rollout every 15 s"
echo "       (gates on status codes and a clean exit, not on timings; the 30-minute run: scripts/soak.py)"
.venv/bin/python scripts/soak.py --seconds 60 --rollout-seconds 15 --clients 4 || status=1
echo "[test $(date +%T)] model zoo (pytest)"
(cd model_store && ../.venv/bin/python -m pytest -p no:cacheprovider) || status=1
echo "[test $(date +%T)] benchmark harness, smoke mode (checks that it runs; gates on no timing)"
.venv/bin/python bench/run.py --smoke || status=1
echo "[test $(date +%T)] container image: docker/build.sh cpu (cached; tests/python/test_deploy_image.py runs it)"
docker/build.sh cpu || status=1
# The cuda image (about 4 GB): built and served on the CPU here. QVI_TEST_CUDA_IMAGE=0 leaves it out.
if [[ ${QVI_TEST_CUDA_IMAGE:-1} == 1 ]]; then
  echo "[test $(date +%T)] cuda image: docker/build.sh cuda, then a smoke run on the CPU (docker/smoke.sh)"
  (docker/build.sh cuda && docker/smoke.sh localhost/qvi-serve:cuda) || status=1
fi
echo "[test $(date +%T)] Python client against qvi-server, deployment files and image (pytest)"
(cd tests/python && ../../.venv/bin/python -m pytest -p no:cacheprovider) || status=1
echo "[test $(date +%T)] done: exit $status"
exit $status
