#!/usr/bin/env bash
# Session 36, device call 2: the fused GEMM 1's deferred epilogue
# (moe_gemm_ws_sm90.cu: cooperative tiles of 128, 16-bit weights; a tile's
# last activation chunks run during the next tile's first k-tiles).
# - sD3: one chunk of four deferred (kNow = 3, the patch's form);
#   sD2: two (kNow = 2; ptxas: 78 / 128 bytes of spill stores in the bf16
#   kernels, one CTA / clusters, against 22 / 32 at kNow = 3 and 12 / 16
#   before); sOLD: the kernels before (session 35's pack, REV 6aa923a; the
#   ws kernels have not changed since).
# Steps, most needed first: correctness (moe_ws_gpu_test with the new
# many-tile fused cases), moe_bench bf16 A/B in alternating order (every row
# checked against the CPU and device references first; Mixtral 1024-4096 and
# Qwen3 4096 take the changed kernel, Mixtral 64 / 128 the ping-pong one
# whose epilogue code moved), the layer suites, memcheck and racecheck of the
# fused cases, ncu durations of the fused GEMM 1 at Mixtral 4096, then
# Mixtral's table beside torch._grouped_mm while time is left.
# Packs (a build configured with -gencode=arch=compute_90a,code=sm_90a):
#   git apply docs/perf/session36/deferred-epilogue.patch
#   docs/perf/session33/scripts/pack.sh sD3 moe_bench moe_ws_gpu_test \
#     moe_layer_gpu_test moe_gpu_test moe_graph_gpu_test
#   (set `constexpr int kNow = 2;` in moe_gemm_ws_sm90.cu)
#   docs/perf/session33/scripts/pack.sh sD2 moe_bench moe_ws_gpu_test
#   git checkout kernels tests
#   sOLD: pack.sh sOLD moe_bench moe_ws_gpu_test moe_quant_gpu_test at HEAD.
# Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sOLD sD3 sD2
gpu_check_setup kplan-s36 .t_sD3
step_keep='FAIL|PASSED|ERROR SUMMARY|RACECHECK SUMMARY|rooflines|^(Mixtral|Qwen3|DeepSeek)|^fused|differ'
step_drop='OK \]'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
B=(--budget_s 0.2 --sets 2 --fused on --warmup_s 0.5 --check_tokens 2 --route auto --quant bf16)
bf16() {  # pack, log name
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=8 step "bench_$2" 80 .t_$1/bin/moe_bench "${B[@]}" \
    --shapes mixtral,qwen3 --tokens 64,128,1024,2048,4096 --json "$out/bench_$2.json"
}
left 60 && TAIL=30 step ws_test 60 "$bin/moe_ws_gpu_test"
left 60 && LD_LIBRARY_PATH=$PWD/.t_sD2/lib TAIL=5 step ws_test_d2 60 .t_sD2/bin/moe_ws_gpu_test
left 80 && bf16 sOLD sOLD
left 80 && bf16 sD3 sD3
left 80 && bf16 sD2 sD2
left 80 && bf16 sD3 sD3b
left 80 && bf16 sOLD sOLD2
left 80 && bf16 sD2 sD2b
left 80 && step layer_test 80 "$bin/moe_layer_gpu_test"
left 30 && step graph_test 30 "$bin/moe_graph_gpu_test"
left 30 && step gpu_test 30 "$bin/moe_gpu_test"
left 60 && step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
left 120 && step racecheck 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
  "$bin/moe_ws_gpu_test" --gtest_filter='MoeWsGpuTest.FusedActivation'
for p in sOLD sD3; do
  left 30 && LD_LIBRARY_PATH=$PWD/.t_$p/lib TAIL=12 step_keep='WsGroupedGemm|gpu__time|tensor_op' \
    step ncu_$p 30 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 .t_$p/bin/moe_bench --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
done
left 100 && TAIL=12 step table 100 "$bin/moe_bench" "${B[@]}" --decode_layer off --shapes mixtral \
  --tokens 1,16,64,128,256,512,1024,2048,4096 --json "$out/table.json"
left 120 && TAIL=12 step_keep='Mixtral|torch|grouped' step baseline 120 python3 bench/moe_baseline.py \
  --shapes mixtral --tokens 1,16,64,128,256,512,1024,2048,4096 --budget_s 0.2 --warmup_s 1 \
  --sets 2 --json "$out/baseline.json"
gpu_check_finish
