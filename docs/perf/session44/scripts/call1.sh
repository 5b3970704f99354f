#!/usr/bin/env bash
# Session 44, call 1, in run order: the one-token layer in three builds,
# alternating (head s44h; session 43's L2 prefetch s44p, also with
# KPLAN_MOE_DECODE_PREFETCH=0, which leaves its quantisers' early release
# on; the head start s44r: the decode GEMM 2 kernels, bf16 down+combine and
# fp8 pair+combine, issue their first weight loads before their PDL wait),
# the second round in reverse order; s44r's GPU suites after round 1;
# 2338959 (s44o, the commit session 38's table was measured at) against the
# head, alternating; #17's fp8 rows at 16 / 64 tokens under the fused
# quantisation's rule; the coalescing test at session 42's edge seed with
# the single-column check (s44h); s44p's suites.
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
  --decode_layer off --shapes mixtral,qwen3 --tokens 1,16,64,256,1024,4096)
ab() {  # round: the four one-token runs, in the given order
  local r=$1 f
  shift
  for f in "$@"; do
    case $f in
      head) left 40 && TAIL=5 pack_bench s44h "ab${r}_head" 45 "${Q[@]}" ;;
      pf) left 40 && TAIL=5 pack_bench s44p "ab${r}_pf" 45 "${Q[@]}" ;;
      nopf) left 40 && KPLAN_MOE_DECODE_PREFETCH=0 TAIL=5 pack_bench s44p "ab${r}_nopf" 45 "${Q[@]}" ;;
      hs) left 40 && TAIL=5 pack_bench s44r "ab${r}_hs" 45 "${Q[@]}" ;;
    esac
  done
}
F='*Matvec*:*Routing*:*Quantiser*:*DecodeAndDequant*:*SmallShapes*'
ab 1 head pf nopf hs
left 30 && TAIL=3 LD_LIBRARY_PATH=$PWD/.t_s44r/lib step decode_hs 60 \
  .t_s44r/bin/moe_decode_gpu_test
left 30 && TAIL=3 LD_LIBRARY_PATH=$PWD/.t_s44r/lib step quant_hs 90 \
  .t_s44r/bin/moe_quant_gpu_test --gtest_filter="$F"
left 75 && TAIL=13 pack_bench s44o old1 75 "${B[@]}"
left 75 && TAIL=13 pack_bench s44h new1 75 "${B[@]}"
ab 2 hs nopf pf head
left 75 && TAIL=13 pack_bench s44h new2 75 "${B[@]}"
left 75 && TAIL=13 pack_bench s44o old2 75 "${B[@]}"
left 50 && TAIL=9 pack_bench s44h fp8_mid 60 --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 0.5 --check_tokens 1 --route auto --quant fp8_block,fp8_per_tensor \
  --shapes mixtral,qwen3 --tokens 16,64
left 90 && TAIL=30 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 step coalesce_seed42 90 \
  "$bin/moe_coalesce_gpu_test"
gpu_check_setup kplan-s44c1 .t_s44p
left 30 && TAIL=3 step decode_pf 60 "$bin/moe_decode_gpu_test"
left 40 && TAIL=3 step quant_pf 90 "$bin/moe_quant_gpu_test" --gtest_filter="$F"
gpu_check_finish
