#!/usr/bin/env bash
# Formats the C++ and CUDA sources with the root .clang-format.
#   scripts/format.sh           formats every file in place
#   scripts/format.sh --check   lists the files that differ, exits 1 if any
# Covers *.h *.cc *.cu *.cuh under base kernels resolve server client tests
# bench fuzz (tracked files only). CLANG_FORMAT picks the binary
# (clang-format, else the newest clang-format-<N> found).
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: scripts/format.sh [--check]" >&2; exit 2 ;;
esac
cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  if command -v clang-format >/dev/null; then
    cf=clang-format
  else
    cf=$(compgen -c clang-format- | sort -t- -k3 -n | tail -n1 || true)
  fi
fi
if [ -z "$cf" ] || ! command -v "$cf" >/dev/null; then
  echo "format.sh: clang-format not found (apt-get install clang-format)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files -- \
  $(for d in base kernels resolve server client tests bench fuzz; do
      for e in h cc cu cuh; do printf '%s/*.%s ' "$d" "$e"; done
    done))
if [ "${#files[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$check" -eq 0 ]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$cf" -i --style=file
  exit 0
fi
differ=0
for f in "${files[@]}"; do
  if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f"
    differ=1
  fi
done
exit "$differ"
