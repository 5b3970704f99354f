#!/usr/bin/env bash
# RunMoE coalescing, off against on (docs/PERF.md "Coalescing"): starts
# kplan-server without coalescing, runs kplan_perf against it, stops it, then
# the same with --coalesce_window_us / --coalesce_max_tokens, and prints the
# ratio of requests/s and both p99s. Each run loads its own random set.
#
# usage: scripts/coalesce-perf.sh BIN_DIR OUT_DIR [kplan_perf flags...]
#   env: DEVICES (none: the CPU path; 0: cuda:0), COALESCE_WINDOW_US (2000),
#        COALESCE_MAX_TOKENS (64), METRICS_PORT (set: the server serves its
#        metrics there and OUT_DIR/metrics_{off,on}.txt keep the RunMoE hop
#        histograms and coalescing counters read after each run),
#        SERVER_FLAGS (more kplan-server flags, e.g. "--allow_shared_memory
#        --max_shm_channels 128" for kplan_perf --channel)
# e.g.   scripts/coalesce-perf.sh build/bin /tmp/co --concurrency 64 --tokens 1 \
#            --num_experts 32 --hidden 1024 --intermediate 512 --top_k 4 --duration_s 10
set -euo pipefail
bin=$1
out=$2
shift 2
mkdir -p "$out"
devices=${DEVICES:-none}
window=${COALESCE_WINDOW_US:-2000}
max_tokens=${COALESCE_MAX_TOKENS:-64}
for mode in off on; do
  sock=/tmp/kplan-coalesce-$$-$mode.sock
  flags=(--listen "unix:$sock" --devices "$devices" --log_level warn)
  [ -n "${METRICS_PORT:-}" ] && flags+=(--metrics_listen "127.0.0.1:$METRICS_PORT")
  # shellcheck disable=SC2206  # words on purpose
  [ -n "${SERVER_FLAGS:-}" ] && flags+=(${SERVER_FLAGS})
  if [ "$mode" = on ]; then
    flags+=(--coalesce_window_us "$window" --coalesce_max_tokens "$max_tokens")
  fi
  "$bin/kplan-server" "${flags[@]}" &
  pid=$!
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
  echo "== coalescing $mode: kplan-server ${flags[*]}"
  status=0
  "$bin/kplan_perf" --server "unix:$sock" --server_pid "$pid" --json "$out/coalesce_$mode.json" \
    --csv "$out/coalesce_$mode.csv" "$@" || status=$?
  if [ -n "${METRICS_PORT:-}" ]; then
    python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' \
      "http://127.0.0.1:$METRICS_PORT/metrics" |
      grep -E '^kplan_(hop_seconds|moe_coalesce|request_)' |
      grep -E 'RunMoE|coalesce' >"$out/metrics_$mode.txt" || true
  fi
  kill "$pid"
  wait "$pid" || true
  [ "$status" -eq 0 ] || { echo "kplan_perf failed ($status)"; exit "$status"; }
done
python3 - "$out/coalesce_off.json" "$out/coalesce_on.json" <<'PY'
import json, sys
off, on = (json.load(open(p))["rows"] for p in sys.argv[1:3])
print(f"{'tokens':>6} {'conc':>5} {'req/s off':>10} {'req/s on':>10} {'ratio':>6} "
      f"{'p99 off us':>11} {'p99 on us':>10}")
for a, b in zip(off, on):
    ratio = b["req_per_s"] / a["req_per_s"] if a["req_per_s"] else float("nan")
    print(f"{a['tokens']:>6} {a['concurrency']:>5} {a['req_per_s']:>10.1f} {b['req_per_s']:>10.1f} "
          f"{ratio:>6.2f} {a['p99_us']:>11.0f} {b['p99_us']:>10.0f}")
PY
