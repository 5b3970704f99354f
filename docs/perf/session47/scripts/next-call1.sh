#!/usr/bin/env bash
# Prepared in session 47 for the next session: the decode tiles' block of
# 16 against 32 where the rule gives 16 (5-16 slots a hit expert), on this
# card, for every shape: call 6 measured blocks of 32 faster on Mixtral-8x7B
# at 64 tokens, session 27 (H200) slower on Qwen3-30B-A3B at 192 / 256 and
# Mixtral at 48 (Mixtral 48 / 56 / 64 tokens: 12 / 14 / 16 slots an
# expert). Pack s47x (build-pack): 1799f5c plus
# docs/perf/session46/decode-grid-tiles-fast.patch (off unless
# KPLAN_DECODE_GRID=tiles) and docs/perf/session47/block32-knob.patch
# (KPLAN_EXP_DECODE_BLOCK32=1: blocks of 32 from 5 to 20 slots an expert).
# Order 16, 32, 32, 16.
# Device tool: carry ["build-pack"]; DEADLINE=<limit - 15> OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s47x
gpu_check_setup kplan-s48c1 .t_s47x
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
step_keep='FAIL|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
step_drop='check |experts .* on the'
B=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 1 --route auto --fused on)
r=0
for b in 16 32 32 16; do
  r=$((r + 1))
  if [ "$b" = 32 ]; then export KPLAN_EXP_DECODE_BLOCK32=1; else unset KPLAN_EXP_DECODE_BLOCK32; fi
  left 30 && TAIL=6 pack_bench s47x "mix${r}_b$b" 30 "${B[@]}" --tokens 48,56,64 \
    --quant int4_group,int8_group --shapes mixtral
  left 30 && TAIL=6 pack_bench s47x "qw${r}_b$b" 30 "${B[@]}" --tokens 128,192,256 \
    --quant int4_group,int8_group --shapes qwen3
  left 40 && TAIL=2 pack_bench s47x "ds${r}_b$b" 40 "${B[@]}" --tokens 256,512 \
    --quant int4_group --shapes deepseek
done
unset KPLAN_EXP_DECODE_BLOCK32
gpu_check_finish
