#!/usr/bin/env bash
# Session 48, call 4: the int decode tiles without zero-point work where the
# weights have none (s48z: QuantDecodeKernel's kZp template flag) against
# the head s47c. Suites (their zero-point and plain int cases) and memcheck
# of the small shapes on s48z; then int4 on the three shapes and int8 on
# Qwen3 / Mixtral at 16 / 64 tokens (moe_bench's int weights have no zero
# points), s47c, s48z, s48z, s47c.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s48c4 s48z s47c
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*MatvecRoute*:*DeepSeekV3*'
left 100 && TAIL=3 step quant_s48z 100 .t_s48z/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && TAIL=3 step memcheck_s48z 60 compute-sanitizer --tool memcheck \
  .t_s48z/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64)
r=0
for k in s47c s48z s48z s47c; do
  r=$((r + 1))
  left 25 && TAIL=6 pack_bench "$k" "i4_${r}_$k" 30 "${B[@]}" --quant int4_group \
    --shapes qwen3,mixtral,deepseek
  left 20 && TAIL=4 pack_bench "$k" "i8_${r}_$k" 25 "${B[@]}" --quant int8_group \
    --shapes qwen3,mixtral
done
gpu_check_finish
