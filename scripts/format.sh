#!/usr/bin/env bash
# Formats every tracked C++ file with clang-format and the repository's .clang-format.
#   scripts/format.sh           rewrite the files in place
#   scripts/format.sh --check   change nothing; list the files that are not formatted and exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --style=file "$f" | cmp -s - "$f" || bad+=("$f")
  done
  if [[ ${#bad[@]} -gt 0 ]]; then
    printf 'not formatted (scripts/format.sh fixes them; clang-format --style=file FILE | diff FILE - shows how):\n'
    printf '  %s\n' "${bad[@]}"
    exit 1
  fi
  echo "[format] ${#files[@]} files formatted as .clang-format says"
else
  clang-format --style=file -i "${files[@]}"
fi
