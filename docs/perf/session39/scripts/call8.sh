#!/usr/bin/env bash
# Session 39, call 8: the new tall-tile edge in the default (pack sR: 123580c,
# kMoeWsTallTilesMinSlots 120) against the head's (sN), and whether the
# ping-pong consumers' band (below kMoeWsPingPongMaxSlots = 64 slots an
# expert, set in session 26) still holds now that the cooperative tiles
# defer half their fused epilogue (session 37): --variants
# default,cooperative at 32-60 slots an expert. Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sN sR
gpu_check_setup kplan-s39c8 .t_sR
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --fused on --quant bf16)
left 40 && TAIL=6 pack_bench sN edge_sN 40 "${Q[@]}" --shapes mixtral --tokens 384,448,496,512
left 40 && TAIL=6 pack_bench sR edge_sR 40 "${Q[@]}" --shapes mixtral --tokens 384,448,496,512
pp() {  # log name, shape, tokens, variants
  TAIL=8 pack_bench sR "$1" 60 "${Q[@]}" --shapes "$2" --tokens "$3" --variants "$4"
}
left 40 && pp pp_mixtral_a mixtral 128,192,240 default,cooperative
left 40 && pp pp_mixtral_b mixtral 128,192,240 cooperative,default
left 40 && pp pp_qwen3_a qwen3 512,768,960 default,cooperative
left 40 && pp pp_qwen3_b qwen3 512,768,960 cooperative,default
gpu_check_finish
