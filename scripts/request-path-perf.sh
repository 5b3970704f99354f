#!/usr/bin/env bash
# The RunMoE request path hop by hop (docs/PERF.md): starts kplan-server on a
# Unix socket with the given flags and its metrics port, then for every mode
# (inline: bytes over gRPC; shm: tensors in a POSIX region, gRPC; channel:
# inline bytes through a shared-memory call channel with 32 MiB areas, so
# large tensors ride in its region; chshm: the shm call through a channel)
# and token count runs kplan_perf at concurrency 1
# and prints the client's percentiles beside the server's mean per hop
# (decode, route, queue, device, encode, serialize; the differences of
# kplan_hop_seconds over the run, warm-up included). kplan_perf's JSON goes to OUT_DIR.
#
# usage: scripts/request-path-perf.sh BIN_DIR OUT_DIR LABEL [kplan-server flags...]
#   env: TOKENS ("1 8 64 512"), MODES ("inline shm"; also channel, chshm), DURATION_S (3),
#        PERF_FLAGS (more kplan_perf flags, e.g. the set's shape), METRICS_PORT (9464)
# e.g.   scripts/request-path-perf.sh build/bin /tmp/rp graphs --devices=0 --cuda_graphs
set -euo pipefail
bin=$1
out=$2
label=$3
shift 3
mkdir -p "$out"
sock=/tmp/kplan-rp-$$.sock
metrics_port=${METRICS_PORT:-9464}
"$bin/kplan-server" --listen="unix:$sock" --allow_shared_memory --metrics_listen="127.0.0.1:$metrics_port" \
  --log_level=warn "$@" >"$out/server_$label.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -S "$sock" ] && break; kill -0 "$pid" || break; sleep 0.1; done
[ -S "$sock" ] || { cat "$out/server_$label.log"; exit 1; }

# RunMoE's hop sums and counts from the metrics page, one line of k=v.
metrics() {
  python3 - "$metrics_port" <<'PY'
import re, sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
v = {}
for line in page.splitlines():
    if 'RunMoE' not in line:
        continue
    m = re.match(r'kplan_hop_seconds_(sum|count)\{.*hop="(\w+)".*\} (\S+)', line)
    if m:  # summed over RunMoE's methods (gRPC, the channels)
        v[f"{m[2]}_{m[1]}"] = v.get(f"{m[2]}_{m[1]}", 0.0) + float(m[3])
    m = re.match(r'kplan_request_duration_seconds_(sum|count)\{.*\} (\S+)', line)
    if m:
        v[f"total_{m[1]}"] = v.get(f"total_{m[1]}", 0.0) + float(m[2])
print(" ".join(f"{k}={x}" for k, x in sorted(v.items())))
PY
}

printf "%-8s %-7s %6s %9s %9s %9s  %s\n" label mode tokens "p50 us" "p99 us" "req/s" "server mean us"
for mode in ${MODES:-inline shm}; do
  for tokens in ${TOKENS:-1 8 64 512}; do
    flags=()
    case $mode in
      inline) ;;
      shm) flags+=(--shm) ;;
      channel) flags+=(--channel --channel_capacity 33554432) ;;
      chshm) flags+=(--channel --shm --channel_capacity 33554432) ;;
      *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    before=$(metrics)
    json="$out/${label}_${mode}_${tokens}.json"
    # shellcheck disable=SC2086
    "$bin/kplan_perf" --server "unix:$sock" --concurrency 1 --tokens "$tokens" \
      --duration_s "${DURATION_S:-3}" --warmup_s 1 --json "$json" "${flags[@]}" \
      ${PERF_FLAGS:-} >/dev/null
    after=$(metrics)
    python3 - "$label" "$mode" "$tokens" "$json" "$before" "$after" <<'PY'
import json, sys
label, mode, tokens, path, before, after = sys.argv[1:7]
row = json.load(open(path))["rows"][0]
a = dict(kv.split("=") for kv in before.split())
b = dict(kv.split("=") for kv in after.split())
hops = []
for h in ("total", "decode", "route", "queue", "device", "answer_wait", "encode", "serialize"):
    if f"{h}_sum" in b:
        n = float(b[f"{h}_count"]) - float(a.get(f"{h}_count", 0))
        s = float(b[f"{h}_sum"]) - float(a.get(f"{h}_sum", 0))
        if n > 0:  # a hop this mode's calls do not take (serialize: gRPC's only)
            hops.append(f"{h} {1e6 * s / n:.1f}")
print(f"{label:<8} {mode:<7} {tokens:>6} {row['p50_us']:>9.1f} {row['p99_us']:>9.1f} "
      f"{row['req_per_s']:>9.1f}  {', '.join(hops)}")
PY
  done
done
