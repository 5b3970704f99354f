#!/usr/bin/env bash
# Session 30, device call 2: call 1 ran the in-region channel first and
# the serialized one second and found the round trip slower in the region;
# the build host then traced that to the client's output buffer (a fresh
# 2 MiB string a call, bimodal page faults), fixed after call 1 (the client
# keeps the caller's buffer; moe_rpc_bench reuses its answer). Rebuild the
# bundle at HEAD before this call (scripts/pack.sh). Here the forms alternate (serialized,
# in region, twice),
# with the default 50 us polling and with both sides polling 30 ms;
# shmcopy (scripts/shmcopy.cc) times the raw copies into and out of a
# shared object, pinned or not; kplan_perf through a channel from another
# process, alternating too; the hop at 512 tokens (moe_hop_bench).
set -uo pipefail
tar -xJf build-pack/dist.tar.xz
export LD_LIBRARY_PATH=$PWD/.dist/lib
b=.dist/bin
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>&1
lscpu | grep -iE 'numa|model name|^CPU\(s\)'
timeout 60 $b/shmcopy
timeout 120 $b/moe_hop_bench --tokens 1,512 --iters 100
for spin in 50 30000; do
  for from in -1 65536 -1 65536; do
    echo "== moe_rpc_bench, in_region_from $from, polling $spin us"
    timeout 100 $b/moe_rpc_bench --iters 100 --tokens 1,64,512 --transport unix \
      --modes chan,chskip --channel_in_region_from $from --channel_spin_us $spin 2>&1 |
      grep -v "\[info\]" | grep -v "^#\|^transport"
  done
done
sock=/tmp/kplan-s30.sock
$b/kplan-server --listen unix:$sock --log_level warn --allow_shared_memory --allow_skip_device \
  --max_shm_channels 8 &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
for from in -1 65536 -1 65536; do
  echo "== kplan_perf --channel, in_region_from $from"
  timeout 120 $b/kplan_perf --server unix:$sock --channel --channel_capacity 33554432 \
    --channel_in_region_from $from --tokens 1,64,512 --concurrency 1 --duration_s 2 \
    --warmup_s 0.5 2>&1 | grep -v "\[info\]" | tail -8
done
kill $pid; wait $pid
