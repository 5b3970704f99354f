set -uo pipefail
dist=.dist
out=$OUT/logs; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib" NCCL_NVLS_ENABLE=0
bin=$dist/bin
step_keep='OK|FAIL|PASSED|ERROR SUMMARY|^(Qwen3|Mixtral|DeepSeek)-|rooflines|mismatch'
. scripts/gpu-steps.sh
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto)
TAIL=14 step quant 240 "$bin/moe_quant_gpu_test"
TAIL=8 step quant_cp 200 env KPLAN_MOE_INT_WS=0 KPLAN_MOE_INT_MAX_SLOTS=100000 "$bin/moe_quant_gpu_test" --gtest_filter='*IntWeightOnly*:*Mixtral*:*SmallShapesTails*'
TAIL=3 step memcheck 150 env KPLAN_MOE_INT_WS=0 KPLAN_MOE_INT_MAX_SLOTS=100000 compute-sanitizer --tool memcheck "$bin/moe_quant_gpu_test" --gtest_filter='*SmallShapesTails*'
TAIL=0 step i4_new 150 "$bin/moe_bench" "${B[@]}" --shapes qwen3,mixtral --tokens 64,256,1024,4096 --quant int4_group --json "$out/i4_new.json"
TAIL=0 step i4_cp 150 env KPLAN_MOE_INT_WS=0 KPLAN_MOE_INT_MAX_SLOTS=100000 "$bin/moe_bench" "${B[@]}" --shapes qwen3,mixtral --tokens 256,1024,4096 --quant int4_group --json "$out/i4_cp.json"
TAIL=0 step i4_prev 150 "$bin/moe_bench_prev" "${B[@]}" --shapes qwen3,mixtral --tokens 64,256,1024,4096 --quant int4_group,bf16 --json "$out/i4_prev.json"
for f in i4_new i4_cp i4_prev; do echo "## $f"; grep -E "^(Qwen3|Mixtral)-|^rooflines" "$out/$f.log"; done
exit $status
