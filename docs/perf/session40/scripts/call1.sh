#!/usr/bin/env bash
# Session 40, call 1: the fp8 GEMM 1 that applies the activation and
# quantises GEMM 2's activation (1 x 128 groups) in its epilogue
# (moe_gemm_ws_fp8.h, LaunchMoeGroupedGemmWsFp8ActQuant), then session 39's
# call 9 (the ping-pong cut at 48-63 slots) as far as time allows; and the
# fp8 decode tiles against the default route at decode sizes.
# - sA: the head with the change: docs/perf/session33/scripts/pack.sh sA
#   moe_fp8_ws_gpu_test moe_quant_gpu_test moe_bench
# - sR, sP: session 39's packs (docs/perf/session39/scripts/call9.sh).
# Correctness first: the new kernel byte for byte against the three steps it
# replaces (moe_fp8_ws_gpu_test), memcheck of its small case, the layers
# against the CPU reference (moe_quant_gpu_test: Qwen3 fp8 block at 4096
# tokens takes the new kernel). Then fp8 block layers, `--fused both`: the
# three steps (ws) and the fused GEMM 1 (ws+act) alternated per row in one
# process. Device tool: carry ["build-pack"], DEADLINE=<limit - 15>.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sA sR sP
gpu_check_setup kplan-s40c1 .t_sA
step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
left 60 && step fp8_ws_test 90 "$bin/moe_fp8_ws_gpu_test"
left 60 && step memcheck 90 compute-sanitizer --tool memcheck "$bin/moe_fp8_ws_gpu_test" \
  --gtest_filter='*ActQuantSanitizerShape*'
left 120 && step quant_test 180 "$bin/moe_quant_gpu_test"
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --quant fp8_block
  --fused both)
left 90 && TAIL=16 pack_bench sA fp8_mq 120 "${Q[@]}" --shapes mixtral,qwen3 \
  --tokens 64,256,1024,4096
left 90 && TAIL=12 pack_bench sA fp8_ds 150 "${Q[@]}" --shapes deepseek --tokens 256,1024,4096
# The fp8 decode tiles (opt-in for fp8 since session 6) against the default
# (the tensor-core GEMMs) at decode sizes, fp8 block and per tensor.
left 90 && TAIL=24 pack_bench sA fp8_routes 90 --budget_s 0.2 --sets 2 --warmup_s 0.5 \
  --check_tokens 2 --route auto,decode --fused on --quant fp8_block,fp8_per_tensor \
  --shapes qwen3,mixtral --tokens 16,64,128
# Where a one-token fp8 block layer's time goes: every kernel of two layers.
fp8_ncu() {  # shape
  TAIL=0 step "ncu_fp8_one_$1" 40 ncu --clock-control none --metrics gpu__time_duration.sum \
    -k regex:'^(?!nvjet|Copy|Fill)' -c 40 "$bin/moe_bench" --budget_s 0.01 --sets 1 \
    --warmup_s 0 --check_tokens 0 --quant fp8_block --shapes "$1" --tokens 1 --fused on
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,70)} /gpu__time_duration/ {printf "%-70s %10s %s\n", n, $NF, $(NF-1)}' \
    "$out/ncu_fp8_one_$1.log" | tail -16
}
left 60 && fp8_ncu mixtral
left 60 && fp8_ncu qwen3
# Session 39's call 9, the Mixtral and Qwen3 pairs (DeepSeek-V3's take 240 s).
P=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --fused on --quant bf16)
r() {  # pack, log name, shape, tokens, seconds
  left "$5" && TAIL=5 pack_bench "$1" "$2" "$5" "${P[@]}" --shapes "$3" --tokens "$4"
}
r sR mix_sR mixtral 192,208,224,240 40
r sP mix_sP mixtral 192,208,224,240 40
r sP qwen_sP qwen3 768,832,896,960 40
r sR qwen_sR qwen3 768,832,896,960 40
gpu_check_finish
