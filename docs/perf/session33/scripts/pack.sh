#!/usr/bin/env bash
# Packs binaries of session 33's device calls from a configured CUDA build
# ($B, default build: -gencode=arch=compute_90a,code=sm_90a) into
# build-pack/NAME.tar.xz (.tdist, with their non-system libraries):
#   pack.sh s33 moe_gpu_test moe_decode_gpu_test moe_ws_gpu_test moe_layer_gpu_test \
#     moe_graph_gpu_test moe_bench moe_hop_bench            (call1.sh, call2.sh)
#   pack.sh s33rp kplan-server kplan_perf moe_bench moe_hop_bench moe_rpc_bench  (call3.sh)
# Then: the device tool with carry ["build-pack"] and the call's script.
# Other packs in build-pack stay (and travel with the carry).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NAME TARGET... (B=build dir)" >&2
  exit 2
fi
b=${B:-build}
name=$1
shift
t=("$@")
mkdir -p build-pack
ninja -C "$b" -j2 "${t[@]}"
rm -rf .tdist
bash scripts/bundle.sh .tdist "${t[@]/#/$b/bin/}" >/dev/null
strip --strip-debug .tdist/bin/* .tdist/lib/* 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')" >.tdist/REV
tar -cJf "build-pack/$name.tar.xz" .tdist
rm -rf .tdist
ls -la build-pack
