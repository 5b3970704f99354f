#!/usr/bin/env bash
# Session 39, call 3: where the time of a Mixtral-8x7B bf16 layer goes at
# 512 / 1024 / 2048 tokens (ncu of every kernel of one layer), and #17's
# quantised rows re-measured at the head (fp8 decode at 1-64 tokens, the fp8
# block GEMMs at DeepSeek-V3 4096 tokens against cuBLASLt).
# - sN: the head (686d0d7), from call 1; sF: moe_fp8_gemm_bench at the head
#   (docs/perf/session33/scripts/pack.sh sF moe_fp8_gemm_bench).
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN sF
gpu_check_setup kplan-s39c3 .t_sN
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|GEMM|dense|ws_fp8'
layer_ncu() {  # tokens
  TAIL=0 step "ncu_mixtral_$1" 60 ncu --clock-control none \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:'^(?!nvjet|Copy|Fill)' -c 24 "$bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 --check_tokens 0 \
    --quant bf16 --shapes mixtral --tokens "$1" --fused on
  awk '/^  [a-zA-Z_].*\(/ {n=$0; sub(/^  /,"",n); n=substr(n,1,70)} /gpu__time_duration/ {t=$NF} /dram__throughput/ {d=$NF} /tensor_op_hmma/ {printf "%-70s %10s ms dram %6s%% tc %6s%%\n", n, t, d, $NF}' \
    "$out/ncu_mixtral_$1.log" | tail -24
}
for t in 512 1024 2048; do
  left 60 && layer_ncu "$t"
done
left 60 && TAIL=30 pack_bench sN fp8_decode "${FP8_SECONDS:-60}" --budget_s 0.2 --sets 2 --warmup_s 0.5 \
  --check_tokens 2 --route auto --quant fp8_block,fp8_per_tensor \
  --shapes "${FP8_SHAPES:-qwen3,mixtral,deepseek}" --tokens 1,16,64
if [ -z "${SKIP_FP8_GEMM:-}" ]; then
  left 90 && LD_LIBRARY_PATH=$PWD/.t_sF/lib TAIL=20 step fp8_gemm 90 .t_sF/bin/moe_fp8_gemm_bench \
    --json "$out/fp8_gemm.json"
fi
gpu_check_finish
