#!/usr/bin/env bash
# Session 39, call 2: the 16-bit warp-specialised kernels with 64-byte
# stage rows (K 32 a stage, 64-byte swizzle) and as many stages as fit
# (9 x 24 KiB, 8 beside the deferred chunks, 8 x 28 KiB in the tall tiles)
# against the head's 4 x 48 KiB (docs/perf/session39/bk32-stages.patch).
# - sN: the head (686d0d7), from call 1.
# - sB: the patch. docs/perf/session33/scripts/pack.sh sB moe_bench
#   moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test moe_graph_gpu_test
#   moe_fp8_ws_gpu_test
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN sB
gpu_check_setup kplan-s39c2 .t_sB
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|Failure'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  TAIL=13 pack_bench "$1" "bench_$2" 70 "${B[@]}" --shapes mixtral,qwen3 \
    --tokens 64,256,512,1024,2048,4096
}
left 60 && TAIL=4 step ws_test 60 "$bin/moe_ws_gpu_test"
left 40 && TAIL=3 step moe_test 40 "$bin/moe_gpu_test"
left 30 && TAIL=3 step fp8_ws_test 30 "$bin/moe_fp8_ws_gpu_test"
left 30 && TAIL=3 step graph_test 30 "$bin/moe_graph_gpu_test"
left 50 && rows sN sN
left 50 && rows sB sB
left 50 && rows sB sBb
left 50 && rows sN sNb
for p in sN sB; do
  left 25 && ws_ncu "$p"
done
gpu_check_finish
