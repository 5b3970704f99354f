#!/usr/bin/env bash
# Session 40, call 4 (prepared, NOT run: no machine could be started with
# the device time left): the head's fp8 GPU suites (call 1's fused epilogue,
# the rule from 64 slots at K >= 7168, the fixed test cases) and memcheck of
# the fused GEMM 1's small case. Pack sH: docs/perf/session33/scripts/pack.sh
# sH moe_fp8_ws_gpu_test moe_quant_gpu_test. Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sH
gpu_check_setup kplan-s40c4 .t_sH
step_keep='FAIL|PASSED|ERROR SUMMARY|OK \] Moe'
step fp8_ws_test 60 "$bin/moe_fp8_ws_gpu_test"
step memcheck 60 compute-sanitizer --tool memcheck "$bin/moe_fp8_ws_gpu_test" \
  --gtest_filter='*ActQuantSanitizerShape*'
step quant_test 180 "$bin/moe_quant_gpu_test"
gpu_check_finish
