#!/usr/bin/env bash
# Session 40, call 2: call 1 measured the fp8 GEMM 1 with the activation
# and GEMM 2's quantisation in its epilogue (pack sA) 5% faster on
# DeepSeek-V3 4096 tokens but up to 34% slower elsewhere. Its epilogue
# divided 64 values a thread one after another (div.rn's slow-path branch);
# sB8 / sB16 batch those divisions (Fp8QuantiseN), with the silu 8 or 16
# values at a time (ptxas: 64 / 96-116 bytes of spills). Packs
# (docs/perf/session33/scripts/pack.sh NAME moe_fp8_ws_gpu_test moe_bench):
# sB8, sB16 at the head with each epilogue; sA call 1's. fp8 block layers,
# `--fused both` (the three steps, then the fused GEMM 1, per row) for sB8,
# `--fused on` for the others. The GPU test, memcheck and the ncu steps run
# sB8 ($bin). Device tool: carry ["build-pack"], DEADLINE=<limit - 15>.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sB8 sB16 sA
gpu_check_setup kplan-s40c2 .t_sB8
step_keep='FAIL|PASSED|ERROR SUMMARY|^ *(Mixtral|Qwen3|DeepSeek)|rooflines measured'
left 60 && step fp8_ws_test 60 "$bin/moe_fp8_ws_gpu_test"
left 60 && LD_LIBRARY_PATH=$PWD/.t_sB16/lib step fp8_ws_test16 60 .t_sB16/bin/moe_fp8_ws_gpu_test \
  --gtest_filter='*ActQuant*'
left 60 && step memcheck 60 compute-sanitizer --tool memcheck "$bin/moe_fp8_ws_gpu_test" \
  --gtest_filter='*ActQuantSanitizerShape*'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --quant fp8_block)
MQ=(--shapes mixtral,qwen3 --tokens 64,256,1024,4096)
DS=(--shapes deepseek --tokens 1024,2048,4096)
left 80 && TAIL=20 pack_bench sB8 mq_b8 90 "${Q[@]}" --fused both "${MQ[@]}"
left 60 && TAIL=10 pack_bench sB16 mq_b16 60 "${Q[@]}" --fused on "${MQ[@]}"
left 60 && TAIL=10 pack_bench sA mq_a 60 "${Q[@]}" --fused on "${MQ[@]}"
left 60 && TAIL=8 pack_bench sB8 ds_b8 70 "${Q[@]}" --fused both "${DS[@]}"
left 45 && TAIL=4 pack_bench sB16 ds_b16 45 "${Q[@]}" --fused on "${DS[@]}"
# The kernels of one Mixtral-8x7B layer at 64 tokens, three steps then fused.
fp8_ncu() {  # name, --fused value
  TAIL=0 step "$1" 40 ncu --clock-control none --metrics gpu__time_duration.sum \
    -k regex:'^(?!nvjet|Copy|Fill)' -c 40 "$bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant fp8_block --shapes mixtral --tokens 64 --fused "$2"
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,60)} /gpu__time_duration/ {printf "%-60s %10s %s\n", n, $NF, $(NF-1)}' \
    "$out/$1.log" | tail -8
}
left 45 && fp8_ncu ncu_steps off
left 45 && fp8_ncu ncu_fused on
gpu_check_finish
