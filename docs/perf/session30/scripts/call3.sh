#!/usr/bin/env bash
# Session 30, device call 3: session 27's swapped-operand-buffers patch
# (docs/perf/session27/swapped-operand-buffers.patch, the int decode tiles
# and the int4 matvec without the register copy that waits for the next
# step's loads), its A/B at last. moe_quant_gpu_test built with the patch
# (every route against the CPU reference, the decode tiles and matvec
# under memcheck), then moe_bench with (new) and without (old) the patch
# alternating, every row checked against the CPU reference before timing.
set -uo pipefail
tar -xJf build-pack/quant.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s30-quant .qdist
step_keep=' FAIL$|FAILED|PASSED|ERROR SUMMARY|CHECK FAILED|^rooflines|M=[0-9]+ +(dec|ws|old)|tokens|int'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step quant_test_new 140 "$bin/moe_quant_gpu_test_new"
step memcheck_new 90 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_quant_gpu_test_new" --gtest_filter='*MatvecRoute*:*DecodeAndDequantRoutes*'
B=(--budget_s 0.2 --sets 4 --fused on --warmup_s 1 --check_tokens 2 --shapes qwen3,mixtral
  --tokens 1,16,64 --quant int4_group,int8_group)
for v in new old new old; do
  TAIL=40 step "bench_$v" 75 "$bin/moe_bench_$v" "${B[@]}"
done
gpu_check_finish
