#!/usr/bin/env bash
# Packs the binaries of session 30's unrun device calls from a configured
# CUDA build (default: build, -gencode=arch=compute_90a,code=sm_90a):
#   build-pack/dist.tar.xz   call 2 (.dist: moe_rpc_bench, kplan-server,
#                            kplan_perf, moe_hop_bench, shmcopy)
#   build-pack/quant.tar.xz  call 3 (.qdist: moe_bench_new and
#                            moe_quant_gpu_test_new built with session 27's
#                            swapped-operand-buffers patch, moe_bench_old
#                            without it)
# Run from the repository root with a clean kernels/ tree (the patch is
# applied and reverted here). Then: the device tool with carry
# ["build-pack"] and `bash docs/perf/session30/scripts/call2.sh` (call3.sh).
set -euo pipefail
b=${1:-build}
patch=docs/perf/session27/swapped-operand-buffers.patch
here=docs/perf/session30/scripts
mkdir -p build-pack
ninja -C "$b" -j2 moe_rpc_bench kplan-server kplan_perf moe_hop_bench moe_bench moe_quant_gpu_test
tmp=$(mktemp -d)
g++ -O2 "$here/shmcopy.cc" -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart \
  -o "$tmp/shmcopy"
rm -rf .dist .qdist
bash scripts/bundle.sh .dist "$b"/bin/{moe_rpc_bench,kplan-server,kplan_perf,moe_hop_bench} \
  "$tmp/shmcopy" >/dev/null
cp "$b/bin/moe_bench" "$tmp/moe_bench_old"
git apply "$patch"
trap 'git apply -R "$patch"' EXIT
ninja -C "$b" -j2 moe_bench moe_quant_gpu_test
cp "$b/bin/moe_bench" "$tmp/moe_bench_new"
cp "$b/bin/moe_quant_gpu_test" "$tmp/moe_quant_gpu_test_new"
git apply -R "$patch"
trap - EXIT
ninja -C "$b" -j2 moe_bench moe_quant_gpu_test  # back to the tree's kernels
bash scripts/bundle.sh .qdist "$tmp"/{moe_bench_new,moe_bench_old,moe_quant_gpu_test_new} >/dev/null
strip --strip-debug .dist/bin/* .dist/lib/* .qdist/bin/* .qdist/lib/* 2>/dev/null || true
tar -cJf build-pack/dist.tar.xz .dist
tar -cJf build-pack/quant.tar.xz .qdist
rm -rf .dist .qdist "$tmp"
ls -la build-pack
