#!/usr/bin/env bash
# Session 38, call 2: int4 group scales applied after the MMA (SumThenScale,
# the int4 matvec and decode tiles at groups of 128 k or a multiple) against
# the head's kernels.
# - sQ: the change (moe_bench, moe_quant_gpu_test, moe_decode_gpu_test).
# - sH: 55af878 (its quantised kernels are the head's; from session 37).
# Steps: the quantised suite and memcheck of the matvec and tails cases on
# sQ, then moe_bench int4 rows (group scales exact in bf16, then arbitrary
# fp32 ones: /fp32s) sH, sQ, sQ, sH; every row checked against the CPU
# reference before it is timed.
# Packs (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh sQ moe_bench moe_quant_gpu_test moe_decode_gpu_test
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sH sQ
gpu_check_setup kplan-s38c2 .t_sQ
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|rel='
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
int4() {  # pack, log name
  TAIL=12 pack_bench "$1" "int_$2" 90 "${B[@]}" --quant int4_group \
    --shapes qwen3,mixtral,deepseek --tokens 1,2,16,64
}
f32s() {  # pack, log name
  TAIL=6 pack_bench "$1" "f32s_$2" 60 "${B[@]}" --quant int4_group/fp32s \
    --shapes qwen3,mixtral --tokens 1,16,64
}
left 150 && TAIL=40 step quant_test 150 "$bin/moe_quant_gpu_test"
left 60 && int4 sH sH
left 60 && int4 sQ sQ
left 40 && f32s sH sH
left 40 && f32s sQ sQ
left 60 && int4 sQ sQ2
left 60 && int4 sH sH2
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_quant_gpu_test" --gtest_filter='MoeQuantGpu.MatvecRoute:MoeQuantGpu.SmallShapesTails'
left 40 && step decode_test 40 "$bin/moe_decode_gpu_test"
gpu_check_finish
