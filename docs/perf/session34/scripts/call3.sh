#!/usr/bin/env bash
# Session 34, device call 3: the expert-aligned tile order (s34c) against
# b69ce58 (s34).
# - The GPU suites with it: moe_ws_gpu_test (every form with the order forced
#   on and off, byte-equal; the rule's own launches at N 6144), moe_gpu_test,
#   moe_layer_gpu_test, moe_graph_gpu_test, moe_fp8_ws_gpu_test (the shared
#   pipeline); last, memcheck and racecheck of the new test case.
# - moe_bench bf16 at Mixtral-8x7B and DeepSeek-V3, 1024-4096 tokens:
#   old, new with KPLAN_MOE_WS_ALIGNED=0, new (the rule), twice, each row
#   checked before it is timed.
# - ncu of the fused GEMM 1 at Mixtral 4096 with the order: DRAM bytes.
set -uo pipefail
for p in s34 s34c; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-s34 .t_s34c
echo "old $(cat .t_s34/REV), new $(cat .t_s34c/REV)"
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|Duration|DRAM Throughput|dram__bytes_read|Issue Slots Busy|L2 Hit Rate  '
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step ws_test 150 "$bin/moe_ws_gpu_test"
step gpu_test 100 "$bin/moe_gpu_test"
step layer_test 120 "$bin/moe_layer_gpu_test"
step graph_test 90 "$bin/moe_graph_gpu_test"
step fp8_test 90 "$bin/moe_fp8_ws_gpu_test"
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
for r in 1 2; do
  for v in old off new; do
    d=.t_s34c; [ $v = old ] && d=.t_s34
    a=1; [ $v = off ] && a=0
    KPLAN_MOE_WS_ALIGNED=$a LD_LIBRARY_PATH=$PWD/$d/lib TAIL=8 step "bench_${v}_$r" 100 \
      $d/bin/moe_bench "${B[@]}" --shapes mixtral,deepseek --tokens 1024,2048,4096 \
      --json "$out/bench_${v}_$r.json"
  done
done
for v in off new; do
  a=1; [ $v = off ] && a=0
  KPLAN_MOE_WS_ALIGNED=$a TAIL=8 step "ncu_g1_$v" 120 ncu --clock-control none --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,lts__t_bytes.sum \
    -k regex:WsGrouped -c 2 "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
    --quant bf16 --shapes mixtral --tokens 4096 --fused on
done
# Last, in what time is left: the sanitizers over the new test case.
for t in memcheck racecheck; do
  step "ws_$t" 60 compute-sanitizer --tool $t --error-exitcode 1 "$bin/moe_ws_gpu_test" \
    --gtest_filter='*AlignedOrderByTheRule*'
done
gpu_check_finish
