#!/usr/bin/env bash
# The device call that measures the shared-memory call channels on one H200
# (not run in session 28: no machine was lent). #15's goals: Qwen3 one token,
# round trip <= kernel + 15 us with shared memory (<= kernel + 50 us inline);
# 512 tokens <= 1.05x the device time with shared memory; 64 one-token
# clients with coalescing >= 4x the requests/s without.
# Here, from a CUDA build (sm_90a):
#   ninja -C build kplan-server kplan_perf moe_rpc_bench rpc_floor_bench \
#       rpc_shm_channel_test rpc_gpu_server_test rpc_coalesce_gpu_test
#   rm -rf .dist && bash scripts/bundle.sh .dist build/bin/{kplan-server,kplan_perf,\
#       moe_rpc_bench,rpc_floor_bench,rpc_shm_channel_test,rpc_gpu_server_test,\
#       rpc_coalesce_gpu_test}
#   strip --strip-debug .dist/bin/* .dist/lib/*; cp docs/perf/session28/scripts/channel-gpu-call.sh .dist/
# There: run with carry [".dist"]:  bash .dist/channel-gpu-call.sh
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.dist/lib NCCL_NVLS_ENABLE=0
b=.dist/bin
o=${OUT:-/tmp/out}
mkdir -p "$o"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$o/gpu.txt"
# Correctness first: the channel's tests (CPU path) and the GPU server's.
timeout 60 $b/rpc_shm_channel_test 2>&1 | tail -3 | tee "$o/tests.txt"
timeout 60 $b/rpc_gpu_server_test 2>&1 | tail -3 | tee -a "$o/tests.txt"
timeout 60 $b/rpc_coalesce_gpu_test 2>&1 | tail -3 | tee -a "$o/tests.txt"
# Round trip against the layer, hop by hop (Qwen3-30B-A3B bf16): skip / run /
# shm over gRPC against chan / chshm through a channel, and the gRPC floor.
timeout 180 $b/moe_rpc_bench --iters 200 --tokens 1,8,64,512 --transport unix \
  > "$o/moe_rpc_bench.txt" 2>&1
timeout 120 $b/rpc_floor_bench --calls 2000 --rounds 3 --transport unix --process separate \
  --cases grpc,skip,channel --csv "$o/floor.csv" > "$o/floor.txt" 2>&1
# Coalescing at 64 one-token clients, over gRPC and through channels.
for via in grpc channel; do
  extra=()
  [ "$via" = channel ] && extra=(--channel)
  DEVICES=0 COALESCE_WINDOW_US=50 SERVER_FLAGS="--allow_shared_memory --max_shm_channels 128" \
    timeout 75 scripts/coalesce-perf.sh $b "$o/coalesce_$via" --concurrency 1,64 --tokens 1 \
    --duration_s 4 --warmup_s 1 "${extra[@]}" > "$o/coalesce_$via.txt" 2>&1
done
tail -n 30 "$o"/*.txt
