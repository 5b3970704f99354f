#!/usr/bin/env bash
# Session 39, call 9: the ping-pong band cut from below 64 to below 48 slots
# an expert (pack sP: 123580c + kMoeWsPingPongMaxSlots 48) against sR
# (123580c: below 64), the default forms, at 48-63 slots an expert on the
# three shapes. Device tool: carry ["build-pack"].
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack sR sP
gpu_check_setup kplan-s39c9 .t_sP
step_keep='FAIL|rooflines|^(Mixtral|Qwen3|DeepSeek)|differ|CHECK'
Q=(--budget_s 0.2 --sets 2 --warmup_s 0.5 --check_tokens 2 --route auto --fused on --quant bf16)
r() {  # pack, log name, shape, tokens
  TAIL=5 pack_bench "$1" "$2" 90 "${Q[@]}" --shapes "$3" --tokens "$4"
}
left 30 && r sR mix_sR mixtral 192,208,224,240
left 30 && r sP mix_sP mixtral 192,208,224,240
left 30 && r sR qwen_sR qwen3 768,832,896,960
left 30 && r sP qwen_sP qwen3 768,832,896,960
left 90 && r sR ds_sR deepseek 1536,1792,2016
left 90 && r sP ds_sP deepseek 1536,1792,2016
gpu_check_finish
