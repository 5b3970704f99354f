#!/usr/bin/env bash
# Session 40, call 3 (ran as one command line on call 2's warm machine):
# call 1's fused epilogue (pack sA, 4400d9e) against the three steps on
# DeepSeek-V3 fp8 block at 2048-4096 tokens, and 4096 again, to set the
# rule's slot bound. Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sA >/dev/null
gpu_check_setup kplan-s40c3 .t_sA
step_keep='^ *(DeepSeek)|rooflines measured'
TAIL=8 pack_bench sA ds_a 120 --budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 \
  --route auto --quant fp8_block --fused both --shapes deepseek --tokens 2048,3072,4096
TAIL=4 pack_bench sA ds_a2 60 --budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 \
  --route auto --quant fp8_block --fused both --shapes deepseek --tokens 4096
gpu_check_finish
