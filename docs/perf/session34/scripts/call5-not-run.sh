#!/usr/bin/env bash
# Session 34, device call 5, NOT RUN (no device start succeeded, then the
# device time was spent; the change: docs/perf/session34/load-order.patch):
# the int decode loops (matvec tiles, decode tiles) issue the next step's
# register operands (activations, scales) before the weights' cp.async
# (s34e) instead of after (s34, b69ce58): call 1's ncu
# had the copy into the next step's registers waiting on the activation loads
# (L1/L2 hits) in 26-41% of the stall samples; are they queued behind the
# cp.asyncs? moe_quant_gpu_test, then moe_bench int4 / int8 at 1-64 tokens:
# old, new (one run each: the device time was nearly spent).
set -uo pipefail
for p in s34 s34e; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-s34 .t_s34e
echo "old $(cat .t_s34/REV), new $(cat .t_s34e/REV)"
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step quant_test 150 "$bin/moe_quant_gpu_test"
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto
  --shapes qwen3,mixtral,deepseek --tokens 1,2,16,64 --quant int4_group,int8_group)
for r in s34:1 s34e:1; do
  v=${r%:*}
  LD_LIBRARY_PATH=$PWD/.t_$v/lib TAIL=30 step "bench_${v}_${r#*:}" 100 .t_$v/bin/moe_bench \
    "${B[@]}" --json "$out/bench_${v}_${r#*:}.json"
done
# #16's one-token rows on whatever card this is (an H200 would answer the 26 us goal).
TAIL=6 step bf16_one 60 "$bin/moe_bench" --budget_s 0.3 --sets 2 --fused on --warmup_s 1 \
  --check_tokens 2 --route auto --quant bf16 --shapes qwen3,mixtral,deepseek --tokens 1 \
  --json "$out/bf16_one.json"
gpu_check_finish
