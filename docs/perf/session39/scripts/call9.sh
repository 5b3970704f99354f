#!/usr/bin/env bash
# Session 39, call 9: prepared, NOT run (the device start failed). Confirms
# the ping-pong band's cut from below 64 to below 52 slots an expert at
# 48-63 slots on the three shapes, DeepSeek-V3 included.
# - sR: 123580c (ping-pong below 64; tall tiles from 120).
# - sP: the head with kMoeWsPingPongMaxSlots 52 (session 39's last commit).
#   Rebuild both before running: git worktree or checkout 123580c, then
#   docs/perf/session33/scripts/pack.sh sR moe_bench; at the head
#   docs/perf/session33/scripts/pack.sh sP moe_bench.
# Each row pair runs sR, sP, then sP, sR. Device tool: carry ["build-pack"],
# DEADLINE=<limit - 15>.
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sR sP
gpu_check_setup kplan-s39c9 .t_sP
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --fused on --quant bf16)
r() {  # pack, log name, shape, tokens, seconds
  left "$5" && TAIL=5 pack_bench "$1" "$2" "$5" "${Q[@]}" --shapes "$3" --tokens "$4"
}
r sR mix_sR mixtral 192,208,224,240 40
r sP mix_sP mixtral 192,208,224,240 40
r sP qwen_sP qwen3 768,832,896,960 40
r sR qwen_sR qwen3 768,832,896,960 40
r sR ds_sR deepseek 1536,1664,1792,2016 120
r sP ds_sP deepseek 1536,1664,1792,2016 120
r sP mix_sP2 mixtral 192,208,224,240 40
r sR mix_sR2 mixtral 192,208,224,240 40
gpu_check_finish
