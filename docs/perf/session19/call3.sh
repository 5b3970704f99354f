set -uo pipefail
dist=.dist
out=$OUT/logs; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib" NCCL_NVLS_ENABLE=0
bin=$dist/bin
step_keep='OK|FAIL|PASSED|ERROR SUMMARY|^(Qwen3|Mixtral|DeepSeek)-|rooflines|mismatch|Failure|rel='
. scripts/gpu-steps.sh
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto)
TAIL=3 step ws 150 "$bin/moe_ws_gpu_test"
TAIL=0 step b_new 100 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3 --tokens 4096 --quant bf16 --json "$out/b_new.json"
TAIL=0 step b_off 100 env KPLAN_MOE_WS_CLUSTER=1 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3 --tokens 4096 --quant bf16 --json "$out/b_off.json"
TAIL=0 step b_nomc 100 env KPLAN_MOE_WS_DEBUG=8 "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 4096 --quant bf16 --json "$out/b_nomc.json"
for f in b_new b_off b_nomc; do echo "## $f"; grep -E "^(Qwen3|Mixtral|DeepSeek)-[^ ]+ |^rooflines:" "$out/$f.log"; done
prof() {  # name regex env...
  local name=$1 re=$2; shift 2
  TAIL=0 step "ncu_$name" 150 env "$@" ncu --set none --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters --kernel-name-base mangled --kernel-name "regex:$re" \
    --launch-skip 1 --launch-count 1 -f -o "$out/prof_$name" \
    "$bin/moe_bench" --budget_s 0.02 --sets 1 --fused on --warmup_s 0 --check_tokens 1 --shapes mixtral \
    --tokens 4096 --quant bf16
  ncu --import "$out/prof_$name.ncu-rep" --print-details all > "$out/details_$name.txt" 2>&1
  ncu --import "$out/prof_$name.ncu-rep" --page source --csv --print-source sass > "$out/sass_$name.csv" 2>&1
  grep -c MEMBAR "$out/sass_$name.csv"; grep MEMBAR "$out/sass_$name.csv" | cut -c1-200 | head -5
  gzip -f "$out/sass_$name.csv"; rm -f "$out/prof_$name.ncu-rep"
}
prof c2 'WsGroupedGemmKernelI13__nv_bfloat16Lb1ELb0ELi2E' KPLAN_MOE_WS_CLUSTER=2
for n in c2; do echo "## $n"; grep -E "Duration|Throughput|Grid Size|Cluster|Registers Per|Waves|Achieved Occupancy|Hit Rate|Warp Cycles Per Issued" "$out/details_$n.txt" | head -40; done
exit $status
