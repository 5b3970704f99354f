#!/usr/bin/env bash
# Session 37, device call 3: the fused GEMM 1's deferred half as committed
# (sFIN: call 2's sQ without its switch, and moe_ws_gpu_test's fused check
# with its per-element rounding bound) against HEAD before it (sOLD,
# 68ade27). moe_ws_gpu_test, memcheck and racecheck of the fused cases
# first; then moe_bench bf16 A/B in alternating order on Mixtral and Qwen3
# 64-4096 tokens (the ping-pong form at Mixtral 64 / 128, Qwen3 256 / 512 and
# DeepSeek-V3 512, the tall tiles at Mixtral 512 and DeepSeek-V3 4096, whose
# epilogue code changed, besides the cooperative rows); then the layer,
# graph and moe_gpu suites; then Mixtral's table beside torch._grouped_mm.
# Packs: pack.sh sOLD moe_bench moe_ws_gpu_test moe_layer_gpu_test (68ade27);
#   pack.sh sFIN moe_bench moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test
#   moe_graph_gpu_test (the commit; docs/perf/session33/scripts/pack.sh).
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sFIN
gpu_check_setup kplan-s37c3 .t_sFIN
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|^fused|differ|Failure|got'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=14 step "bench_$2" 90 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 64,128,256,512,1024,2048,4096 --json "$out/bench_$2.json"
}
ds() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=3 step "ds_$2" 60 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes deepseek --tokens 512,4096 --json "$out/ds_$2.json"
}
left 60 && TAIL=30 step ws_test 60 "$bin/moe_ws_gpu_test"
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation:MoeWsGpuTest.SanitizerShape'
left 60 && step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
left 90 && rows sOLD sOLD
left 90 && rows sFIN sFIN
left 60 && ds sOLD sOLD
left 60 && ds sFIN sFIN
left 90 && rows sFIN sFINb
left 90 && rows sOLD sOLDb
left 60 && ds sFIN sFINb
left 60 && ds sOLD sOLDb
left 130 && step layer_test 130 "$bin/moe_layer_gpu_test"
left 30 && step graph_test 30 "$bin/moe_graph_gpu_test"
left 30 && step gpu_test 30 "$bin/moe_gpu_test"
left 100 && TAIL=12 step table 100 "$bin/moe_bench" "${B[@]}" --decode_layer off --shapes mixtral \
  --tokens 1,16,64,128,256,512,1024,2048,4096 --json "$out/table.json"
left 100 && TAIL=12 step_keep='Mixtral|torch|grouped' step baseline 100 python3 bench/moe_baseline.py \
  --shapes mixtral --tokens 1,16,64,128,256,512,1024,2048,4096 --budget_s 0.2 --warmup_s 1 \
  --sets 2 --json "$out/baseline.json"
gpu_check_finish
