#!/usr/bin/env bash
# Session 38, call 4: #16's table at the head beside torch._grouped_mm (the
# commands of session 33's call 2), then every GPU suite at the head.
# Pack (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh sT moe_bench ir_gpu_test moe_activation_gpu_test \
#     moe_coalesce_gpu_test moe_decode_gpu_test moe_fp8_ws_gpu_test moe_gpu_test \
#     moe_graph_gpu_test moe_layer_gpu_test moe_quant_gpu_test moe_shm_inplace_gpu_test \
#     moe_ws_gpu_test cuda_runtime_gpu_test rpc_coalesce_gpu_test
# Device tool: carry ["build-pack"].
# As run in call 4 this script named moe_gpu_test moe_gpu_gpu_test and gave
# moe_layer_gpu_test 60 s (it needs about 80); call 5 ran the two again on the
# same machine. Both are fixed below.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sT
gpu_check_setup kplan-s38c4 .t_sT
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|torch|copy|mm '
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
T=1,16,64,128,256,512,1024,2048,4096
left 200 && TAIL=40 step table_kplan 200 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 1 --check_tokens 2 --route auto --quant bf16 --decode_layer off \
  --shapes mixtral,qwen3,deepseek --tokens $T --json "$out/table_kplan.json"
left 200 && TAIL=40 step_keep='.' step table_torch 200 python3 bench/moe_baseline.py \
  --shapes mixtral,qwen3,deepseek --tokens $T --budget_s 0.2 --warmup_s 1 --sets 2 \
  --json "$out/table_torch.json"
for t in moe_ws moe moe_graph moe_fp8_ws moe_decode moe_activation ir moe_coalesce \
  moe_shm_inplace cuda_runtime rpc_coalesce; do
  left 30 && TAIL=3 step "$t" 60 "$bin/${t}_gpu_test"
done
left 120 && TAIL=3 step moe_layer 120 "$bin/moe_layer_gpu_test"
left 100 && TAIL=3 step moe_quant 100 "$bin/moe_quant_gpu_test"
gpu_check_finish
