#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist):
# the GPU correctness tests, the benchmarks with their baselines, and a
# kplan-server smoke test on the real devices. Logs go to $OUT (or /tmp).
# usage: scripts/gpu-check.sh [DIST]
set -uo pipefail
dist=${1:-.dist}
out=${OUT:-/tmp/kplan-gpu}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
bin=$dist/bin
source scripts/server-port.sh
status=0
step() {  # name command...
  local name=$1
  shift
  echo "=== $name: $*"
  if "$@" >"$out/$name.log" 2>&1; then echo "--- $name: ok"; else echo "--- $name: FAILED ($?)"; status=1; fi
  tail -n "${TAIL:-15}" "$out/$name.log"
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
[ -x "$bin/ir_gpu_test" ] && step ir_gpu_test "$bin/ir_gpu_test"
[ -x "$bin/rpc_gpu_server_test" ] && step rpc_gpu_server_test "$bin/rpc_gpu_server_test"
[ -x "$bin/ir_bench" ] && TAIL=30 step ir_bench "$bin/ir_bench"
[ -f bench/ir_baseline.py ] && TAIL=30 step ir_baseline python3 bench/ir_baseline.py
if [ -x "$bin/kplan-server" ]; then
  "$bin/kplan-server" --listen=127.0.0.1:0 >"$out/server.log" 2>&1 &
  pid=$!
  port=$(kplan_server_port "$out/server.log" "$pid" 10)
  step kplan_info "$bin/kplan" info --server "127.0.0.1:$port"
  step kplan_resolve "$bin/kplan" resolve --server "127.0.0.1:$port"
  kill -TERM $pid; wait $pid; echo "server exit: $?"; tail -3 "$out/server.log"
fi
exit $status
