#!/usr/bin/env bash
# Session 39, call 6: whether the tall tiles still pay at Mixtral-8x7B
# 384-768 tokens now that the tiles of 128 defer half their fused epilogue
# (session 37), and #17's rows not measured yet this session (DeepSeek-V3
# fp8 at 1-64 tokens, int8 weight-only). Pack sN (the head, 686d0d7;
# device code unchanged since). Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN
gpu_check_setup kplan-s39c6 .t_sN
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto)
left 60 && TAIL=12 pack_bench sN tall_short 60 "${Q[@]}" --fused on --quant bf16 \
  --shapes mixtral --tokens 384,512,640,768 --variants default,short
left 60 && TAIL=12 pack_bench sN tall_short_b 60 "${Q[@]}" --fused on --quant bf16 \
  --shapes mixtral --tokens 384,512,640,768 --variants short,default
left 60 && TAIL=8 pack_bench sN int8 60 "${Q[@]}" --quant int8_group --shapes qwen3,mixtral \
  --tokens 1,16,64
left 120 && TAIL=8 pack_bench sN fp8_deepseek 200 "${Q[@]}" --quant fp8_block,fp8_per_tensor \
  --shapes deepseek --tokens 1,16,64
gpu_check_finish
