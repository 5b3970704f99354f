#!/usr/bin/env bash
# Session 7's CPU-path measurement of POSIX shm tensors (docs/PERF.md "Session 7:
# shm tensors in place"): one row = a fresh --devices=none server from
# /tmp/shm-VARIANT/kplan-server, kplan_perf --shm at concurrency 1 (E=8 H=4096
# I=16 k=1), then the server's mean per hop from kplan_hop_seconds.
# usage: shm_inplace_cpu.sh VARIANT(before|after) TOKENS MODE(skip|run) [DURATION] [--shm=false]
# Rows were run alternating: for rep in 1 2 3; for row; for v in before after.
set -u
v=$1 t=$2 mode=$3 dur=${4:-3} shm=${5:---shm}
sock=/tmp/shmip-$v.sock; port=19932
rm -f $sock
/tmp/shm-$v/kplan-server --listen=unix:$sock --devices=none --allow_shared_memory --allow_skip_device --metrics_listen=127.0.0.1:$port > /tmp/shmip-server-$v.log 2>&1 &
pid=$!
for i in $(seq 50); do [ -S $sock ] && break; sleep 0.1; done
sleep 0.5
extra=""; [ "$mode" = skip ] && extra="--skip_device"
out=$(timeout 120 /tmp/shm-before/kplan_perf --server unix:$sock --concurrency 1 --tokens $t --num_experts 8 --hidden 4096 --intermediate 16 --top_k 1 --duration_s $dur --warmup_s 0.5 $shm $extra 2>&1 | tail -1)
m=$(curl -s 127.0.0.1:$port/metrics | grep 'method="RunMoE"' | grep hop_seconds)
kill $pid; wait $pid 2>/dev/null
hop() { local s c; s=$(echo "$m" | grep "_sum{hop=\"$1\"" | awk '{print $2}'); c=$(echo "$m" | grep "_count{hop=\"$1\"" | awk '{print $2}'); python3 -c "print(f'{$s/$c*1e6:.0f}')"; }
p50=$(echo "$out" | awk '{print $7}'); p90=$(echo "$out" | awk '{print $8}'); n=$(echo "$out" | awk '{print $3}')
echo "$v tokens=$t $mode n=$n p50=$p50 p90=$p90 decode=$(hop decode) route=$(hop route) queue=$(hop queue) device=$(hop device) encode=$(hop encode) serialize=$(hop serialize)"
