#!/usr/bin/env bash
# Session 29, device call 2: the request path after 280921a (SM staging by
# default, logits read in place, channel calls inline at any size, the
# backend normalisation kept) on one H200. Here:
#   ninja -C build kplan-server kplan_perf moe_rpc_bench moe_hop_bench moe_graph_gpu_test \
#       rpc_gpu_server_test rpc_coalesce_gpu_test moe_shm_inplace_gpu_test
#   rm -rf .dist && bash scripts/bundle.sh .dist build/bin/{those}
#   strip --strip-debug .dist/bin/* .dist/lib/*; tar -cJf build-pack/dist.tar.xz .dist; rm -rf .dist
# There (carry build-pack): tar -xJf build-pack/dist.tar.xz && bash docs/perf/session29/scripts/call2.sh
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
b=.dist/bin
o=${OUT:-/tmp/out}
mkdir -p "$o"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$o/gpu.txt"
for t in moe_graph_gpu_test rpc_gpu_server_test rpc_coalesce_gpu_test moe_shm_inplace_gpu_test; do
  echo "== $t"; timeout 60 $b/$t 2>&1 | tail -2
done | tee "$o/tests.txt"
timeout 60 $b/moe_hop_bench --tokens 1,8,64 --iters 400 --csv "$o/hop.csv" > "$o/hop.txt" 2>&1
cat "$o/hop.txt"
for spin in 50 2000; do
  timeout 90 $b/moe_rpc_bench --iters 200 --tokens 1,512 --transport unix --channel_spin_us $spin \
    > "$o/moe_rpc_bench_spin$spin.txt" 2>&1
  grep -E "^unix|^#" "$o/moe_rpc_bench_spin$spin.txt"
done
DEVICES=0 COALESCE_WINDOW_US=50 SERVER_FLAGS="--allow_shared_memory --max_shm_channels 128" \
  timeout 75 scripts/coalesce-perf.sh $b "$o/coalesce_channel" --concurrency 1,64 --tokens 1 \
  --duration_s 4 --warmup_s 1 --channel > "$o/coalesce_channel.txt" 2>&1
tail -n 4 "$o/coalesce_channel.txt"
