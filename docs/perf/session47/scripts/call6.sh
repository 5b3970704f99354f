#!/usr/bin/env bash
# Session 47, call 6: the head (s47c: 1799f5c, the decode tiles' k-split
# rule) through the quantised suites in its own split and forced to rows,
# memcheck; Mixtral-8x7B at 64 tokens (blocks of 16) in four forms of one
# binary (s47x: KPLAN_EXP_DECODE_BLOCK32 takes blocks of 32, KPLAN_DECODE_GRID
# =tiles the tiles along x); the head against s46e at 1 / 16 / 64 tokens.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46e s47c s47x
gpu_check_setup kplan-s47c6 .t_s47c
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
step_drop='check |experts .* on the'
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*MatvecRoute*:*DeepSeekV3*'
left 100 && TAIL=3 step quant_s47c 100 .t_s47c/bin/moe_quant_gpu_test --gtest_filter="$F"
left 100 && KPLAN_MOE_QUANT_DECODE_SPLIT=rows TAIL=3 step quant_rows_s47c 100 \
  .t_s47c/bin/moe_quant_gpu_test --gtest_filter="$F"
left 60 && TAIL=3 step memcheck_s47c 60 compute-sanitizer --tool memcheck \
  .t_s47c/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*'
M=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 64
  --quant int4_group,int8_group --shapes mixtral)
r=0
for v in b16rows b16ktiles b32rows b32k b32k b32rows b16ktiles b16rows; do
  r=$((r + 1))
  (
    case $v in
      b16ktiles) export KPLAN_MOE_QUANT_DECODE_SPLIT=k KPLAN_DECODE_GRID=tiles ;;
      b32rows) export KPLAN_EXP_DECODE_BLOCK32=1 KPLAN_MOE_QUANT_DECODE_SPLIT=rows ;;
      b32k) export KPLAN_EXP_DECODE_BLOCK32=1 KPLAN_MOE_QUANT_DECODE_SPLIT=k ;;
    esac
    left 15 && TAIL=2 pack_bench s47x "m64_${r}_$v" 20 "${M[@]}"
  )
done
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1,16,64
  --quant int4_group,int8_group --shapes qwen3,mixtral)
S=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1,16,64
  --quant int4_group --shapes deepseek)
r=0
for k in s46e s47c s47c s46e; do
  r=$((r + 1))
  left 25 && TAIL=12 pack_bench "$k" "tab${r}_$k" 30 "${D[@]}"
  left 15 && TAIL=3 pack_bench "$k" "ds${r}_$k" 30 "${S[@]}"
done
left 30 && TAIL=30 step_keep='^  [A-Za-z_].*\(|gpu__time|dram__' step ncu_qwen3_16 30 ncu \
  --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  -k regex:'Moe|Quant|Combine|Experts' -c 9 .t_s47c/bin/moe_bench --budget_s 0.01 --sets 1 \
  --warmup_s 0 --check_tokens 0 --quant int4_group --shapes qwen3 --tokens 16 --fused on
gpu_check_finish
