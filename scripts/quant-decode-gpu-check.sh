#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_quant_gpu_test and moe_bench (and, for a same-run A/B, another
# build's moe_bench as OLD_BENCH): the quantised decode routes' checks and
# rows of docs/PERF.md (sessions 11-12) in one device call. Logs go to
# $OUT/logs (OUT defaults to /tmp/kplan-quant), packed into
# $OUT/logs.tar.gz at the end.
#   1. moe_quant_gpu_test whole (every route against the CPU reference, the
#      int dequantisation bit for bit), the matvec, decode-tile and
#      dequantisation cases under compute-sanitizer memcheck, the decode
#      tiles under racecheck;
#   2. moe_bench at ${TOKENS:-1,2,16,64} tokens on the int schemes (group
#      scales exact in bf16, and arbitrary fp32: /fp32s) and fp8 block,
#      route ${ROUTES:-auto} (auto = matvec at one token, the decode tiles
#      up to 64), on ${SHAPES:-qwen3,mixtral}; OLD_BENCH's rows beside;
#      every row checked against the CPU reference before it is timed;
#   3. the matvec kernels under ncu (Qwen3 fp8 block, Mixtral int4).
# The steps' time limits add up to 560 s (each may overrun by 5 s before it is
# killed), inside a device call's 600 s.
# usage (here): bash scripts/bundle.sh .dist build/bin/{moe_quant_gpu_test,moe_bench}
#               strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): [OLD_BENCH=.dist/bin/moe_bench_old] scripts/quant-decode-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-quant "${1:-}"
step_keep=' FAIL$|FAILED|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|CHECK FAILED|SKIPPED|^rooflines|M=[0-9]+ +(dec|ws|old)'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv
step quant_test 140 "$bin/moe_quant_gpu_test"
step memcheck 80 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*IntDequant*:*DecodeAndDequantRoutes*'
step racecheck 70 compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/moe_quant_gpu_test" \
  --gtest_filter='*MatvecRoute*:*DecodeAndDequantRoutes*'
B=(--budget_s 0.2 --sets 4 --fused on --warmup_s 1 --check_tokens 2 --shapes "${SHAPES:-qwen3,mixtral}"
  --tokens "${TOKENS:-1,2,16,64}" --route "${ROUTES:-auto}")
TAIL=60 step bench 110 "$bin/moe_bench" "${B[@]}" \
  --quant int4_group,int4_group/fp32s,int8_group,int8_group/fp32s,fp8_block \
  --json "$out/bench.json"
if [ -n "${OLD_BENCH:-}" ]; then
  TAIL=60 step bench_old 80 "$OLD_BENCH" "${B[@]}" --quant int4_group,int8_group \
    --json "$out/bench_old.json"
fi
# The matvec kernels one by one: time, DRAM bytes read, issue load.
ncu_rows() {  # name shape quant
  TAIL=0 step "ncu_$1" 40 ncu --clock-control none --cache-control none -k 'regex:TileKernel|Fp8Pair|Int8RowsKernel|Int8GatedKernel' -s 2 -c 4 \
    --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__inst_issued.avg.pct_of_peak_sustained_elapsed \
    "$bin/moe_bench" --shapes "$2" --quant "$3" --tokens 1 --budget_s 0.01 --warmup_s 0 --check_tokens 1
  awk -F'","' '/Command line profiler metrics/ {sub(/\(.*/, "", $5); sub(/"$/, "", $15); print $5, $13, $15}' \
    "$out/ncu_$1.log" | sed 's/"//g; s/void (anonymous namespace)::\|void unnamed>:://'
}
ncu_rows qwen3_fp8 qwen3 fp8_block
ncu_rows mixtral_int4 mixtral int4_group
tar -C "$out/.." -czf "$out/../logs.tar.gz" logs
exit $status
