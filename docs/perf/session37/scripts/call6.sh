#!/usr/bin/env bash
# Session 37, device call 6: the head (577503c) built as committed, every
# GPU suite its changes reach (the fused GEMM 1's deferred half; Pack2 now
# the quantised kernels' pair rounding too), then the int4 rows against
# sOLD (68ade27) for the Pack2 move.
# Packs: pack.sh sHEAD moe_bench moe_quant_gpu_test moe_decode_gpu_test
#   moe_fp8_ws_gpu_test moe_ws_gpu_test moe_layer_gpu_test moe_gpu_test
#   moe_graph_gpu_test ir_gpu_test moe_activation_gpu_test; sOLD as call 3.
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sHEAD
gpu_check_setup kplan-s37c6 .t_sHEAD
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|Failure|got'
step_drop='OK \]'
for t in moe_ws_gpu_test moe_quant_gpu_test moe_decode_gpu_test moe_fp8_ws_gpu_test moe_gpu_test \
  moe_graph_gpu_test ir_gpu_test moe_activation_gpu_test; do
  left 40 && TAIL=4 step "$t" 60 "$bin/$t"
done
left 90 && TAIL=4 step moe_layer_gpu_test 90 "$bin/moe_layer_gpu_test"
# As run, moe_bench refused `--quant int4` (the name is int4_group): no
# int4 rows came back. The quantised suite also ran past its 60 s here after
# 4 of its 12 tests; the other 8 passed in two more commands on the same
# machine (docs/PERF.md, session 37).
Q=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant int4)
for r in sOLD:a sHEAD:a sHEAD:b sOLD:b; do
  p=${r%:*}
  left 30 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=6 step "int4_${r/:/_}" 40 .t_$p/bin/moe_bench \
    "${Q[@]}" --shapes qwen3,mixtral --tokens 1,64,512 --json "$out/int4_${r/:/_}.json"
done
gpu_check_finish
