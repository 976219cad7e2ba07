#!/usr/bin/env bash
# Builds the QVI Serve image with podman, from this checkout:
#   docker/build.sh [cpu|cuda]        -> localhost/qvi-serve:cpu (or :cuda), also tagged VERSION-VARIANT
# Needs the demo models (scripts/setup.sh makes them) and root podman (scripts/setup.sh installs it).
#
# 1. The base image, localhost/qvi-base:bookworm: Debian 12 (minbase) made with debootstrap from
#    Debian's mirror and imported; no image registry is needed. Made once and kept (QVI_REBUILD_BASE=1
#    makes it again, e.g. for the month's security updates).
# 2. podman build --network=host --format docker (for HEALTHCHECK) of docker/Dockerfile. Caches kept
#    between builds: podman's layers (unchanged sources: nothing is rebuilt), cache mounts for apt's
#    packages and pip's wheels, and this machine's ccache bound in (what scripts/setup.sh's build
#    compiled is not compiled again; changed sources: only what changed is compiled).
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/podman.sh
variant=${1:-cpu}
[[ $variant == cpu || $variant == cuda ]] || { echo "usage: docker/build.sh [cpu|cuda]" >&2; exit 2; }
log() { printf '\033[1m[image]\033[0m %s\n' "$*"; }
BASE=localhost/qvi-base:bookworm
IMAGE=localhost/qvi-serve
VERSION=$(sed -n 's/^project(qvi_serve VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)

for m in sentiment ner topics; do
  compgen -G "model_store/store/$m/*/model.pt" > /dev/null ||
    { echo "docker/build.sh: no demo model model_store/store/$m; run scripts/setup.sh first" >&2; exit 1; }
done

if [[ ${QVI_REBUILD_BASE:-0} == 1 ]] || ! "${QVI_PODMAN[@]}" image exists "$BASE"; then
  start=$SECONDS
  root=$(mktemp -d /var/tmp/qvi-base.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  log "making $BASE: debootstrap Debian 12 (minbase) into $root"
  debootstrap --variant=minbase bookworm "$root/rootfs" http://deb.debian.org/debian > "$root/debootstrap.log" 2>&1 ||
    { tail -20 "$root/debootstrap.log"; exit 1; }
  cat > "$root/rootfs/etc/apt/sources.list" <<'LIST'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
LIST
  rm -rf "$root"/rootfs/var/cache/apt/archives/*.deb "$root"/rootfs/var/lib/apt/lists/*
  tar -C "$root/rootfs" -c . | "${QVI_PODMAN[@]}" import \
    --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$BASE" > /dev/null
  log "$BASE made in $((SECONDS - start)) s"
fi

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ -z $(git status --porcelain 2>/dev/null) ]] || revision="$revision-dirty"
source_url=$(git config --get remote.origin.url 2>/dev/null || echo "file://$(pwd)")
# pip in the build stage trusts what this machine trusts (a TLS-inspecting proxy's CA, say); the bundle
# is a build secret, so it stays out of the image.
ca_bundle=${QVI_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# Room for the build: a cuda build writes its build stage (8.6 GB), then the image's 4 GB copied out of
# it, before the stale ones are dropped below; 16 GB free was measured too little (2026-11-29: "no space
# left on device" in the runtime stage's COPY), and 23 GB too (2026-12-06, CI: "no space left on device"
# committing the build stage's last step, its 3.5 GB of wheels written a second and a third time as the
# layer's blob and the layer, the model zoo's tests writing beside it). With less free than this, the
# cached build stages of this variant go first (the build is slower, not failed: a full disk half-way
# stops everything after it).
graph_root=$("${QVI_PODMAN[@]}" info --format '{{.Store.GraphRoot}}')
free_gb=$(($(df --output=avail -k "$graph_root" | tail -1) / 1024 / 1024))
# QVI_IMAGE_NEED_GB sets the cuda figure (a large one exercises the dropping below).
need_gb=$([[ $variant == cuda ]] && echo ${QVI_IMAGE_NEED_GB:-32} || echo 8)
if ((free_gb < need_gb)); then
  log "only $free_gb GB free in $graph_root (want $need_gb): dropping the cached $variant build stages first"
  # Every image of this variant's build stage, its layer cache included: a prune of dangling images
  # alone left the chains of older and half-finished builds (a cache image with children is not
  # dangling), 2026-11-29, and the build ran out of room again. Then whatever else is dangling.
  mapfile -t stale < <("${QVI_PODMAN[@]}" images -a -q --filter label=io.qvi.build-stage="$variant" | sort -u)
  if ((${#stale[@]} > 0)); then "${QVI_PODMAN[@]}" rmi -f "${stale[@]}" > /dev/null 2>&1 || true; fi
  # (A build that failed half-way leaves a build container holding its image: that one stays.)
  "${QVI_PODMAN[@]}" image prune -f > /dev/null 2>&1 || true
  free_gb=$(($(df --output=avail -k "$graph_root" | tail -1) / 1024 / 1024))
  log "$free_gb GB free now$( ((free_gb >= need_gb)) || echo "; still under $need_gb: the build may run out of room (free the disk)")"
fi
# QVI_IMAGE_NO_CACHE=1: no layer cache, as on a fresh machine (bench/cold_start.sh test; the base image and
# the pip wheels' cache mount stay).
cold=()
[[ ${QVI_IMAGE_NO_CACHE:-0} == 1 ]] && cold=(--no-cache)
# This machine's ccache (CCACHE_DIR, or ccache's own default), bound into the build stage at /ccache: what
# the machine's build compiled, the image's build stage finds there (the Dockerfile says how).
ccache_dir=${CCACHE_DIR:-$(ccache -k cache_dir 2>/dev/null || echo "$HOME/.ccache")}
mkdir -p "$ccache_dir"
start=$SECONDS
started_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
log "building $IMAGE:$variant (revision $revision)"
"${QVI_PODMAN[@]}" build --network=host --format docker --pull=never --layers "${cold[@]}" \
  --secret id=ca-bundle,src="$ca_bundle" --volume "$ccache_dir:/ccache" \
  -f docker/Dockerfile --build-arg BASE="$BASE" --build-arg VARIANT="$variant" \
  --build-arg VERSION="$VERSION" --build-arg REVISION="$revision" --build-arg SOURCE="$source_url" \
  -t "$IMAGE:$variant" -t "$IMAGE:$VERSION-$variant" .
# The image this tag named before, if any, is dangling now: drop it (only final images carry the
# label; the build stage's cached layers stay).
"${QVI_PODMAN[@]}" image prune -f --filter label=io.qvi.variant > /dev/null
# Every build whose sources changed leaves the previous build stage dangling (2-5 GB each, LibTorch
# inside): drop those created over three days ago, so that a machine that builds daily (CI) does not
# fill its disk; recent ones, and layers a newer build still stands on, stay as cache.
"${QVI_PODMAN[@]}" image prune -f --filter until=72h > /dev/null
# Each build whose sources changed also leaves this variant's previous build stage (8 GB for cuda):
# several builds a day filled the disk. Drop the ones made before this build began; this build's
# layers are the cache of the next one and stay.
"${QVI_PODMAN[@]}" image prune -f --filter label=io.qvi.build-stage="$variant" --filter until="$started_at" > /dev/null
size=$("${QVI_PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE:$variant")
log "$IMAGE:$variant built in $((SECONDS - start)) s: $((size / 1000000)) MB"
