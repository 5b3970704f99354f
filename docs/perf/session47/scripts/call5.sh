#!/usr/bin/env bash
# A record: its pack s47b is 1799f5c plus ../ksplit-min-row-knob.patch (not kept).
# Session 47, call 5: the decode tiles' k-split rule (MoeQuantDecodeKSplit:
# blocks of 8 whose weight rows hold >= N bytes) at N = 1024 (s47b's
# default), 2048, 0 and never (the head's rule), one binary (s47b,
# KPLAN_EXP_KSPLIT_MIN_ROW), alternating; the quantised decode suites first.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s47b
gpu_check_setup kplan-s47c5 .t_s47b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
step_drop='check |experts .* on the'
left 90 && TAIL=4 step quant_s47b 90 .t_s47b/bin/moe_quant_gpu_test \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group,int8_group --shapes qwen3,mixtral)
S=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes deepseek)
r=0
for m in 1024 2048 0 1099511627776 1099511627776 0 2048 1024; do
  r=$((r + 1))
  export KPLAN_EXP_KSPLIT_MIN_ROW=$m
  left 25 && TAIL=9 pack_bench s47b "dec${r}_$m" 30 "${D[@]}"
  left 20 && TAIL=3 pack_bench s47b "ds${r}_$m" 40 "${S[@]}"
done
gpu_check_finish
