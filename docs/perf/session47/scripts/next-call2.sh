#!/usr/bin/env bash
# Prepared in session 47: where the decode tiles' time goes now that blocks
# of 8 split K (the head s47c = 1799f5c): ncu's stall reasons and source
# counters (scripts/moe-ncu-gpu-check.sh) of QuantDecodeKernel on Mixtral-8x7B
# 16 tokens (k-split GEMMs), Qwen3-30B-A3B 16 tokens (GEMM 2 in rows on
# 384-byte rows: 43% of DRAM peak in call 6) and Mixtral 64 tokens (blocks
# of 16, rows). Logs come back as $OUT/logs.tar.gz.
# Device tool: carry ["build-pack"]; OUT=$OUT bash this (about 300 s).
set -uo pipefail
. scripts/gpu-steps.sh
gpu_unpack s47c
OUT=${OUT:-/tmp/kplan-s48c2} WS_CONFIGS=' ' \
  QUANT_CONFIGS='mixtral:16:decode qwen3:16:decode mixtral:64:decode' \
  bash scripts/moe-ncu-gpu-check.sh .t_s47c
