#!/usr/bin/env bash
# Session 39, call 9: prepared, NOT run (the device start failed). Confirms
# the ping-pong band's cut from below 64 to below 52 slots an expert at
# 48-63 slots on the three shapes, DeepSeek-V3 included.
# - sP: 306de33 (ping-pong below 52; tall tiles from 120):
#   docs/perf/session33/scripts/pack.sh sP moe_bench at the head.
# - sR: the same with kMoeWsPingPongMaxSlots set back to 64 in
#   kernels/cuda/moe/moe_gemm_ws.h (REV 306de33+changes); pack.sh sR
#   moe_bench, then git checkout kernels.
#   Both were packed at the end of session 39 (build-pack, not in git);
#   rebuild them if build-pack is gone.
# Mixtral runs sR, sP, then sP, sR; Qwen3 sP, sR; DeepSeek-V3 sR, sP (one
# pair each: its set up is slow). Device tool: carry ["build-pack"],
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
