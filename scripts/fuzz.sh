#!/usr/bin/env bash
# Runs every libFuzzer target (*_fuzz) in TARGET_DIR for SECONDS each, on a
# copy of its committed seed corpus (fuzz/corpus/<target>/; the committed
# files are never modified), with -rss_limit_mb=2048 -timeout=10
# -max_len=4096. Prints execs, exec/s and wall time per target and a summary;
# exits non-zero when any target crashed, timed out or ran out of memory.
#   scripts/fuzz.sh build-asan/bin 30
# Environment:
#   FUZZ_ARTIFACTS  where crashing inputs and logs are kept (fuzz-artifacts/)
#   FUZZ_TARGETS    space-separated subset of target names (default: all)
#   FUZZ_KEEP_GOING=1  keep fuzzing past a crash (-fork=1 -ignore_crashes=1
#                   -ignore_timeouts=1 -ignore_ooms=1) to collect several
#                   distinct crashes per target in one run
# New inputs found are left in FUZZ_ARTIFACTS/<target>/corpus; a crash input
# worth keeping is copied into fuzz/corpus/<target>/ by hand.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:?usage: scripts/fuzz.sh TARGET_DIR SECONDS}
secs=${2:?usage: scripts/fuzz.sh TARGET_DIR SECONDS}
out=${FUZZ_ARTIFACTS:-fuzz-artifacts}
mkdir -p "$out"
out=$(cd "$out" && pwd)

targets=()
if [ -n "${FUZZ_TARGETS:-}" ]; then
  for t in $FUZZ_TARGETS; do targets+=("$dir/$t"); done
else
  for t in "$dir"/*_fuzz; do [ -x "$t" ] && targets+=("$t"); done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no *_fuzz targets in $dir" >&2
  exit 2
fi

# Leaks are checked per input by libFuzzer; UB is fatal as in the tests.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:handle_abort=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

summary=()
failed=0
for bin in "${targets[@]}"; do
  name=$(basename "$bin")
  work="$out/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  [ -d "fuzz/corpus/$name" ] && cp -r "fuzz/corpus/$name/." "$work/corpus/"
  extra=()
  # fuzz/<target>.options: extra libFuzzer flags, one line (with the reason
  # in a comment line starting with #).
  if [ -f "fuzz/$name.options" ]; then
    read -ra extra < <(grep -v '^#' "fuzz/$name.options" | tr '\n' ' ')
  fi
  [ -f "fuzz/$name.dict" ] && extra+=("-dict=$root/fuzz/$name.dict")
  if [ "${FUZZ_KEEP_GOING:-0}" = 1 ]; then
    extra+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  # The recorded crashers (crash-*, timeout-*, oom-*, leak-* in the corpus)
  # one by one first: each that still fails is reported and left out of the
  # fuzzing run, so the run goes on finding new ones until the fix lands.
  replay_failed=0
  for f in "$work"/corpus/crash-* "$work"/corpus/timeout-* "$work"/corpus/oom-* "$work"/corpus/leak-*; do
    [ -e "$f" ] || continue
    if "$bin" -rss_limit_mb=2048 -timeout=10 "${extra[@]}" "$f" > "$work/replay.log" 2>&1; then
      echo "-- $name: fixed: $(basename "$f")"
    else
      replay_failed=$((replay_failed + 1))
      echo "-- $name: still fails: $(basename "$f")"
      grep -aE 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:|^ *#[0-3] ' \
        "$work/replay.log" | head -6 | sed 's/^/     /'
      cat "$work/replay.log" >> "$work/replay-failures.log"
      rm -f "$f"
    fi
  done
  echo "== fuzz: $name for ${secs}s ($(ls "$work/corpus" | wc -l) seed inputs)"
  start=$(date +%s.%N)
  "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${extra[@]}" \
    "$work/corpus" > "$work/log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  wall=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  execs=$(grep -ao 'stat::number_of_executed_units: *[0-9]*' "$work/log" | awk '{ s += $2 } END { print s + 0 }')
  if [ "$execs" -eq 0 ]; then
    # Fork mode or a crash before the final stats: the last status line.
    execs=$(grep -aoE '^#[0-9]+' "$work/log" | tail -1 | tr -d '#')
    execs=${execs:-0}
  fi
  rate=$(awk -v n="$execs" -v t="$wall" 'BEGIN { printf "%.0f", (t > 0 ? n / t : 0) }')
  crashes=$(ls "$work/artifacts" 2>/dev/null | wc -l)
  notes=()
  if [ "$replay_failed" -ne 0 ]; then
    failed=1
    notes+=("$replay_failed recorded crashers still fail")
  fi
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    failed=1
    notes+=("NEW CRASH (rc=$rc, $crashes artifacts)")
    echo "-- $name: new crash; inputs in $work/artifacts, log $work/log"
    ls "$work/artifacts" | sed 's/^/   /'
    # The reports: kind and the first frames of each.
    grep -aE 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error:|SUMMARY:|^ *#[0-5] ' \
      "$work/log" | head -60
  fi
  if [ ${#notes[@]} -eq 0 ]; then
    result=ok
  else
    result="FAILED: $(IFS=';'; echo "${notes[*]}")"
  fi
  echo "-- $name: $execs execs in ${wall}s ($rate exec/s): $result"
  summary+=("$(printf '%-22s %10s execs %7ss %8s exec/s  %s' "$name" "$execs" "$wall" "$rate" "$result")")
done
echo "== fuzz summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
exit "$failed"
