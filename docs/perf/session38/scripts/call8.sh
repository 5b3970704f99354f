#!/usr/bin/env bash
# Session 38, call 8: the split form of bf16 int4 groups whose scale is not
# exact in bf16 (IntGroupDequant's kSplitForm, the decode tiles and the int4
# matvec): the quantised suite, then int4 rows with arbitrary fp32 scales
# (int4_group/fp32s, the case it is for) and with exact ones (int4_group,
# unchanged: a check that they did not move), sT (the head) against sS.
# Pack: docs/perf/session33/scripts/pack.sh sS moe_bench moe_quant_gpu_test
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sT sS
gpu_check_setup kplan-s38c8 .t_sS
step_keep='FAIL|PASSED|ERROR SUMMARY|^(Mixtral|Qwen3|DeepSeek)|int4_group g128 /'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
q() {  # pack, quant, log name
  TAIL=9 pack_bench "$1" "$3" 60 "${B[@]}" --quant "$2" --shapes qwen3,mixtral,deepseek \
    --tokens 1,16,64
}
left 110 && TAIL=20 step quant_test 110 "$bin/moe_quant_gpu_test"
left 30 && q sT int4_group/fp32s f32s_sT
left 30 && q sS int4_group/fp32s f32s_sS
left 30 && q sS int4_group int4_sS
left 30 && q sT int4_group int4_sT
left 30 && q sS int4_group/fp32s f32s_sS2
left 30 && q sT int4_group/fp32s f32s_sT2
gpu_check_finish
