#!/usr/bin/env bash
# Session 44, call 2: #16's table beside torch._grouped_mm (session 38's
# call 4 commands, as session 42's call2.sh) and #17's fp8 / int4 rows at
# 1-64 tokens, at pack ${PACK:-s44h} (call1.sh's packs); on an H200 for
# #16's H200 goals, else the H100 re-run.
# Device tool: carry ["build-pack"]; PACK=... DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
p=${PACK:-s44h}
gpu_unpack "$p"
gpu_check_setup kplan-s44c2 ".t_$p"
step_keep='FAIL|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|torch|copy|mm '
step_drop='check '
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
T=1,16,64,128,256,512,1024,2048,4096
left 200 && TAIL=40 step table_kplan 200 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 1 --check_tokens 2 --route auto --quant bf16 --decode_layer off \
  --shapes mixtral,qwen3,deepseek --tokens $T --json "$out/table_kplan.json"
left 200 && TAIL=40 step_keep='.' step table_torch 200 python3 bench/moe_baseline.py \
  --shapes mixtral,qwen3,deepseek --tokens $T --budget_s 0.2 --warmup_s 1 --sets 2 \
  --json "$out/table_torch.json"
left 120 && TAIL=30 step quant_rows 150 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 0.5 --check_tokens 1 --route auto --quant fp8_block,fp8_per_tensor,int4_group \
  --shapes mixtral,qwen3,deepseek --tokens 1,16,64 --json "$out/quant_rows.json"
gpu_check_finish
