#!/usr/bin/env bash
# Session 46, call 1: session 45's call 4 (the int4 one-token pair forms
# against the tiles), trimmed to one call, and the int4 decode tiles with
# exact integer weights and the group scale applied per step (s46a).
#   s44h (f5d8cc9): the tiles, the head's int4 code
#   s45k / s45l / s45m: int4-pairs-v3 / -v3b / -v4 (docs/perf/session45)
#   s46a (9fcf0ec + the exact int4 decode tiles): KPLAN_DECODE_REF_ROUNDING=1
#     runs the same binary's reference-rounding tiles (the head's), so the
#     decode A/B is one binary.
# Packs: docs/perf/session33/scripts/pack.sh (-gencode=arch=compute_90a,code=sm_90a);
# s46a: moe_bench moe_quant_gpu_test. Device tool: carry ["build-pack"];
# DEADLINE=<limit - 15> OUT=$OUT bash this. Steps in priority order, each
# skipped when its time is not left.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s44h s45k s45l s45m s46a
gpu_check_setup kplan-s46c1 .t_s46a
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|Kernel|Pair|Tile|QuantDecode|gpu__time|dram__|l1tex__|smsp__'
step_drop='check '
F='*MatvecRoute*:*MatvecCombine*:*MatvecTakes*:*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
# Correctness of the two forms that may land: v4 and the exact decode tiles.
for k in s46a s45m; do
  left 60 && LD_LIBRARY_PATH=$PWD/.t_$k/lib TAIL=2 step "quant_$k" 60 ".t_$k/bin/moe_quant_gpu_test" \
    --gtest_filter="$F"
done
# The one-token int4 layers: old, v3, v3b, v4, v4, v3b, v3, old.
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral)
r=0
for k in s44h s45k s45l s45m s45m s45l s45k s44h; do
  r=$((r + 1))
  left 30 && TAIL=3 pack_bench "$k" "ab${r}_$k" 30 "${Q[@]}"
done
# The decode tiles at 16 and 64 tokens: reference rounding (ref) against
# exact weights (new), one binary, ref, new, new, ref.
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes qwen3,mixtral)
r=0
for v in ref new new ref; do
  r=$((r + 1))
  if [ "$v" = ref ]; then
    left 40 && KPLAN_DECODE_REF_ROUNDING=1 TAIL=5 pack_bench s46a "dec${r}_$v" 40 "${D[@]}"
  else
    left 40 && TAIL=5 pack_bench s46a "dec${r}_$v" 40 "${D[@]}"
  fi
done
# ncu of the decode tiles (Mixtral 16 tokens), both forms: issue rate, L1.
nd() {  # name (KPLAN_DECODE_REF_ROUNDING=1 before it: the reference rounding)
  local name=$1
  LD_LIBRARY_PATH=$PWD/.t_s46a/lib TAIL=30 step "ncu_decode_$name" 45 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.per_cycle_active,l1tex__data_pipe_lsu_wavefronts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
    -k regex:'QuantDecode' -c 4 .t_s46a/bin/moe_bench --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 16 --fused on
}
left 50 && KPLAN_DECODE_REF_ROUNDING=1 nd ref
left 50 && nd new
# ncu of Mixtral's one-token int4 kernels: the tiles and v4.
nc() {  # pack
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=30 step "ncu_$1" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.per_cycle_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
    -k regex:'Int4|Pair|Combine|Routing' -c 8 ".t_$1/bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 1 --fused on
}
for k in s44h s45m; do left 45 && nc "$k"; done
for k in s45k s45l; do
  left 60 && LD_LIBRARY_PATH=$PWD/.t_$k/lib TAIL=2 step "quant_$k" 60 ".t_$k/bin/moe_quant_gpu_test" \
    --gtest_filter="$F"
done
left 100 && LD_LIBRARY_PATH=$PWD/.t_s45m/lib TAIL=4 step memcheck_m 100 compute-sanitizer --tool memcheck .t_s45m/bin/moe_quant_gpu_test \
  --gtest_filter='*MatvecRoute*:*MatvecCombine*'
gpu_check_finish
