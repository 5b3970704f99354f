#!/usr/bin/env bash
# Session 48, call 1: the decode tiles' chain (s48a: a CTA takes
# KPLAN_EXP_DECODE_CHAIN units in turn, one cp.async ring through all of
# them; 1 is today's grid) against the head s47c. Suites with chains of 1
# and 3 (a partial last chain), in both split modes at 2, memcheck at 3;
# then int4 on the three shapes at 16 / 64 tokens: s47c, 1, 2, 4, 4, 2, 1,
# s47c; ncu of Qwen3-30B-A3B 16 tokens at 1, 2, 4. Then, as time
# allows, session 47's next-call1 (pack s47x) without DeepSeek-V3: blocks
# of 16 against 32 where the rule gives 16.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s48c1 s48a s47c s47x
F='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*:*MatvecRoute*:*DeepSeekV3*'
for v in 3 1 2rows 2k; do
  (
    export KPLAN_EXP_DECODE_CHAIN=${v%%[a-z]*}
    case $v in
      2rows) export KPLAN_MOE_QUANT_DECODE_SPLIT=rows ;;
      2k) export KPLAN_MOE_QUANT_DECODE_SPLIT=k ;;
    esac
    left 100 && TAIL=3 step "quant_c$v" 100 .t_s48a/bin/moe_quant_gpu_test --gtest_filter="$F"
    exit "$status"
  ) || status=1
done
left 60 && KPLAN_EXP_DECODE_CHAIN=3 TAIL=3 step memcheck_c3 60 compute-sanitizer --tool memcheck \
  .t_s48a/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes qwen3,mixtral,deepseek)
r=0
for v in s47c 1 2 4 4 2 1 s47c; do
  r=$((r + 1))
  if [ "$v" = s47c ]; then
    left 30 && TAIL=6 pack_bench s47c "b${r}_s47c" 30 "${B[@]}"
  else
    left 30 && KPLAN_EXP_DECODE_CHAIN=$v TAIL=6 pack_bench s48a "b${r}_c$v" 30 "${B[@]}"
  fi
done
for v in 1 2 4; do
  left 30 && KPLAN_EXP_DECODE_CHAIN=$v TAIL=30 step_keep='^  [A-Za-z_].*\(|gpu__time|dram__' \
    step "ncu_qwen3_16_c$v" 30 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    -k regex:'Moe|Quant|Combine|Experts' -c 9 .t_s48a/bin/moe_bench --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes qwen3 --tokens 16 --fused on
done
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
r=0
for b in 16 32 32 16; do
  r=$((r + 1))
  if [ "$b" = 32 ]; then export KPLAN_EXP_DECODE_BLOCK32=1; else unset KPLAN_EXP_DECODE_BLOCK32; fi
  left 30 && TAIL=6 pack_bench s47x "mix${r}_b$b" 30 "${B[@]}" --tokens 48,56,64 \
    --quant int4_group,int8_group --shapes mixtral
  left 30 && TAIL=6 pack_bench s47x "qw${r}_b$b" 30 "${B[@]}" --tokens 128,192,256 \
    --quant int4_group,int8_group --shapes qwen3
done
unset KPLAN_EXP_DECODE_BLOCK32
gpu_check_finish
