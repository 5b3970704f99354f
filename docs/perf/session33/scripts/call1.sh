#!/usr/bin/env bash
# Session 33, device call 1: correctness, then the two A/Bs. Ran with the
# binaries of 2c69a5e (pack.sh s33 ...): its `--variants prefetch` and
# KPLAN_MOE_DECODE_PREFETCH name the decode L2 plan, removed after this call
# (7b2009f; docs/perf/session33/decode-l2-plan.patch), so at a later commit
# moe_bench refuses that variant.
# - The GPU suites: moe_decode_gpu_test (the two decode kernels with their
#   L2 plan, forced on, bit for bit against the plan off and the one-kernel
#   form, and against the CPU), then the tall tiles' default in moe_gpu,
#   moe_ws, moe_layer and moe_graph tests; compute-sanitizer memcheck on the
#   decode suite (the up kernel's evict-first loads; whether memcheck checks
#   a bulk prefetch's addresses is not documented: DecodePrefetchShare's
#   bounds are unit-tested on the CPU).
# - The L2 plan: one and two tokens on Qwen3-30B-A3B (fits: 24 MiB of down
#   rows), Mixtral-8x7B and DeepSeek-V3 (do not fit: the plan forced),
#   default against prefetch, alternating, every row checked bit for bit;
#   moe_hop_bench at one token with the plan off and on.
# - The tall tiles by their rule against tiles of 128 (--variants short)
#   where the rule takes them (Mixtral-8x7B 512, DeepSeek-V3 4096) and where
#   it does not (Mixtral 4096, DeepSeek-V3 512), alternating.
set -uo pipefail
tar -xJf build-pack/s33.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s33 .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|DIFFER|PASSED|differ|rooflines|ERROR SUMMARY|^[A-Z][A-Za-z0-9-]+ +bf16 +auto|^(Mixtral|Qwen3|DeepSeek)|check .*(vs|differ)|^ +[0-9]+ +[0-9.]+ '
step_drop='OK$|^  check .*bit-(exact|identical)|: 0/[0-9]+ differ'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step decode_test 120 "$bin/moe_decode_gpu_test"
step decode_memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_decode_gpu_test" --gtest_filter='*OneKernelMatchesTwoKernelsAndCpu*'
step gpu_test 90 "$bin/moe_gpu_test"
step ws_test 90 "$bin/moe_ws_gpu_test"
step layer_test 200 "$bin/moe_layer_gpu_test"
step graph_test 90 "$bin/moe_graph_gpu_test"
B=(--budget_s 0.3 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto --quant bf16
  --decode_layer off)
TAIL=30 step l2 120 "$bin/moe_bench" "${B[@]}" --shapes qwen3,mixtral,deepseek --tokens 1,2 \
  --variants default,prefetch,default,prefetch --json "$out/l2.json"
# The server's device hop at one token (#15), the plan off and on by the
# environment (its default from KPLAN_MOE_DECODE_PREFETCH), alternating.
for r in 1 2; do
  for p in 0 1; do
    KPLAN_MOE_DECODE_PREFETCH=$p TAIL=4 step hop_p${p}_$r 60 "$bin/moe_hop_bench" --tokens 1 --iters 1000
  done
done
B[1]=0.2
TAIL=24 step ab 150 "$bin/moe_bench" "${B[@]}" --shapes mixtral,deepseek --tokens 512,4096 \
  --variants default,short,default,short --json "$out/ab.json"
gpu_check_finish
