#!/usr/bin/env bash
# Session 34, device call 4: the expert-aligned order as its own kernel
# (s34d: clusters of two over blocks of 256 where units are grouped) against
# b69ce58 (s34), and #16's Mixtral rows beside torch._grouped_mm.
# - The GPU suites: moe_ws_gpu_test (every form, the order forced on and off,
#   byte-equal; the rule's launches), moe_gpu_test (with the poison race
#   fixed), moe_layer_gpu_test, moe_graph_gpu_test, moe_fp8_ws_gpu_test;
#   memcheck and racecheck of the rule's case.
# - moe_bench bf16, Mixtral-8x7B 1024-8192 and DeepSeek-V3 4096: old, new,
#   new with KPLAN_MOE_WS_ALIGNED=0, then new and old again.
# - bench/moe_baseline.py (torch._grouped_mm) at Mixtral 1024-4096.
set -uo pipefail
for p in s34 s34d; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-s34 .t_s34d
echo "old $(cat .t_s34/REV), new $(cat .t_s34d/REV)"
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|^ *(mixtral|baseline)|torch'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step ws_test 150 "$bin/moe_ws_gpu_test"
step gpu_test 100 "$bin/moe_gpu_test"
step layer_test 150 "$bin/moe_layer_gpu_test"
step graph_test 90 "$bin/moe_graph_gpu_test"
step fp8_test 90 "$bin/moe_fp8_ws_gpu_test"
for t in memcheck racecheck; do
  step "ws_$t" 60 compute-sanitizer --tool $t --error-exitcode 1 "$bin/moe_ws_gpu_test" \
    --gtest_filter='*AlignedOrderByTheRule*'
done
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
for v in old new off new2 old2; do
  d=.t_s34d; case $v in old*) d=.t_s34;; esac
  a=1; [ $v = off ] && a=0
  KPLAN_MOE_WS_ALIGNED=$a LD_LIBRARY_PATH=$PWD/$d/lib TAIL=8 step "bench_$v" 100 \
    $d/bin/moe_bench "${B[@]}" --shapes mixtral --tokens 1024,2048,4096,8192 \
    --json "$out/bench_$v.json"
done
KPLAN_MOE_WS_ALIGNED=1 TAIL=4 step "bench_deepseek" 100 "$bin/moe_bench" "${B[@]}" --shapes deepseek \
  --tokens 4096 --json "$out/bench_deepseek.json"
TAIL=12 step torch 150 python3 bench/moe_baseline.py --shapes mixtral --tokens 1024,2048,4096 \
  --budget_s 0.2 --warmup_s 1 --sets 2 --json "$out/torch.json"
gpu_check_finish
