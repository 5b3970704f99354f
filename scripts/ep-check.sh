#!/usr/bin/env bash
# Expert parallelism end to end: starts a single-device kplan-server and one
# whose devices form an expert-parallel group, loads the same random layer on
# both with the Python client and compares RunMoE per dispatch
# (scripts/ep_check.py). Logs go to $OUT (or /tmp/kplan-ep).
#
#   scripts/ep-check.sh                      # GPUs: --devices=0 against --devices=0,1
#   GPUS=0,1,2,3 scripts/ep-check.sh         # a 4-GPU group
#   scripts/ep-check.sh --cpu 3              # CPU path: --cpu_ep_ranks=3 (no GPU needed)
#
# BIN (default build/bin) holds kplan-server; the Python client is the kplan
# package in client/python (the distribution's python3-grpcio and python3-numpy).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/bin}
out=${OUT:-/tmp/kplan-ep}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
if [ "${1:-}" = "--cpu" ]; then
  ranks=${2:-2}
  single_flags=(--devices=none)
  ep_flags=(--devices=none "--cpu_ep_ranks=$ranks")
  small=--small
else
  gpus=${GPUS:-0,1}
  ranks=$(($(tr -cd , <<<"$gpus" | wc -c) + 1))
  single_flags=("--devices=${gpus%%,*}")
  ep_flags=("--devices=$gpus")
  small=
fi

source scripts/server-port.sh
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
start() {  # name flags... ; prints the port
  local name=$1
  shift
  "$bin/kplan-server" --listen=127.0.0.1:0 "$@" >"$out/$name.log" 2>&1 &
  pids+=($!)
  kplan_server_port "$out/$name.log" "${pids[-1]}" 30
}
single_port=$(start single "${single_flags[@]}") || exit 1
ep_port=$(start ep "${ep_flags[@]}") || exit 1
echo "single: ${single_flags[*]} on :$single_port; group: ${ep_flags[*]} on :$ep_port"
PYTHONPATH=client/python /usr/bin/python3 scripts/ep_check.py \
  "127.0.0.1:$single_port" "127.0.0.1:$ep_port" --ranks "$ranks" $small
status=$?
grep -h "expert-parallel\|stays on the CPU" "$out/ep.log" | head -5
exit $status
