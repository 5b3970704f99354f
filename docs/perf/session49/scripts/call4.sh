#!/usr/bin/env bash
# Session 49, call 4: k-split CTAs of 8 warps (two row groups of 4 warps on
# the same k steps, so that the second group's activation loads can hit L1;
# KPLAN_EXP_DECODE_W8=1, int4 blocks of 8 without zero points; pack s49d =
# 6e1f343 + docs/perf/session49/w8-knob.patch) against today's 4-warp CTAs.
# Suites and memcheck with the knob on, then int4 at 16 / 64 tokens, knob
# off / on / on / off.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s49c4 s49d
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*DeepSeekV3*'
left 100 && KPLAN_EXP_DECODE_W8=1 TAIL=3 step quant_w8 100 \
  .t_s49d/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && KPLAN_EXP_DECODE_W8=1 TAIL=3 step memcheck_w8 60 compute-sanitizer --tool memcheck \
  .t_s49d/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
r=0
for w in 0 1 1 0; do
  r=$((r + 1))
  if [ "$w" = 1 ]; then export KPLAN_EXP_DECODE_W8=1; else unset KPLAN_EXP_DECODE_W8; fi
  left 25 && TAIL=6 pack_bench s49d "w8_${r}_$w" 30 "${B[@]}" --quant int4_group \
    --shapes qwen3,mixtral,deepseek --tokens 16,64
done
gpu_check_finish
