#!/usr/bin/env bash
# Runs on a GPU host over a folder made by scripts/bundle.sh (default .dist)
# holding moe_gpu_test, moe_decode_gpu_test, moe_layer_gpu_test, moe_routing_bench
# and moe_bench: the decode-sized layer's checks and A/B rows of docs/PERF.md
# (sessions 9-10) in one device call. Logs go to $OUT/logs (OUT defaults to
# /tmp/kplan-decode), packed into $OUT/logs.tar.gz at the end.
#   1. routing against the CPU reference, then timed (moe_routing_bench);
#   2. the one-kernel decode layer against the two kernels and the CPU,
#      with the default ring and a 2-stage one, and under compute-sanitizer
#      (memcheck, synccheck) on its small cases; moe_layer_gpu_test's small
#      and Qwen3 cases;
#   3. moe_bench at 1 and 2 tokens, both decode forms;
#   4. the two-kernel form's kernels one by one under ncu (time, DRAM bytes,
#      L2 hit rate; caches kept between kernels).
# The steps' time limits add up to 480 s, inside a device call's 600 s, so
# that one hang costs its own step only. (The device tool returns a few
# files per call; one archive brings every log back.)
# usage (here): bash scripts/bundle.sh .dist build/bin/{moe_gpu_test,moe_decode_gpu_test,\
#                 moe_layer_gpu_test,\
#                 moe_routing_bench,moe_bench}; strip --strip-debug .dist/bin/* .dist/lib/*
#        (there): scripts/decode-gpu-check.sh [DIST]
set -uo pipefail
. "$(dirname "$0")/gpu-steps.sh"
gpu_check_setup kplan-decode "${1:-}"
step_keep='FAIL|DIFFER|differ:|PASSED|ERROR SUMMARY|^routing|^shape|dec[12]k|bit-identical|other ids|gpu__time|dram__bytes|lts__t'
step_drop='^route .* OK$'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
if [ -z "${SKIP_ROUTING:-}" ]; then  # SKIP_ROUTING=1: the decode steps only
  step routing_test 60 "$bin/moe_gpu_test" --gtest_filter='*Routing*'
  step routing_bench 40 "$bin/moe_routing_bench" --samples 50 --json "$out/routing_bench.json"
fi
step decode_test 45 "$bin/moe_decode_gpu_test"
step layer_test 90 "$bin/moe_layer_gpu_test" \
  --gtest_filter='-*Mixtral*:*DeepSeekV3*'
KPLAN_MOE_DECODE_STAGES=2 step decode_test_2stages 45 "$bin/moe_decode_gpu_test"
step memcheck 60 compute-sanitizer --tool memcheck "$bin/moe_decode_gpu_test"
step synccheck 30 compute-sanitizer --tool synccheck "$bin/moe_decode_gpu_test" \
  --gtest_filter='*InCudaGraph*'
TAIL=12 step bench 70 "$bin/moe_bench" --shapes qwen3,deepseek,mixtral --tokens 1,2 \
  --decode_layer both --fused on --budget_s 0.3 --warmup_s 1 --json "$out/bench.json"
TAIL=0 step ncu 40 ncu --clock-control none --cache-control none -k 'regex:Decode|Routing' \
  -s 6 -c 6 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
  "$bin/moe_bench" --shapes qwen3 --tokens 1 --decode_layer off --budget_s 0.01 --warmup_s 0
# kernel, metric, value
awk -F'","' '/Command line profiler metrics/ {sub(/\(.*/, "", $5); sub(/"$/, "", $15); print $5, $13, $15}' \
  "$out/ncu.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
gpu_check_finish
