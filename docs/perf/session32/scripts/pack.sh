#!/usr/bin/env bash
# Packs the binaries of session 32's device call (the tall tiles on by
# their rule, #16) from a configured CUDA build (default: build,
# -gencode=arch=compute_90a,code=sm_90a) into build-pack/s32.tar.xz
# (.tdist). Then: the device tool with carry ["build-pack"] and
# `bash docs/perf/session32/scripts/call1.sh`.
set -euo pipefail
b=${1:-build}
mkdir -p build-pack
t=(moe_gpu_test moe_ws_gpu_test moe_layer_gpu_test moe_graph_gpu_test moe_bench)
ninja -C "$b" -j2 "${t[@]}"
rm -rf .tdist
bash scripts/bundle.sh .tdist "${t[@]/#/$b/bin/}" >/dev/null
strip --strip-debug .tdist/bin/* .tdist/lib/* 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')" >.tdist/REV
tar -cJf build-pack/s32.tar.xz .tdist
rm -rf .tdist
ls -la build-pack
