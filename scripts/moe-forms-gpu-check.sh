#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_gpu_test, moe_ws_gpu_test, moe_layer_gpu_test,
# moe_activation_gpu_test, moe_quant_gpu_test and moe_bench: the kernel forms
# that are off by default (the align spread, the ping-pong consumers) and
# the wide k-tiles, checked and then timed against the defaults in one
# device call (docs/notes/moe_gemm_next.md, "Pending GPU checks"). Logs go to
# $OUT/logs (OUT defaults to /tmp/kplan-forms), packed into $OUT/logs.tar.gz.
#   1. correctness: the align in both forms against the CPU reference, the
#      warp-specialised GEMM's forms byte for byte (ping-pong included) and
#      against float64, the layer with each form switched on, the SiLU and
#      the int4 epilogue; compute-sanitizer synccheck on the
#      warp-specialised GEMM's small case (the ping-pong form's barriers);
#   2. moe_bench --variants $VARIANTS over $SHAPES x $TOKENS (each variant's
#      layer checked bit for bit against the default first), plain and with
#      KPLAN_MOE_WS_MIN_SLOTS=$MIN_SLOTS (short-K shapes on the
#      warp-specialised kernel from that many slots per expert).
# Every step has its own time limit (gpu-steps.sh), so a hang costs its step
# only; the limits add up to 540 s.
# usage (here): bash scripts/bundle.sh .dist build/bin/{moe_gpu_test,moe_ws_gpu_test,\
#                 moe_layer_gpu_test,moe_activation_gpu_test,moe_quant_gpu_test,moe_bench}
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): [VARIANTS=...] [SHAPES=...] [TOKENS=...] [MIN_SLOTS=16] \
#                 scripts/moe-forms-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-forms "${1:-}"
variants=${VARIANTS:-default,spread,ping_pong,narrow}
shapes=${SHAPES:-qwen3,mixtral}
tokens=${TOKENS:-16,64,256,1024,4096}
min_slots=${MIN_SLOTS:-16}
step_keep='FAIL|DIFFER|PASSED|ERROR SUMMARY|differ|form ran| M=[0-9]+ .* us |check .*(vs|differ)'
step_drop='OK$'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
step align_test 60 "$bin/moe_gpu_test" --gtest_filter='*Align*'
step ws_test 75 "$bin/moe_ws_gpu_test"
step layer_forms_test 40 "$bin/moe_layer_gpu_test" --gtest_filter='*SwitchedForms*:*Small*'
step activation_test 40 "$bin/moe_activation_gpu_test"
step quant_test 45 "$bin/moe_quant_gpu_test"
step synccheck 40 compute-sanitizer --tool synccheck "$bin/moe_ws_gpu_test" \
  --gtest_filter='*SanitizerShape*'
bench=("$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2
  --route auto --quant bf16 --shapes "$shapes" --tokens "$tokens" --variants "$variants")
TAIL=80 step bench 120 "${bench[@]}" --json "$out/bench.json"
TAIL=80 KPLAN_MOE_WS_MIN_SLOTS=$min_slots step bench_min_slots 120 "${bench[@]}" \
  --json "$out/bench_min_slots.json"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
gpu_check_finish
