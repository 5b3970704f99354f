#!/usr/bin/env bash
# Session 35, device call 1: three prepared changes, A/B in one call.
# - sALL: HEAD (6aa923a) with
#   - docs/perf/session34/release-after-wait0.patch: the ws GEMM's
#     cooperative consumers release each stage right after
#     wgmma.wait_group 0 (bf16 rows at 2048-4096 tokens);
#   - docs/perf/session35/int4-xs-smem.patch: the int4 matvec's activation
#     row staged once per CTA in shared memory (int4 rows at 1 token).
#   The two touch different kernels, so one pack answers both.
# - sOLD: HEAD. s34e: f655f15 with docs/perf/session34/load-order.patch (the
#   int decode loops issue the next step's activation loads before the
#   weights' cp.async), kernels otherwise HEAD's.
# Steps: moe_bench bf16 and int4 (1-64 tokens) sOLD / sALL (and s34e); the
# suites of the changed kernels with sALL; the repeats, ncu of the layer and
# the other suites while time is left.
# Packs: docs/perf/session33/scripts/pack.sh sALL moe_bench moe_gpu_test \
#   moe_ws_gpu_test moe_layer_gpu_test moe_graph_gpu_test moe_quant_gpu_test \
#   moe_decode_gpu_test moe_fp8_ws_gpu_test (both patches applied); sOLD the
#   same at HEAD (moe_bench moe_ws_gpu_test moe_layer_gpu_test ...); s34e
#   from session 34.
set -uo pipefail
for p in sOLD sALL s34e; do
  tar -xJf build-pack/$p.tar.xz && mv .tdist .t_$p
done
. scripts/gpu-steps.sh
gpu_check_setup kplan-s35 .t_sALL
for p in sOLD sALL s34e; do echo "$p $(cat .t_$p/REV)"; done
step_keep='FAIL|PASSED|rooflines|^(Mixtral|Qwen3|DeepSeek)|Duration|Tensor|DRAM Throughput'
step_drop='OK \]'
left() { [ $SECONDS -lt "$1" ] || { echo "--- skipped: $SECONDS s gone"; return 1; }; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
bf16() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=8 step "bench_$2" 100 .t_$1/bin/moe_bench "${B[@]}" \
    --quant bf16 --shapes mixtral,qwen3 --tokens 2048,4096 --json "$out/bench_$2.json"
}
int4() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=12 step "int_$2" 100 .t_$1/bin/moe_bench "${B[@]}" \
    --quant int4_group --shapes qwen3,mixtral,deepseek --tokens 1,16,64 --json "$out/int_$2.json"
}
# The device time left was short: each A/B once first (every row checked
# before it is timed), the suites of the changed kernels, then the repeats.
bf16 sOLD sOLD
bf16 sALL sALL
int4 sOLD sOLD
int4 sALL sALL
left 200 && int4 s34e s34e
left 230 && step quant_test 100 "$bin/moe_quant_gpu_test"
left 260 && step ws_test 100 "$bin/moe_ws_gpu_test"
left 330 && bf16 sOLD sOLD2
left 350 && bf16 sALL sALL2
left 370 && int4 sOLD sOLD2
left 390 && int4 sALL sALL2
# Every kernel of Mixtral 4096's layer, one by one (ncu serialises them: no
# PDL overlap, caches flushed): where the layer's time outside the GEMMs goes.
left 440 && TAIL=40 step_keep='^  [A-Za-z_].*\(|gpu__time_duration' step ncu_layer 50 ncu \
  --clock-control none --metrics gpu__time_duration.sum \
  -k regex:"Moe|Combine|WsGrouped|Activation|ScaleRows" -c 16 "$bin/moe_bench" --budget_s 0.01 \
  --sets 1 --warmup_s 0 --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
left 470 && step layer_test 100 "$bin/moe_layer_gpu_test"
left 500 && step graph_test 60 "$bin/moe_graph_gpu_test"
gpu_check_finish
