#!/usr/bin/env bash
# Session 45, call 4 (prepared, not run in session 45): three int4 matvec
# pair forms against the tiles (s44h, f5d8cc9: the same int4 code as the head):
#   s45k (039870f + docs/perf/session45/int4-pairs-v3.patch): PairKernel at 4
#     pairs a warp on one span (call 3's), the combine at 2 pairs on two
#     spans (call 2's);
#   s45l (fec7670 + int4-pairs-v3b.patch): both kernels at 2 pairs on two
#     spans;
#   s45m (039870f + int4-pairs-v4.patch): v3b with GEMM 1's activation row
#     staged in shared memory by each CTA (CTAs within one slot).
# Correctness first (each: the matvec, routes, small- and real-shape int4
# cases), the one-token layers alternating old, v3, v3b, v4, v4, v3b, v3,
# old; ncu of Mixtral-8x7B's int4 kernels in each build (which GEMM moves;
# the L1's load throughput and sectors per request: docs/PERF.md session 45's
# activation reading); memcheck of v4; DeepSeek-V3. About 330 s.
# Packs (docs/perf/session33/scripts/pack.sh, -gencode=arch=compute_90a,code=sm_90a):
#   s44h (f5d8cc9): moe_bench moe_coalesce_gpu_test moe_decode_gpu_test moe_quant_gpu_test
#   s45k, s45l, s45m: moe_bench moe_quant_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s44h s45k s45l s45m
gpu_check_setup kplan-s45c4 .t_s45k
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|Kernel|Pair|Tile|gpu__time|dram__|l1tex__'
step_drop='check '
F='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
for k in s45m s45k s45l; do
  left 60 && LD_LIBRARY_PATH=$PWD/.t_$k/lib TAIL=2 step "quant_$k" 60 ".t_$k/bin/moe_quant_gpu_test" \
    --gtest_filter="$F"
done
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral)
r=0
for k in s44h s45k s45l s45m s45m s45l s45k s44h; do
  r=$((r + 1))
  left 30 && TAIL=3 pack_bench "$k" "ab${r}_$k" 30 "${Q[@]}"
done
nc() {  # pack
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=30 step "ncu_$1" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
    -k regex:'Int4|Pair|Combine|Routing' -c 8 ".t_$1/bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 1 --fused on
}
for k in s44h s45k s45l s45m; do left 45 && nc "$k"; done
# The int4 decode tiles (16-64 tokens) of the head: is the L1 (the
# activation's 16-line loads) or the issue rate their bound? (session 46)
nd() {  # tokens
  LD_LIBRARY_PATH=$PWD/.t_s44h/lib TAIL=30 step "ncu_decode_$1" 45 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.per_cycle_active,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
    -k regex:'QuantDecode' -c 4 .t_s44h/bin/moe_bench --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens "$1" --fused on
}
step_keep="$step_keep|smsp__|wavefronts|QuantDecode"
for t in 16 64; do left 50 && nd "$t"; done
left 100 && LD_LIBRARY_PATH=$PWD/.t_s45m/lib TAIL=4 step memcheck_m 100 compute-sanitizer --tool memcheck .t_s45m/bin/moe_quant_gpu_test \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1,2
  --quant int4_group --shapes deepseek)
for k in s45m s45k s45l s44h; do left 30 && TAIL=3 pack_bench "$k" "ds_$k" 30 "${D[@]}"; done
gpu_check_finish
