#!/usr/bin/env bash
# Session 44, call 2: #16's table beside torch._grouped_mm and #17's fp8 /
# int4 rows at 1-64 tokens (scripts/moe-compare-gpu-check.sh), at pack
# ${PACK:-s44h} (call1.sh's packs); on an H200 for #16's H200 goals, else
# the H100 re-run. Device tool: carry ["build-pack"]; PACK=... OUT=$OUT bash this.
set -uo pipefail
. scripts/gpu-steps.sh
p=${PACK:-s44h}
gpu_unpack "$p"
TOKENS=1,16,64,128,256,512,1024,2048,4096 IMPLS=grouped_mm \
  QUANT=fp8_block,fp8_per_tensor,int4_group bash scripts/moe-compare-gpu-check.sh ".t_$p"
