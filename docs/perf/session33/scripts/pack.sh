#!/usr/bin/env bash
# Packs the binaries of session 33's device calls (the decode kernels' L2
# plan; the tall tiles on by their rule; #16's table) from a configured CUDA
# build (default: build, -gencode=arch=compute_90a,code=sm_90a) into
# build-pack/s33.tar.xz (.tdist). Then: the device tool with carry
# ["build-pack"] and `bash docs/perf/session33/scripts/call1.sh` (call2.sh).
set -euo pipefail
b=${1:-build}
mkdir -p build-pack
rm -f build-pack/*.tar.xz
t=(moe_gpu_test moe_decode_gpu_test moe_ws_gpu_test moe_layer_gpu_test moe_graph_gpu_test moe_bench
  moe_hop_bench)
ninja -C "$b" -j2 "${t[@]}"
rm -rf .tdist
bash scripts/bundle.sh .tdist "${t[@]/#/$b/bin/}" >/dev/null
strip --strip-debug .tdist/bin/* .tdist/lib/* 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')" >.tdist/REV
tar -cJf build-pack/s33.tar.xz .tdist
rm -rf .tdist
ls -la build-pack
