#!/usr/bin/env bash
# Session 41, call 4: the head with the fp8 pairs and GEMM 2's combine as
# the only fp8 matvec form: one bench run of the one-token fp8 layers, the
# fp8 cases of moe_quant_gpu_test, memcheck of MatvecRoute, then the whole
# suite as time allows.
# Pack sQ: docs/perf/session33/scripts/pack.sh sQ moe_quant_gpu_test moe_bench.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sQ
gpu_check_setup kplan-s41c4 .t_sQ
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
left 30 && TAIL=6 pack_bench sQ mq 30 --budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 \
  --route auto --fused on --quant fp8_block,fp8_per_tensor --shapes mixtral,qwen3 --tokens 1
left 60 && TAIL=3 step quant_fp8 60 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*Qwen3Fp8*:*Mixtral*'
left 60 && TAIL=3 step memcheck 90 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*'
left 110 && TAIL=3 step quant_all 110 "$bin/moe_quant_gpu_test"
gpu_check_finish
