#!/usr/bin/env bash
# Session 33, device call 4: the metrics' cost on a call's path (4ad2f3b)
# at one token through a channel, inline and with shm tensors: the server
# of d2e6035 (build-pack/s33rp.tar.xz) against the server of 4ad2f3b
# (build-pack/s33m.tar.xz), each with its own kplan_perf, old then new then
# old then new while time lasts.
set -uo pipefail
tar -xJf build-pack/s33rp.tar.xz && rm -rf .told && mv .tdist .told
tar -xJf build-pack/s33m.tar.xz
export NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/s33m}/logs
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for v in old new; do
    d=.tdist
    [ "$v" = old ] && d=.told
    echo "== $v ($(cat $d/REV)), round $round"
    LD_LIBRARY_PATH=$PWD/$d/lib TOKENS=1 MODES="channel chshm" DURATION_S=3 \
      timeout 40 bash scripts/request-path-perf.sh "$d/bin" "$out/$v$round" "$v" --devices=0 |
      tail -2
  done
done
tar -czf "$out.tar.gz" -C "$(dirname "$out")" logs
