#!/usr/bin/env bash
# Smoke run of a built image on this machine (any variant; the cuda one serves on the CPU here):
# start it, wait for health SERVING, Classify and Tag through the published port with the host's
# qvi-client, check the log's CUDA line, stop it (SIGTERM) and require exit code 0. Prints the size.
#   docker/smoke.sh [IMAGE]        (default localhost/qvi-serve:cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/podman.sh
image=${1:-localhost/qvi-serve:cuda}
client=build/qvi-client
[[ -x $client ]] || { echo "docker/smoke.sh: $client missing; run scripts/setup.sh" >&2; exit 1; }
name=qvi-smoke-$$
trap '"${QVI_PODMAN[@]}" rm -f -t 0 "$name" > /dev/null 2>&1 || true' EXIT
start=$SECONDS
"${QVI_PODMAN[@]}" run -d --name "$name" --ulimit nofile=16384:16384 --ulimit nproc=4096:4096 \
  -p 127.0.0.1::8500 "$image" > /dev/null
ports=$("${QVI_PODMAN[@]}" port "$name" 8500)
address=${ports%%$'\n'*}
until "$client" --server "$address" --timeout 2 --color never health > /dev/null 2>&1; do
  (( SECONDS - start < 180 )) || { "${QVI_PODMAN[@]}" logs "$name"; echo "not SERVING in 180 s" >&2; exit 1; }
  sleep 1
done
echo "[smoke] $image SERVING after $((SECONDS - start)) s"
"$client" --server "$address" --color never classify --model sentiment "A smart, funny and moving film."
"$client" --server "$address" --color never tag --model ner "German chancellor Angela Merkel met Siemens executives in Munich"
"$client" --server "$address" --color never classify --model topics "Shares rose after record profits."
# Read the log whole first: grep -m1 on a pipe would stop podman with SIGPIPE, which pipefail reports.
logs=$("${QVI_PODMAN[@]}" logs "$name" 2>&1)
grep -m1 "CUDA:" <<< "$logs" || { echo "$logs"; echo "no CUDA: line in the log" >&2; exit 1; }
grep -m1 "CUDA graphs:" <<< "$logs" || { echo "$logs"; echo "no 'CUDA graphs:' line in the log" >&2; exit 1; }
# The cuda image carries the CUDA graph plugin, which loads here too (it only captures on a GPU).
if [[ $image == *:cuda ]] && ! grep -q "libqvi_cuda_graphs.so loaded" <<< "$logs"; then
  echo "$logs"; echo "the cuda image's CUDA graph plugin did not load" >&2; exit 1
fi
"${QVI_PODMAN[@]}" stop -t 30 "$name" > /dev/null
code=$("${QVI_PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$name")
[[ $code == 0 ]] || { "${QVI_PODMAN[@]}" logs "$name"; echo "exit code $code after SIGTERM" >&2; exit 1; }
size=$("${QVI_PODMAN[@]}" image inspect --format '{{.Size}}' "$image")
echo "[smoke] $image: served, stopped with exit code 0; image size $((size / 1000000)) MB"
