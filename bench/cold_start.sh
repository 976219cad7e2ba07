#!/usr/bin/env bash
# What a newcomer waits for: scripts/run.sh in a fresh clone of this checkout's HEAD with the project's
# caches off — an empty ccache, pip's cache off (torch is downloaded again), an empty demo-model cache, empty
# caches for the compiled packages (QVI_PT2_CACHE, TORCHINDUCTOR_CACHE_DIR) — timed from the command to
# the first Classify answered, to each demo model answering, and to the demo models complete (their
# faithfulness figures and packages in; the pretrained ones, sentiment-minilm and ner-e5, last). Prints a line
# per event, then run.sh's set-up and model lines.
# Debian packages already installed stay installed (the set-up skips them): quote their time apart.
# Usage: bench/cold_start.sh [run|setup|test] [PORT]    (default run, port 18900; the clone goes to a temp
#        dir, removed after). `setup` times scripts/setup.sh instead, the set-up scripts/test.sh runs
#        (every target built, the demo models complete before it returns), and prints its stage summary.
#        `test` times the whole scripts/test.sh (what CI runs), with the images built without podman's
#        layer cache (QVI_IMAGE_NO_CACHE=1; the base image and the image build's pip cache stay), and
#        prints set-up's and test.sh's stage summaries. The empty ccache (CCACHE_DIR in the temp dir) fills
#        as a fresh machine's does: the image builds find in it what the set-up's build compiled.
# Takes about half an hour on two cores (setup; run: an hour with the pretrained demo models); test 58 to 74
# minutes (2026-12-02: the same VM ran the same work a quarter slower in one hour than in another;
# bench/results/cold-test-2026-12-02[bc].txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=${1:-run}
PORT=${2:-18900}
work=$(mktemp -d /tmp/qvi-cold.XXXXXX)
git clone -q "$ROOT" "$work/repo"
export CCACHE_DIR=$work/ccache PIP_NO_CACHE_DIR=1 QVI_MODEL_CACHE=$work/model-cache QVI_PT2_CACHE=$work/pt2-cache \
  TORCHINDUCTOR_CACHE_DIR=$work/inductor
echo "cold start of $(git -C "$ROOT" rev-parse --short HEAD) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo |
  cut -d: -f2 | sed 's/^ *//')), $(date -u +%F)"
start=$SECONDS
if [[ $MODE == setup || $MODE == test ]]; then
  trap 'rm -rf "$work"' EXIT
  rc=0
  script=scripts/$MODE.sh
  [[ $MODE == test ]] && export QVI_IMAGE_NO_CACHE=1
  (cd "$work/repo" && $script) > "$work/$MODE.out" 2>&1 || rc=$?
  s=$((SECONDS - start))
  printf '[cold %2d:%02d] %s ended (exit %d); its lines:\n' $((s / 60)) $((s % 60)) "$script" "$rc"
  if [[ $MODE == setup ]]; then
    grep -E '^\S*\[(setup|models) |^    ' "$work/$MODE.out" | sed 's/\x1b\[[0-9;]*m//g'
  else
    # set-up's lines and summary, then test.sh's stage lines and its summary (the rest: the log below)
    sed 's/\x1b\[[0-9;]*m//g' "$work/$MODE.out" |
      awk '/^[^[:space:]]*\[(setup|models|test) /{print; if (/^\[test /) t=1; if (/^\[test .*done in/) d=1; next} /^    / && (!t || d)'
    cp "$work/$MODE.out" /tmp/qvi-cold-test.log
    echo "the whole log: /tmp/qvi-cold-test.log"
  fi
  ((rc == 0)) || { echo "its last lines:"; tail -n 60 "$work/$MODE.out"; }
  exit "$rc"
fi
set -m  # run.sh in a process group of its own: Ctrl-C's signal goes to all of it, as in a terminal
(cd "$work/repo" && exec scripts/run.sh --port "$PORT" --metrics-port 0 --http-port 0) > "$work/run.out" 2>&1 &
run=$!
set +m
cleanup() {
  kill -INT -- "-$run" 2>/dev/null && wait "$run" 2>/dev/null
  local models
  models=$(cat "$work/repo/.stamps/demo-models.pid" 2>/dev/null) && kill -TERM -- "-$models" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
at() { local s=$((SECONDS - start)); printf '[cold %2d:%02d] %s\n' $((s / 60)) $((s % 60)) "$*"; }
client=$work/repo/build/qvi-client
declare -A asked=([sentiment]='classify --model sentiment' [ner]='tag --model ner' [topics]='classify --model topics'
  [sentiment-minilm]='classify --model sentiment-minilm' [ner-e5]='tag --model ner-e5')
models=(sentiment ner topics)
# The pretrained demo models come after the GloVe ones, unless QVI_PRETRAINED_DEMOS=0 leaves them out.
[[ ${QVI_PRETRAINED_DEMOS:-1} == 1 ]] && models+=(sentiment-minilm ner-e5)
declare -A answered=()
complete=0
while ((${#answered[@]} < ${#models[@]} || !complete)); do
  if ! kill -0 "$run" 2>/dev/null; then
    at "scripts/run.sh ended early; its last lines:"
    tail -n 30 "$work/run.out"
    exit 1
  fi
  if [[ -x $client ]]; then
    for m in "${models[@]}"; do
      [[ -n ${answered[$m]:-} ]] && continue
      # shellcheck disable=SC2086  # the command's words split on purpose
      if "$client" --server "localhost:$PORT" --timeout 5 ${asked[$m]} "Shares in Siemens rose in Munich." \
        > /dev/null 2>&1; then
        answered[$m]=1
        at "$m answered (${asked[$m]%% *})"
      fi
    done
  fi
  if ((!complete)) && grep -q 'the demo models are complete' "$work/run.out"; then
    complete=1
    at "the demo models are complete (faithfulness figures and native packages in)"
  fi
  sleep 5
done
echo "run.sh's set-up and model lines:"
grep -E '^\S*\[(setup|models) |^    ' "$work/run.out" | sed 's/\x1b\[[0-9;]*m//g'
