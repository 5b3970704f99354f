#!/usr/bin/env bash
# Session 30, device call 1: session 29's unrun checks (the stage copy's
# own test, the graphed runs' bits, the hop), then the round trip with
# large inline tensors riding in the channel's region (2ba1dd1) against
# them serialized (--channel_in_region_from -1): two processes, one after
# the other, in this call.
set -uo pipefail
tar -xJf build-pack/dist.tar.xz
export LD_LIBRARY_PATH=$PWD/.dist/lib
b=.dist/bin
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 60 $b/moe_gpu_test --gtest_filter='*StageCopy*' 2>&1 | tail -3
timeout 90 $b/moe_graph_gpu_test 2>&1 | tail -2
timeout 90 $b/moe_hop_bench --tokens 1,8,64 --iters 300
for from in 65536 -1; do
  echo "== in_region_from $from"
  timeout 200 $b/moe_rpc_bench --iters 200 --tokens 1,64,512 --transport unix \
    --modes chan,chshm,chskip --channel_in_region_from $from 2>&1 | grep -v "\[info\]"
done
