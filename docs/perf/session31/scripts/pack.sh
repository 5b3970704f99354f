#!/usr/bin/env bash
# Packs the binaries of session 31's device calls (the tall tiles, #16) from
# a configured CUDA build (default: build, -gencode=arch=compute_90a,code=sm_90a)
# into build-pack/tall.tar.xz (.tdist: moe_gpu_test, moe_ws_gpu_test,
# moe_layer_gpu_test, moe_bench). Session 30's unrun calls keep their own
# pack (docs/perf/session30/scripts/pack.sh). Then: the device tool with
# carry ["build-pack"] and `bash docs/perf/session31/scripts/call1.sh`
# (call2.sh).
set -euo pipefail
b=${1:-build}
mkdir -p build-pack
ninja -C "$b" -j2 moe_gpu_test moe_ws_gpu_test moe_layer_gpu_test moe_bench
rm -rf .tdist
bash scripts/bundle.sh .tdist "$b"/bin/{moe_gpu_test,moe_ws_gpu_test,moe_layer_gpu_test,moe_bench} \
  >/dev/null
strip --strip-debug .tdist/bin/* .tdist/lib/* 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')" >.tdist/REV
tar -cJf build-pack/tall.tar.xz .tdist
rm -rf .tdist
ls -la build-pack
