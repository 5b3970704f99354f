#!/usr/bin/env bash
# The committed stubs of the kplan Python package match proto/: regenerates
# them into a scratch folder and compares (client/python/gen_stubs.sh fixes).
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$src/client/python/gen_stubs.sh" "$work/kplan"
committed=$src/client/python/kplan
status=0
for f in $(cd "$work/kplan" && find . -name '*_pb2*' | sort) \
         $(cd "$committed" && find . -name '*_pb2*' | sort); do
  if ! cmp -s "$work/kplan/$f" "$committed/$f"; then
    echo "stale or missing: client/python/kplan/$f"
    status=1
  fi
done
[ "$status" = 0 ] || echo "run client/python/gen_stubs.sh and commit the result"
exit "$status"
