#!/usr/bin/env bash
# Session 42, call 1: the fp8 decode layers' quantisers off the critical
# path (ca58fe3, a11cae0: the routing kernel quantises GEMM 1's A in blocks
# of its own; a small dynamic per-tensor quantisation is one kernel) against
# the session-41 head (9542cc4), the one-token fp8 layers alternating; then
# the new head's moe_quant_gpu_test (session 41's never-run review cases
# and this session's), memcheck of the fp8 matvec and the new launcher,
# and every other GPU suite as time allows.
# Packs (build with -gencode=arch=compute_90a,code=sm_90a), each:
#   docs/perf/session33/scripts/pack.sh sU|sV moe_bench ir_gpu_test \
#     moe_activation_gpu_test moe_coalesce_gpu_test moe_decode_gpu_test \
#     moe_fp8_ws_gpu_test moe_gpu_test moe_graph_gpu_test moe_layer_gpu_test \
#     moe_quant_gpu_test moe_shm_inplace_gpu_test moe_ws_gpu_test \
#     cuda_runtime_gpu_test rpc_coalesce_gpu_test
# sU at 9542cc4, sV at db1e57c. Device tool: carry ["build-pack"];
# DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sU sV
gpu_check_setup kplan-s42c1 .t_sV
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK|cases'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1)
for r in 1 2; do
  for p in sU sV; do
    left 40 && TAIL=8 pack_bench $p "mq${r}_$p" 40 "${Q[@]}" --quant fp8_block,fp8_per_tensor \
      --shapes mixtral,qwen3,deepseek
  done
done
left 150 && TAIL=4 step quant_all 150 "$bin/moe_quant_gpu_test"
left 80 && TAIL=3 step memcheck 80 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*RoutingWithTheActivationQuantiser*:*MatvecFp8Combine*'
for t in moe moe_decode moe_graph moe_coalesce moe_fp8_ws moe_ws moe_activation ir \
  moe_shm_inplace cuda_runtime rpc_coalesce; do
  left 30 && TAIL=3 step "$t" 60 "$bin/${t}_gpu_test"
done
left 120 && TAIL=3 step moe_layer 120 "$bin/moe_layer_gpu_test"
gpu_check_finish
