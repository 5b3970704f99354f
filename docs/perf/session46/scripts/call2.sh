#!/usr/bin/env bash
# Session 46, call 2: the int4 decode tiles' grid with the tiles fastest
# (s46b: ce99280 + the grid order; KPLAN_DECODE_GRID=rows gives the head's
# order, row groups fastest, in the same binary), so that the tiles of one
# expert (an expert with more slots than a tile holds) read its weights
# side by side and the second read can hit the L2. Also v3b (s45l) against
# the tiles (s44h) at one token once more, with DeepSeek-V3.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46b s45l s44h
gpu_check_setup kplan-s46c2 .t_s46b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|QuantDecode|gpu__time|dram__'
step_drop='check '
left 60 && TAIL=3 step quant_s46b 60 .t_s46b/bin/moe_quant_gpu_test \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group --shapes qwen3,mixtral)
r=0
for v in rows tiles tiles rows; do
  r=$((r + 1))
  if [ "$v" = rows ]; then
    left 35 && KPLAN_DECODE_GRID=rows TAIL=5 pack_bench s46b "dec${r}_$v" 35 "${D[@]}"
  else
    left 35 && TAIL=5 pack_bench s46b "dec${r}_$v" 35 "${D[@]}"
  fi
done
left 40 && TAIL=12 step ncu_tiles 40 ncu --clock-control none \
  --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
  -k regex:'QuantDecode' -c 4 .t_s46b/bin/moe_bench --budget_s 0.01 --sets 1 \
  --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 16 --fused on
E=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --quant int4_group --shapes qwen3,mixtral,deepseek)
r=0
for k in s44h s45l s45l s44h; do
  r=$((r + 1))
  left 40 && TAIL=4 pack_bench "$k" "one${r}_$k" 40 "${E[@]}"
done
gpu_check_finish
