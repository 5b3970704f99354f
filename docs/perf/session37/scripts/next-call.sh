#!/usr/bin/env bash
# Prepared in session 37 for the next device call (not run yet):
# 1. The test changes made after session 37's device time was spent
#    (838e0b2, ba6fbd2: fused cases bit for bit against the unfused GEMM +
#    LaunchMoeActivation, the slope-at-g bound, K 576 with 328 work items,
#    walk_k320_fused fused) on the head as committed (sH).
# 2. sR: docs/perf/session37/deferred-regs.patch, the fused GEMM 1 deferring
#    chunk 1 too (4 more units in 16 registers, finished after the 8 shared-
#    memory units; ptxas spills unchanged: 8 / 16 bytes), against sH, moe_bench
#    bf16 A/B in alternating order, then ncu of the fused GEMM 1.
# Packs (a build configured with -gencode=arch=compute_90a,code=sm_90a):
#   pack.sh sH moe_bench moe_ws_gpu_test moe_layer_gpu_test     (at the head)
#   git apply docs/perf/session37/deferred-regs.patch
#   pack.sh sR moe_bench moe_ws_gpu_test moe_layer_gpu_test; git checkout kernels
#   (pack.sh: docs/perf/session33/scripts/pack.sh)
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sH sR
gpu_check_setup kplan-next .t_sH
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3)|differ|Failure|got'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=10 step "bench_$2" 60 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 256,1024,2048,4096 --json "$out/bench_$2.json"
}
left 90 && TAIL=30 step ws_test 90 "$bin/moe_ws_gpu_test"
left 90 && LD_LIBRARY_PATH=$PWD/.t_sR/lib TAIL=8 step ws_test_r 90 .t_sR/bin/moe_ws_gpu_test \
  --gtest_filter='MoeWsGpuTest.FusedActivation:MoeWsGpuTest.PingPongTurns'
left 60 && LD_LIBRARY_PATH=$PWD/.t_sR/lib step memcheck 60 compute-sanitizer --tool memcheck \
  --error-exitcode 1 .t_sR/bin/moe_ws_gpu_test --gtest_filter='MoeWsGpuTest.FusedActivation'
left 60 && LD_LIBRARY_PATH=$PWD/.t_sR/lib TAIL=6 step layer_r 60 .t_sR/bin/moe_layer_gpu_test \
  --gtest_filter='MoeLayerGpu.SmallFusedActivationBitIdentical:MoeLayerGpu.SwitchedFormsBitIdentical'
left 40 && rows sH sH
left 40 && rows sR sR
left 40 && rows sR sRb
left 40 && rows sH sHb
for p in sH sR; do
  left 25 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=12 step_keep='WsGroupedGemm|gpu__time|tensor_op' \
    step ncu_$p 25 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 .t_$p/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
done
gpu_check_finish
