#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_bench: kplan's bf16 layer, vLLM's fused MoE in Triton with
# vLLM's H200 configs and torch._grouped_mm over the same shapes and tokens
# in one device call (docs/PERF.md's comparison tables; IMPLS picks the
# baselines, default "triton grouped_mm"), then, where CLUSTER_TOKENS is
# set, kplan with the warp-specialised GEMM's clusters forced off
# (KPLAN_MOE_WS_CLUSTER=1) on those tokens, and where QUANT is set (a
# --quant list), kplan's quantised rows at QUANT_TOKENS (default 1,16,64).
# Logs and JSON in $OUT/logs (OUT defaults to /tmp/kplan-compare), packed
# into $OUT/logs.tar.gz. The table's steps are limited to 480 s in all;
# the optional ones run while 60 s are left before ${DEADLINE:-570} s.
# usage (here): bash scripts/bundle.sh .dist build/bin/moe_bench
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there, from the repository root): [SHAPES=...] [TOKENS=...] [IMPLS=...] \
#                 [CLUSTER_TOKENS=...] [QUANT=... [QUANT_TOKENS=...]] \
#                 scripts/moe-compare-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-compare "${1:-}"
shapes=${SHAPES:-mixtral,qwen3,deepseek}
tokens=${TOKENS:-1,16,64,256,512,1024,2048,4096}
step_keep=' M=[0-9]+ |^ *(Mixtral|Qwen3|DeepSeek)|roofline|FAIL|Error|error'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
kplan=("$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2
  --route auto --quant bf16 --shapes "$shapes")
torch=(python3 bench/moe_baseline.py --sets 2 --budget_s 0.2 --warmup_s 1 --shapes "$shapes"
  --tokens "$tokens")
TAIL=40 step kplan 150 "${kplan[@]}" --tokens "$tokens" --json "$out/kplan.json"
for impl in ${IMPLS:-triton grouped_mm}; do
  limit=120
  [ "$impl" = triton ] && limit=210
  TAIL=40 step "$impl" "$limit" "${torch[@]}" --impl "$impl" --json "$out/$impl.json"
done
if [ -n "${CLUSTER_TOKENS:-}" ] && left 60; then
  TAIL=40 KPLAN_MOE_WS_CLUSTER=1 step kplan_no_clusters 60 "${kplan[@]}" \
    --tokens "$CLUSTER_TOKENS" --json "$out/kplan_no_clusters.json"
fi
if [ -n "${QUANT:-}" ] && left 60; then
  TAIL=30 step quant_rows 150 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
    --warmup_s 0.5 --check_tokens 1 --route auto --quant "$QUANT" --shapes "$shapes" \
    --tokens "${QUANT_TOKENS:-1,16,64}" --json "$out/quant_rows.json"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
gpu_check_finish
