#!/usr/bin/env bash
# Session 46, call 4: the int4 matvec with the rule (s46c: the row pairs of
# int4-pairs-v3b where K >= 4096, the tiles below; MoeQuantMatvecInt4Pairs)
# against the tiles (s44h): the suites, then the one-token layers of the
# three shapes alternating old, new, new, old.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46c s44h
gpu_check_setup kplan-s46c4 .t_s46c
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
step_drop='check '
left 45 && TAIL=3 step quant_s46c 45 .t_s46c/bin/moe_quant_gpu_test \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
E=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral,deepseek)
r=0
for k in s44h s46c s46c s44h; do
  r=$((r + 1))
  left 20 && TAIL=4 pack_bench "$k" "one${r}_$k" 20 "${E[@]}"
done
gpu_check_finish
