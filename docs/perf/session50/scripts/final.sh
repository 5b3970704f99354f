#!/usr/bin/env bash
# Session 50: the closing measurements of #16 / #17 on the head (pack s50a),
# every step in priority order under the call's deadline; a later call
# passes SKIP=name,... for the steps an earlier one finished.
#  1. The GPU suites on the new default kernels (the fused GEMM 1 for the
#     other stacked gated activations included: moe_layer_gpu_test), then
#     compute-sanitizer memcheck / synccheck on the small shapes.
#  2. #16's table: moe_bench bf16, three shapes, 1-4096 tokens, every row
#     checked before it is timed, beside bench/moe_baseline.py
#     (torch._grouped_mm) in the same call; each measures its rooflines.
#  3. #17's rows: fp8 block / per tensor and int4 at 1-64 tokens (% of copy
#     over the bytes of the experts hit, rows checked against the CPU
#     reference); bf16 beside int4 at 4096; the DeepSeek-V3 fp8 block GEMMs
#     at 4096 against dense cuBLASLt; fp8 per channel at 1-4096 beside
#     torch's fp8 layer (moe_baseline.py --impl fp8_grouped_mm).
#  4. The remaining suites.
# Pack: docs/perf/session33/scripts/pack.sh s50a moe_bench moe_fp8_gemm_bench \
#   ir_gpu_test cuda_runtime_gpu_test moe_activation_gpu_test moe_coalesce_gpu_test \
#   moe_decode_gpu_test moe_fp8_ws_gpu_test moe_gpu_test moe_graph_gpu_test \
#   moe_layer_gpu_test moe_quant_gpu_test moe_shm_inplace_gpu_test moe_ws_gpu_test \
#   rpc_coalesce_gpu_test
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s50 s50a
keep_suite='FAIL|PASSED|ERROR SUMMARY|tests ran|fused activation'
keep_bench='FAIL|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|torch|copy|mm |matmul|cublas|ws_fp8'
run() {  # name seconds keep command...
  local name=$1 limit=$2 keep=$3
  shift 3
  case ",${SKIP:-}," in *",$name,"*) echo "--- $name: skipped (SKIP)"; return ;; esac
  left "$limit" && step_keep=$keep step "$name" "$limit" "$@"
}
mc=(compute-sanitizer --tool memcheck --error-exitcode 1)
TAIL=12 run layer 200 "$keep_suite" "$bin/moe_layer_gpu_test"
TAIL=4 run ws 120 "$keep_suite" "$bin/moe_ws_gpu_test"
TAIL=4 run quant 200 "$keep_suite" "$bin/moe_quant_gpu_test"
TAIL=4 run fp8_ws 120 "$keep_suite" "$bin/moe_fp8_ws_gpu_test"
TAIL=4 run moe 120 "$keep_suite" "$bin/moe_gpu_test"
TAIL=4 run memcheck_quant 90 "$keep_suite" "${mc[@]}" "$bin/moe_quant_gpu_test" \
  --gtest_filter='*SmallShapes*:*DecodeAndDequant*'
TAIL=4 run memcheck_layer 150 "$keep_suite" "${mc[@]}" "$bin/moe_layer_gpu_test" \
  --gtest_filter='*Small*'
T=1,16,64,128,256,512,1024,2048,4096
TAIL=40 step_drop='check |experts .* on the' run table_kplan 260 "$keep_bench" \
  "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 \
  --route auto --quant bf16 --decode_layer off --shapes mixtral,qwen3,deepseek --tokens $T \
  --json "$out/table_kplan.json"
TAIL=40 run table_torch 280 '.' python3 bench/moe_baseline.py --shapes mixtral,qwen3,deepseek \
  --tokens $T --budget_s 0.2 --warmup_s 1 --sets 2 --json "$out/table_torch.json"
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 1 --route auto)
TAIL=30 step_drop='check |experts .* on the' run quant_small 220 "$keep_bench" \
  "$bin/moe_bench" "${B[@]}" --quant fp8_block,fp8_per_tensor,int4_group \
  --shapes mixtral,qwen3,deepseek --tokens 1,16,64 --json "$out/quant_small.json"
TAIL=10 step_drop='check |experts .* on the' run int4_4096 170 "$keep_bench" \
  "$bin/moe_bench" "${B[@]}" --quant bf16,int4_group --shapes mixtral,qwen3,deepseek \
  --tokens 4096 --json "$out/int4_4096.json"
TAIL=20 run fp8_gemm 100 '.' "$bin/moe_fp8_gemm_bench" --json "$out/fp8_gemm.json"
TAIL=12 step_drop='check |experts .* on the' run fp8_channel 130 "$keep_bench" \
  "$bin/moe_bench" "${B[@]}" --quant fp8_per_channel --shapes mixtral,qwen3,deepseek \
  --tokens 1,16,64,256,1024,4096 --json "$out/fp8_channel.json"
TAIL=30 run torch_fp8 200 '.' python3 bench/moe_baseline.py --impl fp8_grouped_mm \
  --shapes mixtral,qwen3,deepseek --tokens 1,16,64,256,1024,4096 --budget_s 0.2 \
  --warmup_s 1 --sets 2 --json "$out/torch_fp8.json"
TAIL=4 run decode 120 "$keep_suite" "$bin/moe_decode_gpu_test"
TAIL=4 run graph 90 "$keep_suite" "$bin/moe_graph_gpu_test"
TAIL=4 run activation 60 "$keep_suite" "$bin/moe_activation_gpu_test"
TAIL=4 run coalesce 90 "$keep_suite" "$bin/moe_coalesce_gpu_test"
TAIL=4 run shm 60 "$keep_suite" "$bin/moe_shm_inplace_gpu_test"
TAIL=4 run rpc_coalesce 60 "$keep_suite" "$bin/rpc_coalesce_gpu_test"
TAIL=4 run ir 60 "$keep_suite" "$bin/ir_gpu_test"
TAIL=4 run cuda_runtime 60 "$keep_suite" "$bin/cuda_runtime_gpu_test"
TAIL=4 run memcheck_ws 90 "$keep_suite" "${mc[@]}" "$bin/moe_ws_gpu_test" \
  --gtest_filter='*SanitizerShape*'
TAIL=4 run memcheck_fp8 90 "$keep_suite" "${mc[@]}" "$bin/moe_fp8_ws_gpu_test" \
  --gtest_filter='*SanitizerShape*'
TAIL=4 run synccheck_ws 90 "$keep_suite" compute-sanitizer --tool synccheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='*SanitizerShape*'
gpu_check_finish
