#!/usr/bin/env bash
# Compiles the server's libraries (serving core, scheduler, gRPC adapter, metrics) and its tests with
# clang and -Wthread-safety -Werror=thread-safety: the lock annotations (ABSL_GUARDED_BY and friends,
# on the std::mutex wrappers of server/core/sched/sync.h) are checked at compile time, and any access to
# guarded state without its lock, or call that needs a lock not held, fails the build.
# Needs scripts/setup.sh first (clang is installed there). Compiles only: nothing here is run.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout and no working folder in the hash, so that a fresh clone
# elsewhere (CI) hits what earlier builds cached, -g builds included.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
dir=build-thread-safety
if [[ ! -f $dir/build.ninja ]]; then
  # -O0 and no debug information: the analysis runs in clang's front end, and nothing built here is run.
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
    -DQVI_THREAD_SAFETY=ON \
    > "$dir.cmake.log" 2>&1 || { cat "$dir.cmake.log"; exit 1; }
  rm -f "$dir.cmake.log"
fi
# The object files of every target whose sources hold lock annotations, tests included.
ninja -C "$dir" -j2 -k 0 qvi_sched qvi_model qvi_serving qvi_metrics qvi_grpc qvi_tls qvi_auth qvi_tracing \
  CMakeFiles/qvi-server.dir/server/main.cc.o CMakeFiles/qvi-server.dir/server/server.cc.o \
  CMakeFiles/qvi-server.dir/server/server_security.cc.o \
  $(ninja -C "$dir" -t targets all | grep -oE '^CMakeFiles/(core_test|model_runner_test|stress_test|sched_test|scheduler_alloc_test|metrics_test)\.dir/[^:]+\.o' | sort -u)
echo "[thread-safety] clang -Wthread-safety: no violations"
