#!/usr/bin/env bash
# Session 39, call 4: the last round's work items as halves (ws::WsTailHalves;
# unfused 16-bit tiles of 128 in clusters of two: Mixtral-8x7B's GEMM 2).
# - sH: the change (its head + the working tree when packed), which has the
#   halves on by default; KPLAN_MOE_WS_DEBUG=64 turns them off (the A/B in
#   one binary). docs/perf/session33/scripts/pack.sh sH moe_bench
#   moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test moe_graph_gpu_test
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sH
gpu_check_setup kplan-s39c4 .t_sH
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|Failure|tail_halves'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # log name; KPLAN_MOE_WS_DEBUG as exported
  TAIL=5 pack_bench sH "bench_$1" 60 "${B[@]}" --shapes mixtral --tokens 1024,2048,4096
}
left 60 && TAIL=4 step ws_test 60 "$bin/moe_ws_gpu_test"
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.TailHalves'
left 40 && TAIL=3 step moe_test 40 "$bin/moe_gpu_test"
left 30 && TAIL=3 step graph_test 30 "$bin/moe_graph_gpu_test"
left 40 && rows on1
left 40 && KPLAN_MOE_WS_DEBUG=64 rows off1
left 40 && KPLAN_MOE_WS_DEBUG=64 rows off2
left 40 && rows on2
left 25 && ws_ncu sH
left 25 && KPLAN_MOE_WS_DEBUG=64 ws_ncu sH
left 100 && TAIL=3 step layer_test 100 "$bin/moe_layer_gpu_test"
gpu_check_finish
