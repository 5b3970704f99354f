#!/usr/bin/env bash
# Session 32, device call: the tall tiles on by their rule
# (MoeGemmWsTallTilesFor: 96 to 191 slots an expert, hidden >= 4096). The
# GPU tests with the new default; the A/B of the default against tiles of
# 128 (--variants short) where the rule takes the tall tiles (Mixtral-8x7B
# 512, DeepSeek-V3 4096) and where it does not (Mixtral 4096, DeepSeek 512),
# alternating; then #16's table in one run: moe_bench beside
# bench/moe_baseline.py (torch._grouped_mm), every row checked first.
set -uo pipefail
tar -xJf build-pack/s32.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s32 .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|DIFFER|PASSED|differ|rooflines|^[A-Z][A-Za-z0-9-]+ +bf16 +auto|^(Mixtral|Qwen3|DeepSeek)|check .*(vs|differ)'
step_drop='OK$|^  check .*bit-(exact|identical)'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step gpu_test 90 "$bin/moe_gpu_test"
step ws_test 90 "$bin/moe_ws_gpu_test"
step layer_test 200 "$bin/moe_layer_gpu_test"
step graph_test 90 "$bin/moe_graph_gpu_test"
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto --quant bf16)
TAIL=24 step ab 150 "$bin/moe_bench" "${B[@]}" --shapes mixtral,deepseek --tokens 512,4096 \
  --variants default,short,default,short --json "$out/ab.json"
TAIL=30 step table 150 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3,deepseek \
  --tokens 1,64,256,512,1024,2048,4096 --json "$out/table.json"
TAIL=30 step baseline 200 python3 bench/moe_baseline.py --shapes mixtral,qwen3,deepseek \
  --tokens 1,64,256,512,1024,2048,4096 --budget_s 0.2 --warmup_s 1 --sets 2 \
  --json "$out/baseline.json"
gpu_check_finish
