# Sourced by the GPU check scripts (decode-gpu-check.sh,
# quant-decode-gpu-check.sh, moe-forms-gpu-check.sh,
# moe-compare-gpu-check.sh, moe-ncu-gpu-check.sh). `gpu_check_setup NAME
# [DIST]` is their preamble: the bundle folder DIST (default .dist, made by
# scripts/bundle.sh) on LD_LIBRARY_PATH and bin=DIST/bin, NVLink multicast
# off, logs in out=${OUT:-/tmp/NAME}/logs. `gpu_check_finish` packs the
# logs into $out.tar.gz (one file back from the device call), prints the
# status and exits with it. `step NAME SECONDS COMMAND...` runs COMMAND
# under a time limit into $out/NAME.log, says ok or FAILED (and sets
# status=1) with its seconds, then prints the log's lines that match
# $step_keep (an extended regex) and not $step_drop, the last ${TAIL:-20} of
# them. The caller sets out (gpu_check_setup does), step_keep and,
# optionally, step_drop. For the session calls of docs/perf/: `gpu_unpack
# PACK...` unpacks build-pack/PACK.tar.xz (docs/perf/session33/scripts/
# pack.sh's .tdist) into .t_PACK, replacing an older one, and prints its
# REV; `left SECONDS` is true while SECONDS are left before ${DEADLINE:-570}
# seconds of the script, else says the step is skipped; `pack_bench PACK
# NAME SECONDS ARGS...` is the step NAME running PACK's moe_bench with ARGS
# and --json $out/NAME.json; `ws_ncu PACK [NAME]` the step NAME (default
# ncu_PACK; name a second run of one pack, or its log is overwritten), ncu of
# the warp-specialised GEMMs of two Mixtral-8x7B layers at 4096 tokens
# (fused): their time and tensor-pipe activity. `gpu_call_setup NAME
# PACK...` is a session call's preamble: the packs unpacked, the first one's
# bundle set up as gpu_check_setup's DIST, the card and its clocks printed,
# and step_keep / step_drop set to keep the suites' verdicts and
# moe_bench's table rows.
status=0
gpu_unpack() {  # pack...
  local p
  for p in "$@"; do
    rm -rf ".t_$p"
    tar -xJf "build-pack/$p.tar.xz" && mv .tdist ".t_$p"
    echo "$p $(cat ".t_$p/REV")"
  done
}
pack_bench() {  # pack name seconds args...
  local p=$1 name=$2 limit=$3
  shift 3
  LD_LIBRARY_PATH=$PWD/.t_$p/lib step "$name" "$limit" ".t_$p/bin/moe_bench" "$@" \
    --json "$out/$name.json"
}
ws_ncu() {  # pack [name]
  LD_LIBRARY_PATH=$PWD/.t_$1/lib TAIL=12 step_keep='WsGrouped|gpu__time|tensor_op' \
    step "${2:-ncu_$1}" 25 ncu --clock-control none \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -k regex:WsGrouped -c 4 ".t_$1/bin/moe_bench" --budget_s 0.01 --sets 1 --warmup_s 0 \
    --check_tokens 0 --quant bf16 --shapes mixtral --tokens 4096 --fused on
}
left() {  # seconds
  [ $((${DEADLINE:-570} - SECONDS)) -ge "$1" ] || { echo "--- skipped: $SECONDS s gone"; return 1; }
}
step() {  # name seconds command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  if timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1; then
    echo "--- $name: ok ($((SECONDS - t0)) s)"
  else
    echo "--- $name: FAILED ($?, $((SECONDS - t0)) s)"
    status=1
  fi
  grep -E "$step_keep" "$out/$name.log" | grep -vE "${step_drop:-^$}" | cut -c1-200 |
    tail -n "${TAIL:-20}"
}

gpu_check_setup() {  # name [dist]
  dist=${2:-.dist}
  out=${OUT:-/tmp/$1}/logs
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$PWD/$dist/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NCCL_NVLS_ENABLE=0
  bin=$dist/bin
}
gpu_call_setup() {  # name pack...
  local name=$1
  shift
  gpu_unpack "$@"
  gpu_check_setup "$name" ".t_$1"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
  step_keep='FAIL|PASSED|ERROR SUMMARY|rooflines|^ *(Mixtral|Qwen3|DeepSeek)'
  step_drop='check |experts .* on the'
}
gpu_check_finish() {
  if tar -czf "$out.tar.gz" -C "$(dirname "$out")" logs; then rm -rf "$out"; else status=1; fi
  echo "status $status"
  exit "$status"
}
