#!/usr/bin/env bash
# Session 31, device call 2 (after call 1 passed): the tall tiles against
# tiles of 128 on every shape from 256 to 4096 tokens, to set their rule
# (MoeGemmWsTallTilesFor: kMoeWsTallTilesMinSlots and a ceiling, if any) and
# their default (kMoeWsTallTilesDefault). Each tall row's layer is compared
# bit for bit with tiles of 128 before it is timed.
set -uo pipefail
tar -xJf build-pack/tall.tar.xz
. scripts/gpu-steps.sh
gpu_check_setup kplan-s31-tall2 .tdist
echo "binaries of $(cat .tdist/REV)"
step_keep='FAIL|DIFFER|differ|rooflines| M=[0-9]+ .* us |check .*(vs|differ)'
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
TAIL=80 step bench 420 "$bin/moe_bench" --budget_s 0.2 --sets 2 --fused on --warmup_s 1 \
  --check_tokens 2 --route auto --quant bf16 --shapes mixtral,qwen3,deepseek \
  --tokens 256,512,1024,2048,4096 --variants default,tall --json "$out/bench.json"
gpu_check_finish
