#!/usr/bin/env bash
# Compiles the server's libraries (serving core, scheduler, gRPC adapter, metrics) and its tests with
# clang and -Wthread-safety -Werror=thread-safety: the lock annotations (ABSL_GUARDED_BY and friends,
# on the std::mutex wrappers of server/core/base/sync.h) are checked at compile time, and any access to
# guarded state without its lock, or call that needs a lock not held, fails the build.
# The check is compiled into the clang ASan build (build-address, scripts/sanitizer_build.sh), which
# scripts/sanitize.sh builds first in the test command; this script compiles what that build leaves
# out (the object files of the tests it does not run) and, run alone, the rest of the list.
# Needs scripts/setup.sh first (clang is installed there). Compiles only: nothing here is run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizer_build.sh
dir=build-address
sanitizer_build address
# The object files of every target whose sources hold lock annotations, tests included.
ninja -C "$dir" -j2 -k 0 qvi_base qvi_sched qvi_model qvi_runner qvi_repository qvi_serving qvi_metrics qvi_grpc qvi_tls qvi_auth qvi_tracing \
  CMakeFiles/qvi-server.dir/server/main.cc.o CMakeFiles/qvi-server.dir/server/server.cc.o \
  CMakeFiles/qvi-server.dir/server/server_security.cc.o \
  $(ninja -C "$dir" -t targets all | grep -oE '^CMakeFiles/(core_test|model_runner_test|repository_test|stress_test|sched_test|scheduler_alloc_test|metrics_test|frontend_test)\.dir/[^:]+\.o' | sort -u)
echo "[thread-safety] clang -Wthread-safety: no violations"
