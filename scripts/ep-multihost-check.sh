#!/usr/bin/env bash
# Expert parallelism across servers on one 2-GPU host: a single-device
# kplan-server (--devices=0), and a group of two servers, rank 0 on GPU 0
# (--ep_size=2, the coordinator) and rank 1 on GPU 1 (--ep_rank=1, joining
# rank 0 through JoinEpGroup; NCCL between the processes). Loads the same
# random bfloat16 layer on the single server and on rank 0 (which streams it
# to rank 1) and compares RunMoE per dispatch with the C++ check
# (ep_multihost_check: no Python gRPC needed). Exits non-zero on a mismatch.
# Logs go to $OUT (or /tmp/kplan-ep-multihost).
#
#   scripts/ep-multihost-check.sh              # GPUs 0 and 1
#   GPUS=2,3 scripts/ep-multihost-check.sh     # other GPUs (rank 0 on the first)
#
# BIN (default build/bin) holds kplan-server and ep_multihost_check (a
# scripts/bundle.sh folder works: BIN=bundle/bin).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/bin}
out=${OUT:-/tmp/kplan-ep-multihost}
gpus=${GPUS:-0,1}
gpu0=${gpus%%,*}
gpu1=${gpus##*,}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0

source scripts/server-port.sh
pids=() logs=()
# Stops the servers in start order (rank 0 before rank 1, as an operator
# might); each must exit within 20 s of SIGTERM whatever its peers did: a
# server that waits on a peer that is gone fails the check.
stop_all() {
  local failed=0 i
  for i in "${!pids[@]}"; do
    kill -TERM "${pids[$i]}" 2>/dev/null || continue
    for _ in $(seq 200); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "FAIL: ${logs[$i]} did not exit within 20 s of SIGTERM; its log ends:" >&2
      tail -5 "$out/${logs[$i]}" >&2
      kill -KILL "${pids[$i]}" 2>/dev/null
      failed=1
    fi
    wait "${pids[$i]}" 2>/dev/null
  done
  pids=()
  return $failed
}
trap stop_all EXIT
formed() {  # rank 0 logs this once every rank joined
  for _ in $(seq 900); do
    grep -q "expert-parallel group formed" "$out/rank0.log" && return 0
    kill -0 "${pids[1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "the group did not form:" >&2
  tail -5 "$out/rank0.log" "$out/rank1.log" >&2
  return 1
}

"$bin/kplan-server" --listen=127.0.0.1:0 "--devices=$gpu0" >"$out/single.log" 2>&1 &
pids+=($!) logs+=(single.log)
single_port=$(kplan_server_port "$out/single.log" "${pids[-1]}") || exit 1
# Rank 0 needs a known port for rank 1; pick a free one.
rank0_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/kplan-server" "--listen=127.0.0.1:$rank0_port" "--devices=$gpu0" --ep_size=2 \
  --ep_join_timeout=120s >"$out/rank0.log" 2>&1 &
pids+=($!) logs+=(rank0.log)
"$bin/kplan-server" --listen=127.0.0.1:0 "--devices=$gpu1" --ep_size=2 --ep_rank=1 \
  "--ep_coordinator=127.0.0.1:$rank0_port" --ep_join_timeout=120s >"$out/rank1.log" 2>&1 &
pids+=($!) logs+=(rank1.log)
formed || exit 1
echo "single: --devices=$gpu0 on :$single_port; group: rank 0 cuda:$gpu0 on :$rank0_port, rank 1 cuda:$gpu1"
"$bin/ep_multihost_check" "127.0.0.1:$single_port" "127.0.0.1:$rank0_port" 2
status=$?
grep -h "expert-parallel\|stays on the CPU\|joined" "$out/rank0.log" "$out/rank1.log" | head -8
stop_all || status=1
exit $status
