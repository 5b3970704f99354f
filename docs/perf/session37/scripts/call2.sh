#!/usr/bin/env bash
# Session 37, device call 2: the fused GEMM 1's epilogue, two changes
# (moe_gemm_ws_sm90.cu, cooperative tiles of 128; call 1 refuted session
# 36's deferral of whole 32-column chunks into one k-tile):
# - sDiet: fewer instructions a value, bit-identical: gate and up rounded
#   once where there is no bias (rounding is idempotent), two values a
#   conversion (Round2 / Pack2 on cvt.rn.bf16x2.f32); kDeferOn = false.
# - sQ: sDiet + the deferred half: two of a thread's four chunks go as
#   rounded bf16 pairs to 32 KiB of shared memory past the ring, and the
#   thread finishes one 4-value unit a k-tile (4-byte stores) during the
#   next tile, after the k-tile's wgmmas are issued (8 units, so 8 k-tiles).
# - sOLD: HEAD (68ade27).
# Packs (a build configured with -gencode=arch=compute_90a,code=sm_90a):
#   pack.sh sOLD moe_bench moe_ws_gpu_test moe_layer_gpu_test   (at HEAD)
#   git apply docs/perf/session37/deferred-half.patch
#   pack.sh sQ moe_bench moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test moe_graph_gpu_test
#   (set kDeferOn = false) pack.sh sDiet moe_bench moe_ws_gpu_test moe_layer_gpu_test
#   (pack.sh: docs/perf/session33/scripts/pack.sh)
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sDiet sQ
gpu_check_setup kplan-s37 .t_sQ
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|^fused|differ'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
which cuobjdump nvdisasm
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
bf16() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=10 step "bench_$2" 80 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 64,128,1024,2048,4096 --json "$out/bench_$2.json"
}
left 60 && TAIL=30 step ws_test 60 "$bin/moe_ws_gpu_test"
left 60 && LD_LIBRARY_PATH=$PWD/.t_sDiet/lib TAIL=8 step ws_test_diet 60 .t_sDiet/bin/moe_ws_gpu_test \
  --gtest_filter='MoeWsGpuTest.FusedActivation:MoeWsGpuTest.TallTiles:MoeWsGpuTest.PingPongTurns'
left 80 && TAIL=8 step layer_fused 80 "$bin/moe_layer_gpu_test" \
  --gtest_filter='MoeLayerGpu.SmallFusedActivationBitIdentical'
left 80 && bf16 sOLD sOLD
left 80 && bf16 sDiet sDiet
left 80 && bf16 sQ sQ
left 80 && bf16 sQ sQb
left 80 && bf16 sDiet sDietb
left 80 && bf16 sOLD sOLDb
for p in sOLD sDiet sQ; do
  left 30 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=12 step_keep='WsGroupedGemm|gpu__time|tensor_op' \
    step ncu_$p 30 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 .t_$p/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
done
# The epilogue's whole cost: sOLD's GEMMs without it (KPLAN_MOE_WS_DEBUG=1, output unwritten).
left 30 && KPLAN_MOE_WS_DEBUG=1 LD_LIBRARY_PATH=$PWD/.t_sOLD/lib TAIL=12 \
  step_keep='WsGroupedGemm|gpu__time|tensor_op' step ncu_sOLD_nostore 30 ncu --clock-control none \
  --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  -k regex:WsGrouped -c 4 .t_sOLD/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 \
  --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
left 80 && step layer_test 80 "$bin/moe_layer_gpu_test"
left 30 && step graph_test 30 "$bin/moe_graph_gpu_test"
left 30 && step gpu_test 30 "$bin/moe_gpu_test"
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
left 120 && step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
for p in sOLD sQ; do
  left 60 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=6 step ds_$p 60 .t_$p/bin/moe_bench "${B[@]}" \
    --shapes deepseek --tokens 1024,4096 --json "$out/ds_$p.json"
done
gpu_check_finish
