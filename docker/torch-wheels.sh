#!/bin/sh
# Prints the pinned wheels (name==version, from requirements.lock) that an image variant installs.
#   cpu   torch, and the two CUDA runtime wheels whose libraries libtorch_cpu.so needs to load
#         (libcudart.so.13, libcupti.so.13);
#   cuda  torch and every nvidia-* wheel it depends on.
# Usage: torch-wheels.sh cpu|cuda REQUIREMENTS_LOCK
set -eu
variant=$1 lock=$2
case $variant in
  cpu) pattern='^(torch|nvidia-cuda-runtime|nvidia-cuda-cupti)==' ;;
  cuda) pattern='^(torch|nvidia-[a-z0-9-]+)==' ;;
  *) echo "torch-wheels.sh: variant must be cpu or cuda, not '$variant'" >&2; exit 2 ;;
esac
grep -E "$pattern" "$lock"
