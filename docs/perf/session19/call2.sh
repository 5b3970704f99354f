set -uo pipefail
dist=.dist
out=$OUT/logs; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib" NCCL_NVLS_ENABLE=0
bin=$dist/bin
step_keep='OK|FAIL|PASSED|ERROR SUMMARY|^(Qwen3|Mixtral|DeepSeek)-|rooflines|mismatch|Failure|rel='
. scripts/gpu-steps.sh
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto)
TAIL=16 step ws 150 "$bin/moe_ws_gpu_test"
if [ $status -ne 0 ]; then exit 1; fi
TAIL=3 step ws_memcheck 120 compute-sanitizer --tool memcheck "$bin/moe_ws_gpu_test" --gtest_filter='*Sanitizer*'
TAIL=3 step ws_race 120 compute-sanitizer --tool racecheck "$bin/moe_ws_gpu_test" --gtest_filter='*Sanitizer*'
TAIL=3 step ws_sync 120 compute-sanitizer --tool synccheck "$bin/moe_ws_gpu_test" --gtest_filter='*Sanitizer*'
TAIL=0 step b_new 150 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3 --tokens 1024,4096 --quant bf16 --json "$out/b_new.json"
TAIL=0 step b_off 150 env KPLAN_MOE_WS_CLUSTER=1 "$bin/moe_bench" "${B[@]}" --shapes mixtral,qwen3 --tokens 1024,4096 --quant bf16 --json "$out/b_off.json"
TAIL=0 step b_prev 150 "$bin/moe_bench_prev" "${B[@]}" --shapes mixtral,qwen3 --tokens 1024,4096 --quant bf16 --json "$out/b_prev.json"
for g in 1 4; do
TAIL=0 step "b_g$g" 100 env KPLAN_MOE_WS_GROUP=$g "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 4096 --quant bf16 --json "$out/b_g$g.json"
done
for f in b_new b_off b_prev b_g1 b_g4; do echo "## $f"; grep -E "^(Qwen3|Mixtral|DeepSeek)-[^ ]+ |^rooflines:" "$out/$f.log"; done
exit $status
