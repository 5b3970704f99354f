#!/usr/bin/env bash
# Session 42, call 3: moe_coalesce_gpu_test's fp8 per-channel / per-token
# flips (call 1: 12 against an allowance of 2) at the session-41 head (sU)
# and this session's (sW), same seed; the head's moe_quant_gpu_test and
# memcheck, then its routing suites; the one-token and 16-token fp8 block
# layers against sU, alternating; ncu of the one-token fp8 block layers at
# the head (kernel times), as the deadline allows.
# Packs: sU as call1.sh (9542cc4); sW at adb3519:
#   docs/perf/session33/scripts/pack.sh sW moe_bench moe_quant_gpu_test \
#     moe_coalesce_gpu_test moe_gpu_test moe_decode_gpu_test moe_graph_gpu_test \
#     moe_layer_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sU sW
gpu_check_setup kplan-s42c3 .t_sW
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|flips|seed|ERROR SUMMARY|cases|rooflines|^(Mixtral|Qwen3|DeepSeek)'
for p in sU sW; do
  left 60 && TAIL=10 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 \
    LD_LIBRARY_PATH=$PWD/.t_$p/lib step "coalesce_$p" 60 ".t_$p/bin/moe_coalesce_gpu_test"
done
left 90 && TAIL=4 step quant_all 90 "$bin/moe_quant_gpu_test"
left 40 && TAIL=3 step memcheck 40 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*RoutingWithTheActivationQuantiser*'
for t in moe moe_decode moe_graph; do
  left 30 && TAIL=3 step "$t" 60 "$bin/${t}_gpu_test"
done
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
for r in 1; do
  for p in sU sW; do
    left 30 && TAIL=6 pack_bench $p "mb${r}_$p" 30 "${Q[@]}" --quant fp8_block \
      --shapes mixtral,qwen3,deepseek --tokens 1,16
  done
done
for s in qwen3 deepseek; do
  left 40 && TAIL=0 step "ncu_$s" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:'^(?!nvjet|Copy|Fill)' -c 24 \
    "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
    --quant fp8_block --shapes $s --tokens 1 --fused on
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,60)}
    /gpu__time_duration|dram__bytes_read/ {printf "%-60s %-26s %10s %s\n", n, $1, $NF, $(NF-1)}' \
    "$out/ncu_$s.log" | tail -8
done
left 100 && TAIL=3 step moe_layer 100 "$bin/moe_layer_gpu_test"
gpu_check_finish
