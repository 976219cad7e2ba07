#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ in the clang ASan + UBSan build (build-address, shared with
# scripts/sanitize.sh and thread_safety.sh: scripts/sanitizer_build.sh), and runs each for SECONDS, two at
# a time (QVI_FUZZ_JOBS), from its seed corpus (fuzz/corpus/<target>, copied into build-address/corpus/
# where it grows).
# Prints each target's executions and the total; exits 1 on any crash, leak or sanitizer report,
# with the input saved under build-address/crashes/ (add it to the seeds and to a unit test).
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (10 s each, all targets: the test command's smoke run)
#   scripts/fuzz.sh 600                        (a long run)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizer_build.sh
seconds=${1:-10}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(tokenizer manifest vocabulary serving_config version_policy spans request oip http_json hf_tokenizer drop_in)
dir=build-address
sanitizer_build address
ninja -C "$dir" -j2 $(printf 'fuzz_%s ' "${targets[@]}") > /dev/null
mkdir -p "$dir/crashes"
# Two targets at a time (each fuzzer is one process on one core; this machine has two); reported in order.
fuzz_one() {
  local t=$1 log="$dir/fuzz_$1.log" rc=0
  mkdir -p "$dir/corpus/$t"
  cp -n fuzz/corpus/$t/* "$dir/corpus/$t/" 2>/dev/null || true
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$dir/fuzz/fuzz_$t" -max_total_time="$seconds" \
    -print_final_stats=1 -max_len=4096 -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/crashes/$t-" \
    "$dir/corpus/$t" > "$log" 2>&1 || rc=$?
  echo "$rc" > "$log.rc"
}
for t in "${targets[@]}"; do
  rm -f "$dir/fuzz_$t.log.rc"
  fuzz_one "$t" &
  while (($(jobs -rp | wc -l) >= ${QVI_FUZZ_JOBS:-2})); do wait -n || true; done
done
wait
total=0
status=0
for t in "${targets[@]}"; do
  log="$dir/fuzz_$t.log"
  if [[ $(cat "$log.rc" 2>/dev/null) == 0 ]]; then
    result=ok
  else
    result=FAILED
    status=1
    tail -40 "$log"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  runs=${runs:-0}
  total=$((total + runs))
  printf '[fuzz] %-16s %10d executions in %s s: %s\n' "$t" "$runs" "$seconds" "$result"
done
printf '[fuzz] total %d executions\n' "$total"
exit $status
