#!/usr/bin/env bash
# Session 51 call 2: why moe_bench's one-token fp8 per-tensor / per-channel
# rows (per-token activation scales) fail their CPU check with NaN (call 1)
# while moe_quant_gpu_test's eager one-token rows pass: one set against two
# in the graph, PDL on against KPLAN_PDL=0, the matvec route against
# decode and emulation, memcheck.
# Pack: docs/perf/session33/scripts/pack.sh s51d moe_bench
# Device tool: carry ["build-pack"]; OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_call_setup kplan-s51 s51d
step_keep='FAIL|ERROR SUMMARY|check |Saved|Invalid|at 0x|by thread|^ *(Mixtral|Qwen3)'
step_drop='^$'
B=(--budget_s 0.05 --warmup_s 0.1 --check_tokens 1 --fused on --quant fp8_per_channel,fp8_per_tensor,fp8_block)
TAIL=12 step sets2 60 "$bin/moe_bench" "${B[@]}" --shapes qwen3 --tokens 1,2 --sets 2
TAIL=12 step sets1 60 "$bin/moe_bench" "${B[@]}" --shapes qwen3 --tokens 1 --sets 1
TAIL=12 step nopdl 60 env KPLAN_PDL=0 "$bin/moe_bench" "${B[@]}" --shapes qwen3 --tokens 1 --sets 2
TAIL=12 step routes 60 "$bin/moe_bench" "${B[@]}" --shapes qwen3 --tokens 1 --sets 2 \
  --route matvec,decode,emulation
TAIL=30 step memcheck 120 compute-sanitizer --tool memcheck --print-limit 5 "$bin/moe_bench" \
  "${B[@]}" --shapes qwen3 --tokens 1 --sets 1 --copy_mib 16
TAIL=12 step mixtral 90 "$bin/moe_bench" "${B[@]}" --shapes mixtral --tokens 1 --sets 2
TAIL=12 step mixtral_nopdl 90 env KPLAN_PDL=0 "$bin/moe_bench" "${B[@]}" --shapes mixtral \
  --tokens 1 --sets 2
gpu_check_finish
