set -uo pipefail
dist=.dist
out=$OUT/logs; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$dist/lib" NCCL_NVLS_ENABLE=0
bin=$dist/bin
step_keep='OK|FAIL|PASSED|ERROR SUMMARY|rooflines|mismatch|Failure'
. scripts/gpu-steps.sh
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 1 --check_tokens 2 --route auto)
for c in 2 1; do
  TAIL=0 step "m_c$c" 150 env KPLAN_MOE_WS_CLUSTER=$c "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 1024,2048,4096 --quant bf16 --json "$out/m_c$c.json"
  TAIL=0 step "q_c$c" 100 env KPLAN_MOE_WS_CLUSTER=$c "$bin/moe_bench" "${B[@]}" --shapes qwen3 --tokens 2048,4096 --quant bf16 --json "$out/q_c$c.json"
done
for g in 1 4 8; do
  TAIL=0 step "g$g" 60 env KPLAN_MOE_WS_GROUP_ACT=$g "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 4096 --quant bf16 --json "$out/g$g.json"
done
TAIL=0 step "g2_1" 60 env KPLAN_MOE_WS_GROUP=2 KPLAN_MOE_WS_GROUP_ACT=2 "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 4096 --quant bf16 --json "$out/g2_1.json"
for c in 2 1; do
  TAIL=0 step "d_c$c" 150 env KPLAN_MOE_WS_CLUSTER=$c "$bin/moe_bench" "${B[@]}" --shapes deepseek --tokens 4096 --quant bf16 --json "$out/d_c$c.json"
done
for f in m_c2 m_c1 q_c2 q_c1 g1 g4 g8 g2_1 d_c2 d_c1; do echo "## $f"; grep -E "^(Qwen3|Mixtral|DeepSeek)-[^ ]+ +bf16 |^rooflines:" "$out/$f.log"; done
exit $status
