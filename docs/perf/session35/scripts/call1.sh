#!/usr/bin/env bash
# Session 35's device call, prepared in session 35 (no device start succeeded then) and run as
# session 36's first call (docs/PERF.md, session 36): three changes, A/B in one call.
# - sALL: HEAD with
#   - docs/perf/session34/release-after-wait0.patch: the ws GEMM's
#     cooperative consumers (tiles of 128 slots: bf16 / fp16 GEMM 1 and 2, and
#     the int4 ws GEMMs) release each stage right after wgmma.wait_group 0;
#     timed by the bf16 rows at 2048-4096 tokens and int4 at 512;
#   - docs/perf/session35/int4-xs-smem.patch: the int4 matvec stages its
#     slot's activation row once per CTA in shared memory; timed by the int4
#     rows at 1 token (16 and 64 tokens run the decode tiles, unchanged).
#   No timed row runs both changed kernels, so one pack answers both.
# - sOLD: HEAD. s34e: f655f15 with docs/perf/session34/load-order.patch (the
#   int decode loops issue the next step's activation loads before the
#   weights' cp.async), kernels otherwise HEAD's.
# Steps: moe_bench bf16 and int4 sOLD / sALL / s34e (every row checked
# against the CPU and device references before it is timed); the changed
# kernels' suites and racecheck of the staged row; the repeats in the other
# order; ncu of every kernel of Mixtral 4096's layer; the other suites.
# DEADLINE (default 570): the run's limit_s; a step starts only while the
# seconds it needs are left.
# Packs (build with -gencode=arch=compute_90a,code=sm_90a):
#   docs/perf/session33/scripts/pack.sh sOLD moe_bench moe_ws_gpu_test moe_quant_gpu_test
#   (apply both patches) pack.sh sALL moe_bench moe_gpu_test moe_ws_gpu_test \
#     moe_layer_gpu_test moe_graph_gpu_test moe_quant_gpu_test
#   (f655f15 + load-order.patch) pack.sh s34e moe_bench moe_quant_gpu_test
# then the device tool with carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sALL s34e
gpu_check_setup kplan-s35 .t_sALL
step_keep='FAIL|PASSED|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto)
bf16() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=8 step "bench_$2" 100 .t_$1/bin/moe_bench "${B[@]}" \
    --quant bf16 --shapes mixtral,qwen3 --tokens 2048,4096 --json "$out/bench_$2.json"
}
int4() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=14 step "int_$2" 100 .t_$1/bin/moe_bench "${B[@]}" \
    --quant int4_group --shapes qwen3,mixtral,deepseek --tokens 1,16,64,512 \
    --json "$out/int_$2.json"
}
left 60 && bf16 sOLD sOLD
left 60 && bf16 sALL sALL
left 60 && int4 sOLD sOLD
left 60 && int4 sALL sALL
left 60 && int4 s34e s34e
left 100 && step quant_test 100 "$bin/moe_quant_gpu_test"
left 100 && step ws_test 100 "$bin/moe_ws_gpu_test"
left 60 && step mv_racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/moe_quant_gpu_test" --gtest_filter='MoeQuantGpu.MatvecRoute'
left 60 && bf16 sALL sALL2
left 60 && bf16 sOLD sOLD2
left 60 && int4 sALL sALL2
left 60 && int4 sOLD sOLD2
# Every kernel of Mixtral 4096's layer, one by one (ncu serialises them: no
# PDL overlap, caches flushed; the eager check layer, then the graph's):
# where the layer's time outside the GEMMs goes.
left 40 && TAIL=40 step_keep='^  [A-Za-z_].*\(|gpu__time_duration' step ncu_layer 40 ncu \
  --clock-control none --metrics gpu__time_duration.sum \
  -k regex:"Moe|Combine|WsGrouped|Activation|ScaleRows" -c 16 "$bin/moe_bench" --budget_s 0.01 \
  --sets 1 --warmup_s 0 --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
left 100 && step layer_test 100 "$bin/moe_layer_gpu_test"
left 60 && step graph_test 60 "$bin/moe_graph_gpu_test"
left 100 && step gpu_test 100 "$bin/moe_gpu_test"
gpu_check_finish
