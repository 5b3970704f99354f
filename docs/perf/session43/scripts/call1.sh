#!/usr/bin/env bash
# Session 43, call 1: the coalescing test's fp8 per-token outliers localised
# (session 42's failing seed: per token, and the worst
# token's slots alone on both sides); #16's table beside torch._grouped_mm
# (session 38's call 4 commands); #17's quantised rows at 1-64 tokens.
# Pack (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh s43a moe_bench ir_gpu_test \
#     moe_activation_gpu_test moe_coalesce_gpu_test moe_decode_gpu_test \
#     moe_fp8_ws_gpu_test moe_gpu_test moe_graph_gpu_test moe_layer_gpu_test \
#     moe_quant_gpu_test moe_shm_inplace_gpu_test moe_ws_gpu_test \
#     cuda_runtime_gpu_test rpc_coalesce_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s43a
gpu_check_setup kplan-s43c1 .t_s43a
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|flips|per token|slot|rooflines|^(Mixtral|Qwen3|DeepSeek)|torch|copy|mm '
TAIL=30 MOE_COALESCE_GPU_TEST_SEED=17808043586953073039 step coalesce_seed42 90 \
  "$bin/moe_coalesce_gpu_test"
T=1,16,64,128,256,512,1024,2048,4096
left 200 && TAIL=40 step table_kplan 200 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 1 --check_tokens 2 --route auto --quant bf16 --decode_layer off \
  --shapes mixtral,qwen3,deepseek --tokens $T --json "$out/table_kplan.json"
left 150 && TAIL=40 step_keep='.' step table_torch 200 python3 bench/moe_baseline.py \
  --shapes mixtral,qwen3,deepseek --tokens $T --budget_s 0.2 --warmup_s 1 --sets 2 \
  --json "$out/table_torch.json"
# Where one bf16 Qwen3 token's layer goes, kernel by kernel (two layers).
left 40 && TAIL=12 step_keep='Kernel|Decode|Routing|gpu__time|dram__' step ncu_qwen3 40 \
  ncu --clock-control none --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  -k regex:'Routing|Decode' -c 6 "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 \
  --check_tokens 0 --quant bf16 --shapes qwen3 --tokens 1 --decode_layer off --fused on
left 100 && TAIL=30 step quant_rows 150 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on \
  --warmup_s 0.5 --check_tokens 1 --route auto --quant fp8_block,fp8_per_tensor,int4_group \
  --shapes mixtral,qwen3 --tokens 1,16,64 --json "$out/quant_rows.json"
gpu_check_finish
