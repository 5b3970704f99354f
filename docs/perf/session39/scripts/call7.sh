#!/usr/bin/env bash
# Session 39, call 7: the tall tiles' lower edge. Call 6 measured tiles of
# 128 9% faster than the tall tiles at 96 slots an expert (Mixtral-8x7B 384
# tokens) and 2.5% slower at 128 (512 tokens); here the slot counts in
# between, and DeepSeek-V3 at 96 / 112 slots (3072 / 3584 tokens). Pack sN
# (686d0d7). Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN
gpu_check_setup kplan-s39c7 .t_sN
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --fused on --quant bf16)
left 60 && TAIL=12 pack_bench sN mixtral_a 60 "${Q[@]}" --shapes mixtral \
  --tokens 416,448,480,496,512 --variants default,short
left 60 && TAIL=12 pack_bench sN mixtral_b 60 "${Q[@]}" --shapes mixtral \
  --tokens 416,448,480,496,512 --variants short,default
left 150 && TAIL=6 pack_bench sN deepseek_a 150 "${Q[@]}" --shapes deepseek \
  --tokens 3072,3584 --variants default,short
left 150 && TAIL=6 pack_bench sN deepseek_b 150 "${Q[@]}" --shapes deepseek \
  --tokens 3072,3584 --variants short,default
gpu_check_finish
