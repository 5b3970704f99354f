#!/usr/bin/env bash
# Prepared in session 38 for the next device call (not run): the split scale
# for bf16 int4 groups whose scale is not exact in bf16, with the split
# operands set up only in the branch that uses them
# (docs/perf/session38/int4-split-scale-lazy.patch; the eager form,
# int4-split-scale.patch, measured in call 8: 1.14-1.30x with fp32 scales,
# 0.6-4.6% slower with exact ones). ptxas (CUDA 13): the bf16 int4 decode
# tiles spill 24 bytes at 8-slot tiles (0 at the head) and 32 at 16-slot
# tiles (8); the int4 matvec 104 registers (96), no spill.
# Packs (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh sN moe_bench moe_quant_gpu_test moe_decode_gpu_test
#     (sN: the head when packed)
#   git apply docs/perf/session38/int4-split-scale-lazy.patch
#   docs/perf/session33/scripts/pack.sh sL moe_bench moe_quant_gpu_test moe_decode_gpu_test
#   git checkout kernels
# Device tool: carry ["build-pack"]. Land it only if the exact-scale rows
# (int4_group) do not move and the fp32s rows gain as in call 8.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN sL
gpu_check_setup kplan-next .t_sL
step_keep='FAIL|PASSED|ERROR SUMMARY|^(Mixtral|Qwen3|DeepSeek)|int4_group g128 /'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
q() {  # pack, quant, log name
  TAIL=9 pack_bench "$1" "$3" 60 "${B[@]}" --quant "$2" --shapes qwen3,mixtral,deepseek \
    --tokens 1,16,64
}
left 110 && TAIL=20 step quant_test 110 "$bin/moe_quant_gpu_test"
for r in 1 2; do
  left 30 && q sN int4_group "int4_sN$r"
  left 30 && q sL int4_group "int4_sL$r"
  left 30 && q sL int4_group/fp32s "f32s_sL$r"
  left 30 && q sN int4_group/fp32s "f32s_sN$r"
done
left 30 && TAIL=3 step decode_test 30 "$bin/moe_decode_gpu_test"
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_quant_gpu_test" --gtest_filter='MoeQuantGpu.MatvecRoute:MoeQuantGpu.SmallShapesTails'
gpu_check_finish
