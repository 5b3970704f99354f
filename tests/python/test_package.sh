#!/usr/bin/env bash
# The kplan Python package as a user installs it, offline: a fresh
# `python3 -m venv --system-site-packages` (the distribution's grpcio,
# protobuf and numpy), `pip install --no-index --no-build-isolation`, then
# test_client.py against real servers with the installed package (not the
# source tree) on the path.
#   test_package.sh SOURCE_DIR KPLAN_SERVER_BIN
set -euo pipefail
src=$1
server=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
# A copy: pip builds in the folder it is given, and the tree stays clean.
cp -r "$src/client/python" "$work/pkg"
"$work/venv/bin/pip" install -q --no-index --no-build-isolation "$work/pkg"
"$work/venv/bin/pip" show kplan >"$work/show.txt"
grep -q "^Requires: grpcio, numpy, protobuf" "$work/show.txt" || { cat "$work/show.txt"; exit 1; }
rm -rf "$work/pkg"
cp "$src/tests/python/test_client.py" "$work/"
cd "$work"
env -u PYTHONPATH KPLAN_SERVER_BIN="$server" KPLAN_EXPECT_INSTALLED=1 \
  KPLAN_TEST_CERTS_SCRIPT="$src/tests/rpc/make_test_certs.sh" \
  "$work/venv/bin/python" -m unittest -v test_client
