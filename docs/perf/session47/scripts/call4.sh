#!/usr/bin/env bash
# Session 47, call 4: the decode tiles' k-split form (KPLAN_MOE_QUANT_DECODE_SPLIT=k:
# a CTA's 4 warps on 32 rows, 256 contiguous bytes of each row a round) against
# the rule's choice (rows on these sizes), head binaries (s46e), alternating.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46e
gpu_check_setup kplan-s47c4 .t_s46e
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
step_drop='check |experts .* on the'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group,int8_group --shapes qwen3,mixtral)
S=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes deepseek)
r=0
for m in auto k k auto; do
  r=$((r + 1))
  export KPLAN_MOE_QUANT_DECODE_SPLIT=$m
  left 30 && TAIL=9 pack_bench s46e "dec${r}_$m" 30 "${D[@]}"
  left 40 && TAIL=3 pack_bench s46e "ds${r}_$m" 40 "${S[@]}"
done
unset KPLAN_MOE_QUANT_DECODE_SPLIT
gpu_check_finish
