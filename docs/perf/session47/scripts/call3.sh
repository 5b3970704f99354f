#!/usr/bin/env bash
# A record: its pack s47a (the head with the grid swapped outright) was not kept.
# Session 47, call 3: the int4 / int8 decode tiles with the tiles along
# the grid's x (s47a: the head plus that change) against the head (s46e),
# alternating; the k-split against rows on Qwen3-30B-A3B 16 tokens; where
# Qwen3's 16-token layer spends its time (ncu, every kernel).
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46e s47a
gpu_check_setup kplan-s47c3 .t_s47a
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|Kernel|gpu__time'
step_drop='check |experts .* on the'
left 90 && TAIL=4 step quant_s47a 90 .t_s47a/bin/moe_quant_gpu_test \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
left 60 && TAIL=3 step memcheck_s47a 60 compute-sanitizer --tool memcheck \
  .t_s47a/bin/moe_quant_gpu_test --gtest_filter='*SmallShapes*'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group,int8_group --shapes qwen3,mixtral)
S=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes deepseek)
r=0
for k in s46e s47a s47a s46e; do
  r=$((r + 1))
  left 30 && TAIL=9 pack_bench "$k" "dec${r}_$k" 30 "${D[@]}"
  left 40 && TAIL=3 pack_bench "$k" "ds${r}_$k" 40 "${S[@]}"
done
for m in rows k; do
  left 20 && KPLAN_MOE_QUANT_DECODE_SPLIT=$m TAIL=3 pack_bench s47a "split_$m" 20 --budget_s 0.2 \
    --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64 \
    --quant int4_group --shapes qwen3
done
left 30 && TAIL=40 step_keep='^  [a-zA-Z_].*\(|gpu__time' step ncu_qwen3 30 ncu --clock-control none \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed -c 14 \
  .t_s47a/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
  --quant int4_group --shapes qwen3 --tokens 16 --fused on
gpu_check_finish
