#!/usr/bin/env bash
# Session 31, device call 1: the tall tiles (blocks of 192, four warpgroups;
# kernels/cuda/moe/moe_gemm_ws_sm90.cu), never run before. Correctness first:
# the kernel against the same slots in tiles of 128 and float64
# (moe_ws_gpu_test, every form), the layer bit for bit with them forced on
# and off (moe_layer_gpu_test), the host rules; memcheck, racecheck and
# synccheck on the small shapes. Then a first A/B where the model of
# docs/notes/moe_gemm_next.md expects the gain (128 +- 11 slots per expert:
# Mixtral-8x7B 512 tokens, Qwen3-30B-A3B 2048), each tall row's layer
# compared bit for bit with tiles of 128 before it is timed.
set -uo pipefail
tar -xJf build-pack/tall.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s31-tall .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|DIFFER|PASSED|SUMMARY|differ|tall|sanitizer|^rev| M=[0-9]+ .* us |check .*(vs|differ)'
step_drop='OK$'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step host_rules 30 "$bin/moe_gpu_test" --gtest_filter='MoeGpuValidationTest.*'
step ws_test 90 "$bin/moe_ws_gpu_test"
step layer_tall 90 "$bin/moe_layer_gpu_test" --gtest_filter='*TallTiles*:*SwitchedForms*'
for tool in memcheck racecheck synccheck; do
  step "$tool" 60 compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin/moe_ws_gpu_test" \
    --gtest_filter='*SanitizerShape*'
done
TAIL=40 step bench 150 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 \
  --check_tokens 2 --route auto --quant bf16 --shapes mixtral,qwen3 --tokens 512,2048 \
  --variants default,tall,default,tall --json "$out/bench.json"
gpu_check_finish
