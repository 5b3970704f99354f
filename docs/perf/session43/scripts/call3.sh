#!/usr/bin/env bash
# Session 43, call 3: call2.sh cut to what a short call holds (the device
# budget was spent on failed starts): the one-token A/B on Qwen3 and
# Mixtral, bf16 and fp8 block, twice; the decode and fp8 matvec suites.
# Packs s43a, s43b as call2.sh. Device tool: carry ["build-pack"];
# DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s43a s43b
gpu_check_setup kplan-s43c3 .t_s43b
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on --tokens 1
  --decode_layer off --quant bf16,fp8_block --shapes qwen3,mixtral)
for r in 1 2; do
  left 30 && TAIL=5 pack_bench s43a "ab${r}_head" 45 "${Q[@]}"
  left 30 && TAIL=5 pack_bench s43b "ab${r}_pf" 45 "${Q[@]}"
  left 30 && KPLAN_MOE_DECODE_PREFETCH=0 TAIL=5 pack_bench s43b "ab${r}_nopf" 45 "${Q[@]}"
  [ "$r" = 1 ] && left 20 && TAIL=3 step decode 40 "$bin/moe_decode_gpu_test"
done
left 40 && TAIL=3 step quant_matvec 60 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*MatvecFp8Combine*:*MatvecCombinesFp8*:*Fp8ActivationQuantiser*:*RoutingWithTheActivationQuantiser*'
gpu_check_finish
