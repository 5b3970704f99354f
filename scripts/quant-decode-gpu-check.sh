#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_quant_gpu_test and moe_bench: the quantised decode routes'
# checks and one-token rows of docs/PERF.md (session 11) in one device call.
# Logs go to $OUT/logs (OUT defaults to /tmp/kplan-quant), packed into
# $OUT/logs.tar.gz at the end.
#   1. the matvec, decode and dequant routes against the CPU reference on
#      tail shapes (moe_quant_gpu_test), and the matvec cases under
#      compute-sanitizer memcheck;
#   2. moe_bench at 1 and 2 tokens on every quantised scheme, the routes
#      side by side (auto = matvec at these sizes; decode = the mma tiles;
#      emulation = the fp8 tensor-core or dequantising GEMMs), bf16 beside;
#      every row checked against the CPU reference before it is timed;
#   3. the matvec kernels under ncu (Qwen3 and Mixtral, fp8 block and int4).
# The steps' time limits add up to 580 s, inside a device call's 600 s.
# usage (here): bash scripts/bundle.sh .dist build/bin/{moe_quant_gpu_test,moe_bench}
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): scripts/quant-decode-gpu-check.sh [DIST]
set -uo pipefail
dist=${1:-.dist}
out=${OUT:-/tmp/kplan-quant}/logs
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
bin=$dist/bin
step_keep=' FAIL$|FAILED|PASSED|ERROR SUMMARY|CHECK FAILED|SKIPPED|^rooflines|M=[0-9]+ +(dec|ws|old)'
. "$(dirname "$0")/gpu-steps.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
step routes_test 100 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*DecodeAndDequant*:*SmallShapesTails*'
step memcheck 80 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*'
B=("$bin/moe_bench" --budget_s 0.2 --sets 4 --fused on --warmup_s 1 --check_tokens 2)
TAIL=60 step bench_deepseek 170 "${B[@]}" --shapes deepseek \
  --quant fp8_block,int4_group,int8_group,fp8_per_tensor --tokens 1,2 \
  --route "${ROUTES:-auto,decode,emulation}" --json "$out/bench_deepseek.json"
TAIL=60 step bench_qm 140 "${B[@]}" --shapes qwen3,mixtral \
  --quant fp8_block,int4_group,int8_group,fp8_per_tensor,bf16 --tokens 1,2 \
  --route "${ROUTES:-auto,decode,emulation}" --json "$out/bench_qm.json"
# The matvec kernels one by one: time, DRAM bytes read, issue load.
ncu_rows() {  # name shape quant
  TAIL=0 step "ncu_$1" 45 ncu --clock-control none --cache-control none -k 'regex:Fp8Kernel|IntRowsKernel|IntGatedKernel' -s 2 -c 4 \
    --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__inst_issued.avg.pct_of_peak_sustained_elapsed \
    "$bin/moe_bench" --shapes "$2" --quant "$3" --tokens 1 --budget_s 0.01 --warmup_s 0 --check_tokens 1
  awk -F'","' '/Command line profiler metrics/ {sub(/\(.*/, "", $5); sub(/"$/, "", $15); print $5, $13, $15}' \
    "$out/ncu_$1.log" | sed 's/"//g; s/void (anonymous namespace)::\|void unnamed>:://'
}
ncu_rows qwen3_fp8 qwen3 fp8_block
ncu_rows mixtral_int4 mixtral int4_group
tar -C "$out/.." -czf "$out/../logs.tar.gz" logs
exit $status
