#!/usr/bin/env bash
# Groups crashing inputs by where they fail: replays each file in DIR on
# fuzz target BIN and prints, per distinct signature (the sanitizer's
# "runtime error" location or the first in-project frame of the report),
# the count, one input and the top frames. For sorting the artifacts of
# scripts/fuzz.sh (FUZZ_KEEP_GOING=1 collects many) before committing one
# input per distinct crash into fuzz/corpus/<target>/.
#   scripts/fuzz_triage.sh build-asan/bin/run_ir_op_fuzz fuzz-artifacts/run_ir_op_fuzz/artifacts
set -uo pipefail
bin=${1:?usage: scripts/fuzz_triage.sh BIN DIR}
dir=${2:?usage: scripts/fuzz_triage.sh BIN DIR}
name=$(basename "$bin")
extra=()
options="$(dirname "$0")/../fuzz/$name.options"
[ -f "$options" ] && read -ra extra < <(grep -v '^#' "$options" | tr '\n' ' ')
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:handle_abort=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
declare -A count first frames
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  log=$("$bin" -rss_limit_mb=2048 -timeout=10 "${extra[@]}" "$f" 2>&1)
  if [ $? -eq 0 ]; then
    sig="passes now"
  else
    # The target's own message first (server_fuzz: "<method> answered 12"),
    # then the sanitizer's.
    sig=$(grep -aE "^$name: " <<<"$log" | head -1 | sed -E 's/ to [0-9]+ request bytes//; s/after .*: /after: /')
    [ -n "$sig" ] || sig=$(grep -aoE '[^ ]+:[0-9]+:[0-9]+: runtime error: [a-z -]+' <<<"$log" | head -1 | sed -E 's/: [0-9]+ \*.*//')
    [ -n "$sig" ] || sig=$(grep -aE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' <<<"$log" | head -1 |
                           sed -E 's/==[0-9]+==//; s/ on address.*//; s/0x[0-9a-f]+//g')
    loc=$(grep -aE '^ *#[0-9]+ .* in kplan::' <<<"$log" | head -1 | sed -E 's/.* in //; s/\(.*\)//; s/ \/.*\/(server|kernels|fuzz)\//  \1\//')
    sig="$sig | $loc"
  fi
  count[$sig]=$(( ${count[$sig]:-0} + 1 ))
  if [ -z "${first[$sig]:-}" ]; then
    first[$sig]=$f
    frames[$sig]=$(grep -aE '^ *#[0-4] ' <<<"$log" | head -5 | sed -E 's/ \(\/[^)]*\)//; s/0x[0-9a-f]+ in //; s/^ */    /')
  fi
done
for sig in "${!count[@]}"; do
  echo "== ${count[$sig]}x  $sig"
  echo "   e.g. ${first[$sig]}"
  [ -n "${frames[$sig]}" ] && echo "${frames[$sig]}"
done
