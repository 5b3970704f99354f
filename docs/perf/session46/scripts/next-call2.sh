#!/usr/bin/env bash
# Prepared in session 46: the int4 decode tiles (16-64 tokens) with fewer
# CTAs an SM and two accumulator chains. Packs (build-pack, built from
# 572317e + the patch):
#   s46e  the head (no patch)
#   s46g  docs/perf/session46/decode-3ctas.patch: register bounds of 3 CTAs
#         an SM for 8-slot tiles and 2 for 16 (was int4 4 / 3)
#   s46f  docs/perf/session46/decode-two-chains-3ctas.patch: the same bounds
#         and odd mma k16 steps into a second accumulator (chains of 4; no
#         spills for int4 at 8 and 16 slots)
# The decode suites for s46f and s46g, then the layers at 16 and 64 tokens
# alternating e, g, f, f, g, e; ncu of Mixtral 16 tokens in each.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s46e s46f s46g
gpu_check_setup kplan-s47c2 .t_s46f
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^ *(Mixtral|Qwen3)|QuantDecode|gpu__time|dram__|smsp__'
step_drop='check '
for k in s46f s46g; do
  left 60 && LD_LIBRARY_PATH=$PWD/.t_$k/lib TAIL=3 step "quant_$k" 60 ".t_$k/bin/moe_quant_gpu_test" \
    --gtest_filter='*SmallShapes*:*DecodeAndDequant*:*Qwen3IntWeightOnly*:*Mixtral8x7B*'
done
D=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 16,64
  --quant int4_group,int8_group --shapes qwen3,mixtral)
r=0
for k in s46e s46g s46f s46f s46g s46e; do
  r=$((r + 1))
  left 30 && TAIL=9 pack_bench "$k" "dec${r}_$k" 30 "${D[@]}"
done
for k in s46e s46g s46f; do
  left 30 && LD_LIBRARY_PATH=$PWD/.t_$k/lib TAIL=12 step "ncu_$k" 30 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.per_cycle_active \
    -k regex:'QuantDecode' -c 2 ".t_$k/bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant int4_group --shapes mixtral --tokens 16 --fused on
done
gpu_check_finish
