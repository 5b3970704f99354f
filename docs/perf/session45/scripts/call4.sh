#!/usr/bin/env bash
# Session 45, call 4: the int4 matvec pairs with PairKernel at 4 pairs a warp
# on one span (call 3's) and the combine at 2 pairs on two spans (call 2's)
# (s45k: 8b92993 + docs/perf/session45/int4-pairs-v3.patch) against the tiles (s44h, f5d8cc9: the same int4
# code as 8b92993). Correctness first, the one-token layers alternating old,
# new, new, old; ncu of Mixtral-8x7B's int4 GEMM kernels in both; DeepSeek-V3.
# Packs (docs/perf/session33/scripts/pack.sh, -gencode=arch=compute_90a,code=sm_90a):
#   s44h (f5d8cc9): moe_bench moe_coalesce_gpu_test moe_decode_gpu_test moe_quant_gpu_test
#   s45k (8b92993 + int4-pairs-v3.patch): moe_bench moe_quant_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s44h s45k
gpu_check_setup kplan-s45c4 .t_s45k
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|OK$|Kernel|Pair|Tile|gpu__time|dram__'
step_drop='check '
F='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
left 60 && TAIL=3 step quant_k 60 "$bin/moe_quant_gpu_test" --gtest_filter="$F"
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral)
left 30 && TAIL=3 pack_bench s44h old1 30 "${Q[@]}"
left 30 && TAIL=3 pack_bench s45k new1 30 "${Q[@]}"
left 30 && TAIL=3 pack_bench s45k new2 30 "${Q[@]}"
left 30 && TAIL=3 pack_bench s44h old2 30 "${Q[@]}"
nc() {  # pack
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=16 step "ncu_$1" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    -k regex:'Int4|Pair|Combine|Routing' -c 8 ".t_$1/bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 1 --fused on
}
left 45 && nc s44h
left 45 && nc s45k
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1,2
  --quant int4_group --shapes deepseek)
left 30 && TAIL=3 pack_bench s45k ds_new 30 "${D[@]}"
gpu_check_finish
