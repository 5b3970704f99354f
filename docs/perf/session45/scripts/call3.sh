#!/usr/bin/env bash
# Session 45, call 3: the int4 matvec as row pairs, four pairs a warp on one
# span (s45j: the working tree at 8b92993 + the int4 pair kernels, GEMM 2 with
# the combine; call 2 ran one pair a warp on two spans, s45i) against the
# tiles (s44h, f5d8cc9: the same int4 code as 8b92993). Correctness first
# (s45j's matvec, routes, small-shape and real-shape int4 cases; memcheck of
# the matvec cases), then the one-token layers alternating old, new, new,
# old; then DeepSeek-V3 once each where time is left.
# Packs (docs/perf/session33/scripts/pack.sh, -gencode=arch=compute_90a,code=sm_90a):
#   s44h (f5d8cc9): moe_bench moe_coalesce_gpu_test moe_decode_gpu_test moe_quant_gpu_test
#   s45j (8b92993 + changes): moe_bench moe_quant_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s44h s45j
gpu_check_setup kplan-s45c3 .t_s45j
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|OK$'
step_drop='check '
F='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
left 150 && TAIL=6 step quant_i 150 "$bin/moe_quant_gpu_test" --gtest_filter="$F"
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group,fp8_block --shapes qwen3,mixtral)
left 40 && TAIL=6 pack_bench s44h old1 45 "${Q[@]}"
left 40 && TAIL=6 pack_bench s45j new1 45 "${Q[@]}"
left 40 && TAIL=6 pack_bench s45j new2 45 "${Q[@]}"
left 40 && TAIL=6 pack_bench s44h old2 45 "${Q[@]}"
left 100 && TAIL=4 step memcheck_i 100 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1,2
  --quant int4_group --shapes deepseek)
left 80 && TAIL=4 pack_bench s45j ds_new 80 "${D[@]}"
left 80 && TAIL=4 pack_bench s44h ds_old 80 "${D[@]}"
gpu_check_finish
