#!/usr/bin/env bash
# Session 39, call 5: what the token-row gather costs the main loops. A
# timing-only variant (KPLAN_MOE_WS_DEBUG=128, kWsFlagTmaA of
# docs/perf/session39/tma-a-timing.patch): the producer loads each tile's
# 128 token rows as one TMA box from A read as a plain [rows, K] matrix
# (rows tt * 128 mod the rows of A: the same bytes, wrong rows) instead of
# gathering them with 1024 cp.async a stage; results wrong.
# - sN: the head (686d0d7); sT: the patch (flag off: the head's kernels
#   but for the producer's skip test). pack.sh sT moe_bench
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN sT
gpu_check_setup kplan-s39c5 .t_sT
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  TAIL=9 pack_bench "$1" "bench_$2" 60 "${B[@]}" --shapes mixtral,qwen3 --tokens 1024,2048,4096
}
ncu_q() {  # pack, log name: Qwen3-30B-A3B 4096 tokens (one CTA a tile)
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=12 step_keep='WsGrouped|gpu__time|tensor_op' \
    step "ncuq_$2" 25 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 ".t_$1/bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes qwen3 --tokens 4096 --fused on
}
left 25 && ws_ncu sN
left 25 && ws_ncu sT && mv "$out/ncu_sT.log" "$out/ncu_sT_off.log"
left 25 && KPLAN_MOE_WS_DEBUG=128 ws_ncu sT
left 25 && ncu_q sT off
left 25 && KPLAN_MOE_WS_DEBUG=128 ncu_q sT tma
left 40 && rows sN sN
left 40 && rows sT sT
left 40 && KPLAN_MOE_WS_DEBUG=128 rows sT tma
gpu_check_finish
