#!/usr/bin/env bash
# Session 41, call 3: the fp8 matvec's pair form (KPLAN_MOE_FP8_MATVEC_PAIRS:
# one warp per pair of weight rows, a load 512 contiguous bytes of a row, as
# the bf16 decode kernels read) against the tiles (16 rows a warp, 64 bytes
# of 8 rows a load): moe_quant_gpu_test (MatvecFp8PairForm forces it on),
# then one-token fp8 layers A/B, alternating; ncu of both forms' GEMMs.
# Pack sP: docs/perf/session33/scripts/pack.sh sP moe_quant_gpu_test moe_bench.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sP
gpu_check_setup kplan-s41c3 .t_sP
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
left 100 && TAIL=4 step quant_pairs 100 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*PairForm*:*MatvecRoute*'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
i=0
for r in 0 1 0 1; do
  i=$((i + 1))
  left 45 && KPLAN_MOE_FP8_MATVEC_PAIRS=$r TAIL=6 pack_bench sP "mq${i}_pairs$r" 45 "${Q[@]}" \
    --quant fp8_block,fp8_per_tensor --shapes mixtral,qwen3 --tokens 1
done
for r in 1 0; do
  left 60 && KPLAN_MOE_FP8_MATVEC_PAIRS=$r TAIL=4 pack_bench sP "ds_pairs$r" 60 "${Q[@]}" \
    --quant fp8_block --shapes deepseek --tokens 1,2
done
for r in 0 1; do
  left 40 && KPLAN_MOE_FP8_MATVEC_PAIRS=$r TAIL=0 step "ncu_pairs$r" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:'^(?!nvjet|Copy|Fill)' -c 40 \
    "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
    --quant fp8_block --shapes mixtral --tokens 1 --fused on
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,60)}
    /gpu__time_duration|dram__bytes_read/ {printf "%-60s %-26s %10s %s\n", n, $1, $NF, $(NF-1)}' \
    "$out/ncu_pairs$r.log" | tail -14
done
left 100 && TAIL=3 step quant_all 100 "$bin/moe_quant_gpu_test"
gpu_check_finish
