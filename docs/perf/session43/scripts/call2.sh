#!/usr/bin/env bash
# Session 43, call 2: the decode layers' GEMM 2 rows prefetched into the L2
# before the PDL wait, the quantisers between the GEMMs releasing their
# dependents first (pack s43b) against the head (s43a, call1.sh), and s43b
# with KPLAN_MOE_DECODE_PREFETCH=0 (the quantisers' order alone), one-token
# layers, alternating; the coalescing outliers' single-column check (s43b's
# test); the decode suites at s43b.
# s43b: docs/perf/session33/scripts/pack.sh s43b moe_bench moe_decode_gpu_test \
#   moe_quant_gpu_test moe_gpu_test moe_graph_gpu_test moe_layer_gpu_test \
#   moe_coalesce_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s43a s43b
gpu_check_setup kplan-s43c2 .t_s43b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|flips|per token|slot|explains|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --decode_layer off --quant bf16,fp8_block,fp8_per_tensor --shapes qwen3,mixtral,deepseek)
ab() {  # round
  left 60 && TAIL=9 pack_bench s43a "ab${1}_head" 70 "${Q[@]}"
  left 60 && TAIL=9 pack_bench s43b "ab${1}_pf" 70 "${Q[@]}"
  left 60 && KPLAN_MOE_DECODE_PREFETCH=0 TAIL=9 pack_bench s43b "ab${1}_nopf" 70 "${Q[@]}"
}
ab 1
left 30 && TAIL=3 step decode 60 "$bin/moe_decode_gpu_test"
left 60 && TAIL=3 step quant_matvec 90 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*Matvec*:*Routing*:*Quantiser*'
left 70 && TAIL=30 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 step coalesce_seed42 90 \
  "$bin/moe_coalesce_gpu_test"
ab 2
# #17's fp8 rows at 16 / 64 tokens as RunMoE runs them (the fused GEMM 2
# quantisation by its rule), then forced on as call 1 ran them.
for aq in rule on; do
  left 50 && TAIL=6 pack_bench s43b "fp8_mid_$aq" 60 --budget_s 0.2 --sets 2 --fused on \
    --warmup_s 0.5 --check_tokens 1 --route auto --quant fp8_block,fp8_per_tensor \
    --shapes mixtral,qwen3 --tokens 16,64 --fp8_act_quant $aq
done
left 30 && TAIL=3 step graph 60 "$bin/moe_graph_gpu_test"
left 40 && TAIL=3 step moe 60 "$bin/moe_gpu_test"
gpu_check_finish
