#!/usr/bin/env bash
# kplan-server --help lists every flag the server defines (read from its
# source, so a new flag missing from --help fails this) with its default, and
# neither --help nor --helpfull prints a build-machine path; dashes spell the
# same flags as underscores.
set -euo pipefail
bin=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
server=$bin/kplan-server

"$server" --help >"$work/help.txt" 2>&1 || true
if grep -q "No flags matched" "$work/help.txt"; then cat "$work/help.txt"; exit 1; fi
flags=$(grep -ohE 'ABSL_FLAG\([^,]+, *[a-z0-9_]+' "$source_dir/server/rpc/main.cc" | sed 's/.*, *//')
[ "$(echo "$flags" | wc -l)" -ge 20 ] || { echo "found only: $flags"; exit 1; }
# Each flag's entry, joined across its wrapped lines, must end with its default.
python3 - "$work/help.txt" $flags <<'PY'
import re, sys
text = open(sys.argv[1]).read()
entries = dict(re.findall(r"^    --(\w+) (.*?);$", re.sub(r"\n      ", " ", text), re.M))
missing = [f for f in sys.argv[2:] if f not in entries]
no_default = [f for f in sys.argv[2:] if f in entries and "default:" not in entries[f]]
if missing or no_default:
    sys.exit(f"--help lacks {missing}; without a default: {no_default}\n{text}")
PY
grep -q "Flags from server/rpc/main.cc:" "$work/help.txt"
grep -q -- '--listen .*' "$work/help.txt"
grep -q 'default: "0.0.0.0:50051";' "$work/help.txt"

"$server" --helpfull >"$work/helpfull.txt" 2>&1 || true
for f in "$work/help.txt" "$work/helpfull.txt"; do
  # An absolute path starts after a space, quote, bracket or '=' (unix:/x is an address).
  if grep -nE "(^|[[:space:]\"'(=])/[[:alnum:]_.-]+/|\.\./|$source_dir" "$f"; then
    echo "$(basename "$f") names a build-machine path"
    exit 1
  fi
done

"$server" --version 2>&1 | grep -Eq '^kplan-server [0-9]+\.[0-9]+\.[0-9]+ \(' ||
  { "$server" --version; exit 1; }
# Dashes spell the same flags as underscores (vLLM's rule); values are kept.
for spelling in --log-format=xml --log_format=xml; do
  set +e
  "$server" "$spelling" 2>"$work/err.txt"
  rc=$?
  set -e
  [ "$rc" = 2 ] && grep -q -- "--log_format: unknown format 'xml'" "$work/err.txt" ||
    { echo "$spelling: rc $rc"; cat "$work/err.txt"; exit 1; }
done
# vLLM's --no-X for a boolean is abseil's --noX: both parse (an unknown
# flag would make --version fail).
for spelling in --no-inline-runs --no_inline_runs --noinline_runs; do
  "$server" "$spelling" --version >/dev/null 2>"$work/err.txt" ||
    { echo "$spelling was not taken"; cat "$work/err.txt"; exit 1; }
done
set +e
"$server" --log_format=no-such_format 2>"$work/err.txt"
set -e
grep -q "unknown format 'no-such_format'" "$work/err.txt"
echo "server_help_test: ok"
