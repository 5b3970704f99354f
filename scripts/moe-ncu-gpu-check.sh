#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_bench: ncu of the MoE layer's kernels where docs/notes/
# moe_gemm_next.md asks where the time goes, in one device call. Logs in
# $OUT/logs (OUT defaults to /tmp/kplan-ncu), packed into $OUT/logs.tar.gz.
#   1. the warp-specialised GEMMs (SpeedOfLight, MemoryWorkloadAnalysis,
#      DRAM and L2 bytes) at each shape:tokens of $WS_CONFIGS (bf16);
#   2. the quantised decode kernels (QuantDecodeKernel; the matvec's
#      TileKernel) at each shape:tokens:route of $QUANT_CONFIGS, int4 group
#      weights: the same sections plus WarpStateStats and SourceCounters
#      (the stall reasons: a long-scoreboard stall at the scale and
#      activation loads is the per-step round trip the notes suspect).
# Steps limited to 100 s each; the defaults add up to 500 s.
# usage (here): bash scripts/bundle.sh .dist build/bin/moe_bench
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): [WS_CONFIGS="mixtral:512 ..."] [QUANT_CONFIGS="qwen3:16:decode ..."] \
#                 scripts/moe-ncu-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-ncu "${1:-}"
ws_configs=${WS_CONFIGS:-mixtral:512 deepseek:4096}
quant_configs=${QUANT_CONFIGS:-qwen3:16:decode mixtral:1:matvec mixtral:16:decode}
step_keep='Kernel|Duration|DRAM Throughput|Compute \(SM\) Throughput|L2 Hit|dram__bytes_read|lts__t_bytes|Stall|stall'
base=(--clock-control none --set none --section SpeedOfLight --section MemoryWorkloadAnalysis
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum)
bench=(--budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
for c in $ws_configs; do
  s=${c%%:*} t=${c##*:}
  TAIL=40 step "ws_${s}_$t" 100 ncu "${base[@]}" -k regex:WsGrouped -c 2 "$bin/moe_bench" \
    "${bench[@]}" --shapes "$s" --tokens "$t" --quant bf16 --fused on
done
for c in $quant_configs; do
  IFS=: read -r s t r <<<"$c"
  TAIL=60 step "quant_${s}_${t}_$r" 100 ncu "${base[@]}" --section WarpStateStats \
    --section SourceCounters -k regex:'QuantDecodeKernel|TileKernel|Int8(Gated|Rows)Kernel' -c 2 "$bin/moe_bench" \
    "${bench[@]}" --shapes "$s" --tokens "$t" --quant int4_group --route "$r"
done
gpu_check_finish
