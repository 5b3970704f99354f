#!/usr/bin/env bash
# Session 37, device call 5: the deferred half for the unfused epilogue too
# (sU: GEMM 2 and unfused GEMM 1 of cooperative tiles of 128 park chunks
# 4-7's transposed 16-byte pieces in the same 32 KiB and store one a k-tile
# of the next tile) against the committed fused-only form (sFIN2, df9375c's
# kernels). Correctness first (every GPU suite that runs these kernels,
# memcheck and racecheck of the many-item cases), then moe_bench bf16 A/B in
# alternating order, then ncu of the GEMMs at Mixtral 4096.
# Packs: pack.sh sFIN2 moe_bench moe_ws_gpu_test moe_layer_gpu_test;
#   pack.sh sU moe_bench moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test
#   moe_graph_gpu_test (docs/perf/session33/scripts/pack.sh).
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sFIN2 sU
gpu_check_setup kplan-s37c5 .t_sU
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|Failure|got'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=8 step "bench_$2" 60 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 256,1024,2048,4096 --json "$out/bench_$2.json"
}
left 60 && TAIL=8 step ws_test 60 "$bin/moe_ws_gpu_test"
left 100 && TAIL=8 step layer_test 100 "$bin/moe_layer_gpu_test"
left 30 && step graph_test 30 "$bin/moe_graph_gpu_test"
left 30 && TAIL=3 step gpu_test 30 "$bin/moe_gpu_test"
left 60 && TAIL=4 step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.ClustersWalkManyWorkItems:MoeWsGpuTest.SanitizerShape'
left 60 && TAIL=4 step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.ClustersWalkManyWorkItems'
left 40 && rows sFIN2 sFIN2
left 40 && rows sU sU
left 40 && rows sU sUb
left 40 && rows sFIN2 sFIN2b
for p in sFIN2 sU; do
  left 25 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=12 step_keep='WsGroupedGemm|gpu__time|tensor_op' \
    step ncu_$p 25 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 .t_$p/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
done
gpu_check_finish
