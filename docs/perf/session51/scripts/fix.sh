#!/usr/bin/env bash
# Session 51 call 3: the one-token fp8 per-token fix (the matvec combine's
# activation and scales loaded coherently, LoadProduced in pdl.cuh) on the
# GPU: the graph test with its new per-token case, the quant suite (the
# matvec kernels changed), the one-token fp8 rows of #17's table with PDL
# on, and the combine kernel's SASS before (s51d) and after (s51e): where
# its activation-scale loads sit against the PDL wait.
# Packs: docs/perf/session33/scripts/pack.sh s51d moe_bench (the head, plus
# KPLAN_PDL); s51e moe_bench moe_graph_gpu_test moe_quant_gpu_test (the fix).
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s51 s51e s51d
keep_suite='FAIL|PASSED|ERROR SUMMARY|tests ran'
TAIL=6 step_keep=$keep_suite step graph 120 "$bin/moe_graph_gpu_test"
TAIL=6 step_keep=$keep_suite step quant_small 60 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*:*Matvec*'
TAIL=12 step fp8_one 150 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 \
  --check_tokens 1 --route auto --quant fp8_per_tensor,fp8_per_channel \
  --shapes mixtral,qwen3,deepseek --tokens 1 --json "$out/fp8_one.json"
mkdir -p "$out/sass"
for p in s51d s51e; do
  cuobjdump -sass ".t_$p/bin/moe_bench" |
    awk '/Function :/ {keep = /PairCombineKernel/} keep' | gzip >"$out/sass/combine_$p.sass.gz"
done
ls -la "$out/sass"
left 150 && TAIL=6 step_keep=$keep_suite step quant 150 "$bin/moe_quant_gpu_test" \
  --gtest_filter=-'*SmallShapes*:*DecodeAndDequant*:*Matvec*'
gpu_check_finish
