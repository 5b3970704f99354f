#!/usr/bin/env bash
# Session 41, call 2: the fp8 matvec tiles' rows form (KPLAN_MOE_FP8_MATVEC_ROWS,
# a 512-byte span of one weight row per load) against the tiles (64 bytes of
# 8 rows per load): moe_quant_gpu_test (MatvecFp8RowsForm forces it on; the
# rest run the default), then one-token fp8 layers A/B, alternating.
# Pack sR: docs/perf/session33/scripts/pack.sh sR moe_quant_gpu_test moe_bench.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sR
gpu_check_setup kplan-s41c2 .t_sR
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
left 100 && TAIL=4 step quant_rows 100 "$bin/moe_quant_gpu_test" --gtest_filter='*Rows*:*MatvecRoute*'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
i=0
for r in 0 1 0 1; do
  i=$((i + 1))
  left 45 && KPLAN_MOE_FP8_MATVEC_ROWS=$r TAIL=6 pack_bench sR "mq${i}_rows$r" 45 "${Q[@]}" \
    --quant fp8_block,fp8_per_tensor --shapes mixtral,qwen3 --tokens 1
done
for r in 1 0; do
  left 150 && KPLAN_MOE_FP8_MATVEC_ROWS=$r TAIL=4 pack_bench sR "ds_rows$r" 150 "${Q[@]}" \
    --quant fp8_block --shapes deepseek --tokens 1,2
done
left 100 && TAIL=3 step quant_all 100 "$bin/moe_quant_gpu_test"
gpu_check_finish
