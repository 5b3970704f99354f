#!/usr/bin/env bash
# Prepared in session 46 for the next session's first device call: the
# head's quantised suites with the review's new int4 pair cases (MatvecRoute:
# pairs-int4, pairs-g96-int4; the launcher's refusal), memcheck on them, and
# the one-token int4 layers of the head (s46e; its REV names the commit) against the
# tiles (s44h), alternating.
# Packs: s46e (the head after session 46: moe_bench moe_quant_gpu_test), s44h.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46e s44h
gpu_check_setup kplan-s47c1 .t_s46e
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|int4'
step_drop='check '
left 90 && TAIL=6 step quant_s46e 90 .t_s46e/bin/moe_quant_gpu_test \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:MoeQuantKernels.*'
left 60 && TAIL=3 step memcheck_s46e 60 compute-sanitizer --tool memcheck .t_s46e/bin/moe_quant_gpu_test \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*'
E=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral,deepseek)
r=0
for k in s44h s46e s46e s44h; do
  r=$((r + 1))
  left 20 && TAIL=4 pack_bench "$k" "one${r}_$k" 20 "${E[@]}"
done
gpu_check_finish
