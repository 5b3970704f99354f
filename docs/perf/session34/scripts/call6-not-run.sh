#!/usr/bin/env bash
# Session 34, prepared for the next session, NOT RUN (no device time was
# left): the ws GEMM's cooperative consumers release each stage right after
# its wgmma group is done (wgmma.wait_group 0, DeepGEMM's order) instead of a
# k-tile later (wait_group 1, the previous stage): call 1's ncu had the
# consumers waiting for full stages while the producer waited for empty ones.
# Build: the tree with docs/perf/session34/release-after-wait0.patch applied
# (pack sNEW), the tree without it (pack sOLD), both with
# docs/perf/session33/scripts/pack.sh NAME moe_bench moe_ws_gpu_test \
#   moe_layer_gpu_test moe_graph_gpu_test.
# - The suites with the change (every form byte-equal; the layers against the
#   CPU reference), then moe_bench bf16 old / new / old / new where the
#   cooperative kernel runs (Mixtral-8x7B 256-8192, Qwen3-30B-A3B and
#   DeepSeek-V3 2048 / 4096), then ncu of Mixtral 4096's fused GEMM 1 (tensor
#   pipe, the full-stage waits).
set -uo pipefail
OLD=${OLD:-sOLD} NEW=${NEW:-sNEW}
for p in $OLD $NEW; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-rel .t_$NEW
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|Duration|Tensor|DRAM Throughput'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step ws_test 150 "$bin/moe_ws_gpu_test"
step layer_test 150 "$bin/moe_layer_gpu_test"
step graph_test 90 "$bin/moe_graph_gpu_test"
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
for v in $OLD $NEW $OLD $NEW; do
  LD_LIBRARY_PATH=$PWD/.t_$v/lib TAIL=12 step "bench_$v" 100 .t_$v/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3,deepseek --tokens 256,2048,4096 --json "$out/bench_$v.json"
done
TAIL=12 step ncu_g1 120 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
  -k regex:WsGrouped -c 2 "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
  --quant bf16 --shapes mixtral --tokens 4096 --fused on
gpu_check_finish
