# Sourced by scripts/sanitize.sh, fuzz.sh and thread_safety.sh: configures a sanitizer build once.
#   build-address  clang, ASan + UBSan at -O1, the lock annotations checked (-Wthread-safety as errors)
#                  and the libFuzzer targets (fuzz/): one build serves the three scripts, where there
#                  were three (gcc ASan, clang for the annotations, clang for the fuzzers) that compiled
#                  the same sources; BENCHMARKS.md "The whole cold run" has what it saves.
#   build-thread   gcc, TSan at -O1.
# A build folder configured otherwise (an older checkout's gcc build-address) is made again.
# ccache: paths relative to the checkout and no working folder in the hash, so that a fresh clone
# elsewhere (CI) hits what earlier builds cached, -g builds included.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
sanitizer_build() {  # sanitizer_build KIND: configures build-KIND unless it is configured as above
  local kind=$1 dir=build-$1 flags=(-DQVI_SANITIZE="$1")
  [[ $kind == address ]] && flags+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DQVI_THREAD_SAFETY=ON)
  if [[ -f $dir/build.ninja && $kind == address ]] && ! grep -q '^QVI_THREAD_SAFETY:BOOL=ON' "$dir/CMakeCache.txt"; then
    echo "[sanitize] $dir was configured without clang's checks: configuring it again"
    rm -rf "$dir"
  fi
  if [[ ! -f $dir/build.ninja ]]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" > "$dir.cmake.log" 2>&1 ||
      { cat "$dir.cmake.log"; return 1; }
    rm -f "$dir.cmake.log"
  fi
}
