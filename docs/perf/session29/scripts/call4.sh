#!/usr/bin/env bash
# Session 29, device call 4: after the review's fixes (stage copies with a
# 16-byte body and a byte tail, pinned buffers allocated mapped): the copy
# kernel's own test, the graphed runs' bits, the hop again.
set -uo pipefail
tar -xJf build-pack/dist.tar.xz
export LD_LIBRARY_PATH=$PWD/.dist/lib
b=.dist/bin
timeout 60 $b/moe_gpu_test --gtest_filter='*StageCopy*' 2>&1 | tail -3
timeout 60 $b/moe_graph_gpu_test 2>&1 | tail -2
timeout 60 $b/moe_hop_bench --tokens 1,8,64 --iters 300
