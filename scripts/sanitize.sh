#!/usr/bin/env bash
# Builds the scheduling tests (batch scheduler, executor), the text and spec tests, the model runner's tests (its
# answer pool, with a stress test of failures, expiries and cancellations while batches are answered), the
# repository's parts (repository_test: a version's load, abandon and unload threads, the keeper) and the
# serving-core stress test (64 clients, deadlines, cancellations, a live version switch, real torch model) with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang) and with ThreadSanitizer (gcc), and runs them. With
# AddressSanitizer it also builds the whole qvi-server and runs the Python end-to-end suite
# (tests/python, less the image and manifest tests, which do not run the binary) against it: any
# ASan, UBSan or LeakSanitizer report makes the server exit non-zero, which the suite's clean-stop
# check turns into a failure.
# Needs scripts/setup.sh first. Usage: scripts/sanitize.sh [address|thread]...
#
# The core's locks are std::mutex (server/core/base/sync.h), which TSan sees through pthreads; Debian's
# abseil is not TSan-instrumented, so absl::Mutex would hide every ordering from it. LibTorch,
# gRPC and abseil come uninstrumented from PyPI and Debian: TSan and ASan check our code and what
# it does with their memory, not their insides. No suppressions are needed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizer_build.sh
kinds=("$@")
[[ ${#kinds[@]} -gt 0 ]] || kinds=(address thread)
export OMP_NUM_THREADS=1
status=0
for kind in "${kinds[@]}"; do
  dir=build-$kind
  sanitizer_build "$kind"
  targets=(sched_test text_manifest_test store_test model_runner_test repository_test stress_test allocator_test tracing_test)
  [[ $kind == address ]] && targets+=(qvi-server)
  ninja -C "$dir" -j2 "${targets[@]}"
  for test in sched_test text_manifest_test store_test model_runner_test repository_test stress_test allocator_test tracing_test; do
    echo "[sanitize] $test under $kind sanitizer"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      "$dir/$test" --gtest_brief=1 || status=1
  done
  if [[ $kind == address ]]; then
    # On two pytest workers, a file's tests on one of them (conftest.py groups them, and the files that
    # run the repository's scripts together): the suite waits on servers starting and on clients as much
    # as on the cores, and took 0.55 of the time of one worker (BENCHMARKS.md, "The test run").
    echo "[sanitize] the Python end-to-end suite against qvi-server built with ASan + UBSan (two workers)"
    (cd tests/python &&
      QVI_SERVER="$PWD/../../$dir/qvi-server" ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        ../../.venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadgroup --durations=10 \
        --ignore=test_deploy_image.py --ignore=test_deploy_manifests.py) || status=1
    # scripts/test.sh runs only what this pass leaves out (these two files, and test_run_script.py,
    # which skips itself when QVI_SERVER is set) in its Python stage: keep the lists together.
  fi
done
exit $status
