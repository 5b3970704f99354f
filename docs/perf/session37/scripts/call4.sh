#!/usr/bin/env bash
# Session 37, device call 4: sFIN2 = call 3's sFIN with the ping-pong and
# tall forms' gate/up rounding as before (their epilogues allocated as at
# HEAD: ptxas spills 48 / 252 bytes, sFIN 60 / 276), against sOLD
# (68ade27): the suites of the changed forms, then moe_bench bf16 A/B in
# alternating order on the ping-pong rows (Mixtral 64 / 128, Qwen3 256 /
# 512, DeepSeek-V3 512) and a few cooperative ones.
# Packs: pack.sh sOLD moe_bench moe_ws_gpu_test moe_layer_gpu_test (68ade27);
#   pack.sh sFIN2 moe_bench moe_ws_gpu_test moe_layer_gpu_test (the commit).
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sFIN2
gpu_check_setup kplan-s37c4 .t_sFIN2
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|Failure|got'
step_drop='OK \]'
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
rows() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=10 step "bench_$2" 60 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 64,128,256,512,1024,4096 --json "$out/bench_$2.json"
}
left 60 && TAIL=6 step ws_test 60 "$bin/moe_ws_gpu_test"
left 60 && TAIL=6 step layer_forms 60 "$bin/moe_layer_gpu_test" --gtest_filter='MoeLayerGpu.SmallFusedActivationBitIdentical:MoeLayerGpu.SwitchedFormsBitIdentical:MoeLayerGpu.TallTilesBitIdentical'
left 60 && rows sOLD sOLD
left 60 && rows sFIN2 sFIN2
left 60 && rows sFIN2 sFIN2b
left 60 && rows sOLD sOLDb
for p in sOLD sFIN2; do
  left 40 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=2 step ds_$p 40 .t_$p/bin/moe_bench "${B[@]}" \
    --shapes deepseek --tokens 512 --json "$out/ds_$p.json"
done
gpu_check_finish
