#!/usr/bin/env bash
# Session 38, call 6: the ring at three stages, and with them the fused GEMM
# 1's whole activation deferred to the next tile.
# - sT: the head's kernels (2338959; 8ea4154 is device-identical).
# - s3: docs/perf/session38/three-stages.patch (kWsStages 3, every ws kernel).
# - s3d: docs/perf/session38/three-stages-defer-all.patch (kWsStages 3 and
#   kDeferChunks 4: the fused GEMM 1 parks all four chunks, 64 KiB, and
#   finishes one 4-value unit a k-tile of the next tile).
# Packs: docs/perf/session33/scripts/pack.sh s3 / s3d moe_bench moe_ws_gpu_test
# moe_layer_gpu_test (each patch applied alone); sT from call4.sh.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sT s3 s3d
gpu_check_setup kplan-s38c6 .t_s3d
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3)|differ|Failure'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  TAIL=9 pack_bench "$1" "bench_$2" 60 "${B[@]}" --shapes mixtral,qwen3 --tokens 256,1024,2048,4096
}
left 60 && TAIL=4 step ws_test 60 "$bin/moe_ws_gpu_test"
left 90 && TAIL=4 step layer_test 90 "$bin/moe_layer_gpu_test" \
  --gtest_filter='MoeLayerGpu.SmallFusedActivationBitIdentical:MoeLayerGpu.SwitchedFormsBitIdentical'
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
left 60 && LD_LIBRARY_PATH=$PWD/.t_s3/lib TAIL=4 step ws_test_s3 60 .t_s3/bin/moe_ws_gpu_test
left 40 && rows sT sT
left 40 && rows s3 s3
left 40 && rows s3d s3d
left 40 && rows s3d s3db
left 40 && rows s3 s3b
left 40 && rows sT sTb
for p in sT s3 s3d; do
  left 25 && ws_ncu "$p"
done
gpu_check_finish
