#!/usr/bin/env bash
# Installs what is missing, builds, starts kplan-server on localhost:50051 and
# shows it working with the kplan CLI (CPU path when there is no GPU). The
# server is stopped at the end; pass --keep to leave it running.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
[ "${1:-}" = "--keep" ] && keep=1
bash scripts/install-deps.sh
bash scripts/build.sh -DKPLAN_BUILD_TESTS=OFF -DKPLAN_BUILD_BENCHMARKS=OFF >/dev/null
bin=${BUILD_DIR:-build}/bin
addr=${KPLAN_DEMO_ADDR:-127.0.0.1:50051}
"$bin/kplan-server" --listen="$addr" >/tmp/kplan-demo-server.log 2>&1 &
pid=$!
trap '[ $keep = 1 ] || { kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; }' EXIT
for _ in $(seq 50); do "$bin/kplan" health --server "$addr" >/dev/null 2>&1 && break; sleep 0.2; done

run() { echo; echo "\$ $*"; "$@"; }
run "$bin/kplan" health --server "$addr"
run "$bin/kplan" info --server "$addr"
run "$bin/kplan" resolve --server "$addr" --platform cuda:10.0 --moe-backend flashinfer-moe-ep-cutedsl \
    --ir-op-priority rms_norm=native,vllm_c
run "$bin/kplan" resolve --server "$addr" --platform cuda:9.0 --moe-backend auto \
    --num-experts 256 --experts-per-token 8 --hidden-size 7168 --intermediate-size 2048 \
    --weight-quant kFp8Static128BlockSym --activation-quant kFp8Dynamic128Sym \
    --scoring-func sigmoid --renormalize --num-expert-group 8 --topk-group 4 --e-score-correction-bias
echo
echo "\$ kplan resolve --moe-backend triton --all2all-backend passthrough   # a bad request"
"$bin/kplan" resolve --server "$addr" --moe-backend triton --all2all-backend passthrough || true
if [ $keep = 1 ]; then
  echo; echo "kplan-server is running on $addr (pid $pid, log /tmp/kplan-demo-server.log)"
fi
