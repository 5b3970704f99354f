#!/usr/bin/env bash
# Session 42, call 4 (call 3 cut to the device time left): moe_coalesce_gpu_test's
# fp8 per-channel / per-token flips (call 1: 12 against an allowance of 2)
# at the session-41 head (sU) and this session's (sW), same seed; then the
# head's moe_quant_gpu_test, memcheck of the join test, the routing suites.
# Packs as call3.sh. Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sU sW
gpu_check_setup kplan-s42c4 .t_sW
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|flips|seed|ERROR SUMMARY|cases'
for p in sU sW; do
  left 55 && TAIL=10 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 \
    LD_LIBRARY_PATH=$PWD/.t_$p/lib step "coalesce_$p" 55 ".t_$p/bin/moe_coalesce_gpu_test"
done
left 75 && TAIL=4 step quant_all 75 "$bin/moe_quant_gpu_test"
left 20 && TAIL=3 step memcheck 20 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*RoutingWithTheActivationQuantiser*'
for t in moe moe_decode moe_graph; do
  left 15 && TAIL=3 step "$t" 30 "$bin/${t}_gpu_test"
done
gpu_check_finish
