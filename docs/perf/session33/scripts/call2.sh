#!/usr/bin/env bash
# Session 33, device call 2: #16's table in one run, moe_bench (every row
# checked first) beside bench/moe_baseline.py (torch._grouped_mm), tokens 1
# to 4096 on Mixtral-8x7B, Qwen3-30B-A3B and DeepSeek-V3, rooflines in the
# same run.
set -uo pipefail
tar -xJf build-pack/s33.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s33b .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|DIFFER|PASSED|rooflines|^[A-Z][A-Za-z0-9-]+ +bf16 +auto|^(Mixtral|Qwen3|DeepSeek)|check .*(vs|differ)'
step_drop='OK$|^  check .*bit-(exact|identical)'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto --quant bf16
  --decode_layer off)
TAIL=30 step table 200 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3,deepseek \
  --tokens 1,16,64,128,256,512,1024,2048,4096 --json "$out/table.json"
TAIL=40 step baseline 300 python3 bench/moe_baseline.py --shapes mixtral,qwen3,deepseek \
  --tokens 1,16,64,128,256,512,1024,2048,4096 --budget_s 0.2 --warmup_s 1 --sets 2 \
  --json "$out/baseline.json"
gpu_check_finish
