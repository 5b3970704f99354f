#!/usr/bin/env bash
# Session 41, call 3: the fp8 matvec's pair form (KPLAN_MOE_FP8_MATVEC_PAIRS:
# one warp per pair of weight rows, a load 512 contiguous bytes of a row, as
# the bf16 decode kernels read) against the tiles (16 rows a warp, 64 bytes
# of 8 rows a load), with and without GEMM 2 taking the combine
# (KPLAN_MOE_FP8_MATVEC_COMBINE): moe_quant_gpu_test (MatvecFp8PairForm
# forces the pairs on), then one-token fp8 layers, the three forms in turn;
# ncu of the tiles' and the pairs' kernels.
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
# v: tiles (t), pairs with a separate combine (p), pairs with GEMM 2's combine (c).
run_v() {  # v command...
  case $1 in
    t) export KPLAN_MOE_FP8_MATVEC_PAIRS=0 ;;
    p) export KPLAN_MOE_FP8_MATVEC_PAIRS=1 KPLAN_MOE_FP8_MATVEC_COMBINE=0 ;;
    c) export KPLAN_MOE_FP8_MATVEC_PAIRS=1 KPLAN_MOE_FP8_MATVEC_COMBINE=1 ;;
  esac
  shift
  "$@"
  unset KPLAN_MOE_FP8_MATVEC_PAIRS KPLAN_MOE_FP8_MATVEC_COMBINE
}
i=0
for v in t p c t p c; do
  i=$((i + 1))
  left 45 && TAIL=6 run_v $v pack_bench sP "mq${i}_$v" 45 "${Q[@]}" --quant fp8_block,fp8_per_tensor --shapes mixtral,qwen3 --tokens 1
done
for v in c t p; do
  left 60 && TAIL=4 run_v $v pack_bench sP "ds_$v" 60 "${Q[@]}" --quant fp8_block --shapes deepseek --tokens 1,2
done
for v in t c; do
  left 40 && TAIL=0 run_v $v step "ncu_$v" 40 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum -k regex:'^(?!nvjet|Copy|Fill)' -c 40 \
    "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
    --quant fp8_block --shapes mixtral --tokens 1 --fused on
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,60)}
    /gpu__time_duration|dram__bytes_read/ {printf "%-60s %-26s %10s %s\n", n, $1, $NF, $(NF-1)}' \
    "$out/ncu_$v.log" | tail -14
done
left 100 && TAIL=3 step quant_all 100 "$bin/moe_quant_gpu_test"
gpu_check_finish
