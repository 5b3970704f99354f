#!/usr/bin/env bash
# Session 33, device call 3: #15's table with the code as it stands (pack.sh
# s33rp ...). Qwen3-30B-A3B-shaped bf16 experts throughout (E=128, top-8,
# H=2048, I=768):
# - the kernels (moe_bench, graph of layers back to back) and the device
#   hop (moe_hop_bench: the hop as the server runs it, the layer alone) at
#   1, 8, 64 and 512 tokens;
# - the table: kplan-server and kplan_perf in separate processes
#   over a Unix socket, concurrency 1, per mode (inline bytes over gRPC,
#   POSIX shm over gRPC, a channel with inline bytes, a channel with shm
#   tensors), the server's mean per hop from its metrics
#   (scripts/request-path-perf.sh); inline over TCP beside it;
# - 64 one-token clients through channels, coalescing off and on;
# - moe_rpc_bench in one process (hop by hop, both sides polling 50 us).
set -uo pipefail
tar -xJf build-pack/s33rp.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s33rp .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='.'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
TAIL=8 step kernels 100 "$bin/moe_bench" --budget_s 0.3 --sets 2 --fused on --warmup_s 1 \
  --check_tokens 2 --route auto --quant bf16 --decode_layer off --shapes qwen3 --tokens 1,8,64,512 \
  --json "$out/kernels.json"
TAIL=6 step hop 100 "$bin/moe_hop_bench" --tokens 1,8,64,512 --iters 300
TOKENS="1 8 64 512" MODES="inline shm channel chshm" DURATION_S=3 TAIL=18 \
  step table 240 bash scripts/request-path-perf.sh "$bin" "$out/rp" gpu --devices=0
# shellcheck disable=SC2016  # expanded by the inner shell
TAIL=10 step tcp 80 bash -c '
  "$0/kplan-server" --listen 127.0.0.1:50077 --devices=0 --log_level warn &
  pid=$!
  sleep 3
  "$0/kplan_perf" --server 127.0.0.1:50077 --concurrency 1 --tokens 1,8,64,512 --duration_s 3 \
    --warmup_s 1 --json "$1/tcp.json"
  rc=$?
  kill $pid
  wait $pid
  exit $rc' "$bin" "$out"
DEVICES=0 COALESCE_WINDOW_US=50 SERVER_FLAGS="--allow_shared_memory --max_shm_channels 128" TAIL=8 \
  step coalesce 120 bash scripts/coalesce-perf.sh "$bin" "$out/co" --concurrency 64 --tokens 1 \
  --duration_s 4 --warmup_s 1 --channel
TAIL=14 step rpc 150 "$bin/moe_rpc_bench" --iters 200 --tokens 1,512 --transport unix \
  --modes run,shm,chan,chshm
gpu_check_finish
