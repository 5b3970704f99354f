#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_gpu_test, moe_ws_gpu_test, moe_layer_gpu_test,
# moe_activation_gpu_test, moe_quant_gpu_test and moe_bench: the kernel
# forms with a switch (the align spread, the ping-pong consumers by their
# rule, the wide k-tiles) checked and then timed against each other in one
# device call (docs/notes/moe_gemm_next.md). Logs go to $OUT/logs (OUT
# defaults to /tmp/kplan-forms), packed into $OUT/logs.tar.gz.
#   1. by default: the kernel and layer GPU tests (every form against the
#      CPU reference and byte for byte against the others); compute-sanitizer
#      synccheck on the warp-specialised GEMM's small case (the ping-pong
#      form's barriers);
#   2. with BENCH_ONLY=1 instead: moe_bench --variants $VARIANTS over
#      $SHAPES x $TOKENS (each variant's layer checked bit for bit against
#      the layer with the variant's switch the other way first).
# Every step has its own time limit (gpu-steps.sh), so a hang costs its step
# only; the limits add up to 455 s for the tests and 300 s for the bench:
# one device call (600 s at most) for each.
# usage (here): bash scripts/bundle.sh .dist build/bin/{moe_gpu_test,moe_ws_gpu_test,\
#                 moe_layer_gpu_test,moe_activation_gpu_test,moe_quant_gpu_test,moe_bench}
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): [BENCH_ONLY=1 [VARIANTS=...] [SHAPES=...] [TOKENS=...]] \
#                 scripts/moe-forms-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-forms "${1:-}"
variants=${VARIANTS:-default,cooperative,one_block,narrow}
shapes=${SHAPES:-qwen3,mixtral,deepseek}
tokens=${TOKENS:-16,64,192,512,1024,4096}
step_keep='FAIL|DIFFER|PASSED|ERROR SUMMARY|differ|form ran| M=[0-9]+ .* us |check .*(vs|differ)'
step_drop='OK$'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
if [ "${BENCH_ONLY:-0}" != 1 ]; then  # the tests
  step gpu_test 60 "$bin/moe_gpu_test"
  step ws_test 75 "$bin/moe_ws_gpu_test"
  step layer_test 120 "$bin/moe_layer_gpu_test"
  step activation_test 40 "$bin/moe_activation_gpu_test"
  step quant_test 120 "$bin/moe_quant_gpu_test"
  step synccheck 40 compute-sanitizer --tool synccheck "$bin/moe_ws_gpu_test" \
    --gtest_filter='*SanitizerShape*'
else
  TAIL=120 step bench 300 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 \
    --check_tokens 2 --route auto --quant bf16 --shapes "$shapes" --tokens "$tokens" \
    --variants "$variants" --json "$out/bench.json"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
gpu_check_finish
