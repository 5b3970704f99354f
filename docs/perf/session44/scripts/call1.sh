#!/usr/bin/env bash
# Session 44, call 1: the coalescing test at session 42's edge seed with the
# single-column check (s44h); the decode-prefetch patch's one-token A/B
# (head s44h, patch s44p, s44p with KPLAN_MOE_DECODE_PREFETCH=0); 2338959
# (s44o, session 38's table) against the head on one machine, alternating;
# #17's fp8 rows at 16 / 64 tokens under the fused quantisation's rule;
# the decode suites at s44p and s44r. s44r: the decode GEMM 2 kernels (bf16
# down+combine, fp8 pair+combine) issue their first batch of weight loads
# before their PDL wait.
# Packs (docs/perf/session33/scripts/pack.sh, -gencode=arch=compute_90a,code=sm_90a):
#   s44h (f5d8cc9): moe_bench moe_coalesce_gpu_test moe_decode_gpu_test moe_quant_gpu_test
#   s44p (f5d8cc9 + docs/perf/session43/decode-prefetch.patch): moe_bench
#     moe_decode_gpu_test moe_quant_gpu_test
#   s44o (2338959, from a worktree): moe_bench
#   s44r (1b287cc + docs/perf/session44/decode-head-start.patch as of bad83b6): moe_bench
#     moe_decode_gpu_test moe_quant_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s44h s44p s44o s44r
gpu_check_setup kplan-s44c1 .t_s44h
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|flips|per token|slot|explains|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|differ'
step_drop='check '
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --decode_layer off --quant bf16,fp8_block --shapes qwen3,mixtral)
B=(--budget_s 0.2 --sets 2 --warmup_s 1 --check_tokens 2 --route auto --fused on --quant bf16
  --decode_layer off --shapes mixtral,qwen3 --tokens 1,256,1024,4096)
for r in 1 2; do
  left 40 && TAIL=5 pack_bench s44h "ab${r}_head" 45 "${Q[@]}"
  left 40 && TAIL=5 pack_bench s44p "ab${r}_pf" 45 "${Q[@]}"
  left 40 && KPLAN_MOE_DECODE_PREFETCH=0 TAIL=5 pack_bench s44p "ab${r}_nopf" 45 "${Q[@]}"
  left 40 && TAIL=5 pack_bench s44r "ab${r}_hs" 45 "${Q[@]}"
  if [ "$r" = 1 ]; then
    left 30 && TAIL=3 LD_LIBRARY_PATH=$PWD/.t_s44r/lib step decode_hs 60 \
      .t_s44r/bin/moe_decode_gpu_test
    left 30 && TAIL=3 LD_LIBRARY_PATH=$PWD/.t_s44r/lib step quant_matvec_hs 90 \
      .t_s44r/bin/moe_quant_gpu_test --gtest_filter='*Matvec*:*Routing*:*Quantiser*'
  fi
  left 60 && TAIL=9 pack_bench s44o "old${r}" 60 "${B[@]}"
  left 60 && TAIL=9 pack_bench s44h "new${r}" 60 "${B[@]}"
done
left 50 && TAIL=9 pack_bench s44h fp8_mid 60 --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 0.5 --check_tokens 1 --route auto --quant fp8_block,fp8_per_tensor \
  --shapes mixtral,qwen3 --tokens 16,64
left 90 && TAIL=30 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 step coalesce_seed42 90 \
  "$bin/moe_coalesce_gpu_test"
gpu_check_setup kplan-s44c1 .t_s44p
left 30 && TAIL=3 step decode_pf 60 "$bin/moe_decode_gpu_test"
left 40 && TAIL=3 step quant_matvec_pf 90 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*Matvec*:*Routing*:*Quantiser*'
gpu_check_finish
