#!/usr/bin/env bash
# Session 49, call 2 (pack s49c = s49a + two experiment knobs, neither on by
# default): KPLAN_EXP_DECODE_CHUNKS=2 gives the int4 blocks-of-8 tiles 32
# bytes of each row a thread and a step (kChunks = 2: the per-step
# bookkeeping paid per 256 weights, 3 CTAs an SM); KPLAN_EXP_DECODE_BLOCK=B
# forces blocks of B slots (24: a new NT=3 instance) where an expert
# averages 5-20 slots. Suites and memcheck with both knobs on (the decode
# cases then run kChunks = 2 and NT = 3), then chunks 1 / 2 / 2 / 1 on int4
# at 16 / 64 tokens, then blocks 16 / 24 / 32 / 24 on int4 Mixtral-8x7B
# 48 / 64 / 80 tokens and Qwen3-30B-A3B 192 / 256.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s49c2 s49c
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*DeepSeekV3*'
left 100 && KPLAN_EXP_DECODE_BLOCK=24 KPLAN_EXP_DECODE_CHUNKS=2 TAIL=3 step quant_knobs 100 \
  .t_s49c/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && KPLAN_EXP_DECODE_BLOCK=24 KPLAN_EXP_DECODE_CHUNKS=2 TAIL=3 step memcheck_knobs 60 \
  compute-sanitizer --tool memcheck .t_s49c/bin/moe_quant_gpu_test \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
r=0
for ch in 1 2 2 1; do
  r=$((r + 1))
  left 25 && KPLAN_EXP_DECODE_CHUNKS=$ch TAIL=6 pack_bench s49c "ch_${r}_c$ch" 30 "${B[@]}" \
    --quant int4_group --shapes qwen3,mixtral,deepseek --tokens 16,64
done
r=0
for b in 16 24 32 24; do
  r=$((r + 1))
  left 25 && KPLAN_EXP_DECODE_BLOCK=$b TAIL=6 pack_bench s49c "mx_${r}_b$b" 30 "${B[@]}" \
    --quant int4_group --shapes mixtral --tokens 48,64,80
  left 20 && KPLAN_EXP_DECODE_BLOCK=$b TAIL=4 pack_bench s49c "qw_${r}_b$b" 25 "${B[@]}" \
    --quant int4_group --shapes qwen3 --tokens 192,256
done
gpu_check_finish
