#!/usr/bin/env bash
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
b=.dist/bin
cpu() { awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $5}' /proc/stat; }
run() {  # name server-flags -- perf-flags
  local name=$1; shift; local sflags=(); while [ "$1" != -- ]; do sflags+=("$1"); shift; done; shift
  rm -f /tmp/k.sock; $b/kplan-server --listen unix:/tmp/k.sock --devices 0 --log_level warn --metrics_listen 127.0.0.1:9400 "${sflags[@]}" & local pid=$!
  for _ in $(seq 100); do [ -S /tmp/k.sock ] && break; sleep 0.1; done
  local c0; c0=$(cpu)
  $b/kplan_perf --server unix:/tmp/k.sock --tokens 1 --duration_s 4 --warmup_s 1 --json $OUT/$name.json "$@" 2>&1 | tail -1
  local c1; c1=$(cpu)
  echo "$name cpu busy/idle jiffies: $c0 -> $c1" | awk '{split($0,a," "); print}'
  python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' http://127.0.0.1:9400/metrics | grep -E '^kplan_(hop_seconds|moe_coalesce|request_)' | grep -E '_sum|_count' | grep -E 'RunMoE|coalesce' | grep -E 'encode|device_sec|queue_sec|per_launch|decode' > $OUT/$name.metrics
  kill $pid; wait $pid 2>/dev/null
}
timeout 200 $b/rpc_gpu_server_test 2>&1 | tail -2
timeout 120 $b/rpc_coalesce_gpu_test 2>&1 | tail -2
run off64 -- --concurrency 64
run on64 --coalesce_window_us 50 --coalesce_max_tokens 64 -- --concurrency 64
for f in $OUT/*.metrics; do echo "== $f"; cat $f; done
cd $OUT && tar czf rows.tgz *.json *.metrics && rm -f *.json *.metrics
