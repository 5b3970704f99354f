#!/usr/bin/env bash
# Session 49, call 5: five CTAs an SM for the int4 blocks-of-8 tiles
# (__launch_bounds__ minimum 5: 96 registers, ptxas spills 68 bytes without
# zero points; pack s49e = 7ce9f8e + docs/perf/session49/min5-ctas.patch)
# against the head (s49h = 7ce9f8e, four CTAs of 124 registers): call 3
# read Qwen3's tiles as latency-bound at 14-15 warps an SM. Suites and
# memcheck on s49e, then int4 at 16 / 64 tokens, h, e, e, h.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s49c5 s49e s49h
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*DeepSeekV3*'
left 100 && TAIL=3 step quant_s49e 100 .t_s49e/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && TAIL=3 step memcheck_s49e 60 compute-sanitizer --tool memcheck \
  .t_s49e/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
r=0
for k in s49h s49e s49e s49h; do
  r=$((r + 1))
  left 25 && TAIL=6 pack_bench "$k" "m5_${r}_$k" 30 "${B[@]}" --quant int4_group \
    --shapes qwen3,mixtral,deepseek --tokens 16,64
done
gpu_check_finish
