#!/usr/bin/env bash
# Session 49, call 1: the int decode tiles' per-step bookkeeping cut (s49a:
# 32-bit k arithmetic, one ring base and rolling stage indices, scale rows
# as pointers, unconditional activation loads from a zero row past K)
# against the head s48z (= e430f86's kernels). SASS of both
# (build-pack/sass/{head,new}.cubin, built with -gencode
# arch=compute_90a,code=sm_90a from the same sources); suites and memcheck
# on s49a; moe_bench int4 (three shapes) and int8 (two) at 16 / 64 tokens,
# order z, a, a, z.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s49c1 s49a s48z
mkdir -p "$out/sass"
for f in head new; do
  cuobjdump -sass build-pack/sass/$f.cubin | gzip >"$out/sass/$f.sass.gz"
done
ls -la "$out/sass"
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*MatvecRoute*:*DeepSeekV3*'
left 100 && TAIL=3 step quant_s49a 100 .t_s49a/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && TAIL=3 step memcheck_s49a 60 compute-sanitizer --tool memcheck \
  .t_s49a/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64)
r=0
for k in s48z s49a s49a s48z; do
  r=$((r + 1))
  left 25 && TAIL=6 pack_bench "$k" "i4_${r}_$k" 30 "${B[@]}" --quant int4_group \
    --shapes qwen3,mixtral,deepseek
  left 20 && TAIL=4 pack_bench "$k" "i8_${r}_$k" 25 "${B[@]}" --quant int8_group \
    --shapes qwen3,mixtral
done
gpu_check_finish
