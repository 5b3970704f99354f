#!/usr/bin/env bash
# Session 41, call 1: the head's GPU suites (session 40's call 4: the fp8
# suites and memcheck of the fused GEMM 1's small case, then every suite);
# on an H200 first #16's table beside torch._grouped_mm (the commands of
# session 38's call 4), which no session since 33 could measure on an H200.
# Pack (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh sT moe_bench ir_gpu_test moe_activation_gpu_test \
#     moe_coalesce_gpu_test moe_decode_gpu_test moe_fp8_ws_gpu_test moe_gpu_test \
#     moe_graph_gpu_test moe_layer_gpu_test moe_quant_gpu_test moe_shm_inplace_gpu_test \
#     moe_ws_gpu_test cuda_runtime_gpu_test rpc_coalesce_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sT
gpu_check_setup kplan-s41c1 .t_sT
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|torch|copy|mm '
step_drop='OK \]'
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
T=1,16,64,128,256,512,1024,2048,4096
if [[ $gpu == *H200* ]]; then
  left 200 && TAIL=40 step table_kplan 200 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
    --warmup_s 1 --check_tokens 2 --route auto --quant bf16 --decode_layer off \
    --shapes mixtral,qwen3,deepseek --tokens $T --json "$out/table_kplan.json"
  left 200 && TAIL=40 step_keep='.' step table_torch 200 python3 bench/moe_baseline.py \
    --shapes mixtral,qwen3,deepseek --tokens $T --budget_s 0.2 --warmup_s 1 --sets 2 \
    --json "$out/table_torch.json"
fi
left 60 && TAIL=4 step moe_fp8_ws 60 "$bin/moe_fp8_ws_gpu_test"
left 60 && TAIL=4 step memcheck 60 compute-sanitizer --tool memcheck "$bin/moe_fp8_ws_gpu_test" \
  --gtest_filter='*ActQuantSanitizerShape*'
left 100 && TAIL=3 step moe_quant 100 "$bin/moe_quant_gpu_test"
for t in moe_ws moe moe_graph moe_decode moe_activation ir moe_coalesce moe_shm_inplace \
  cuda_runtime rpc_coalesce; do
  left 30 && TAIL=3 step "$t" 60 "$bin/${t}_gpu_test"
done
left 120 && TAIL=3 step moe_layer 120 "$bin/moe_layer_gpu_test"
gpu_check_finish
