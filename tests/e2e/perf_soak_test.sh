#!/usr/bin/env bash
# The load tool against the kplan-server binary on the CPU path, over a Unix
# socket, CI-sized: 256 concurrent closed-loop clients, four steps of 3 s
# after 1 s of warm-up each, on the same connections. No request may
# fail, the JSON must hold every step with requests, and the server's
# resident memory after the last step may exceed what it was after the
# second (the first two warm up the connections and malloc's arenas) by at
# most 5% or 8 MiB, whichever is more: malloc's high-water mark still
# creeps up by a few MiB when a latency spike puts more requests in flight
# than before, while a leak of about 1 KiB per request passes 8 MiB over the
# last two steps' 7,000-10,000 requests (the test prints bytes per request).
# A 5-minute soak is the same command with more steps (not recorded yet).
set -euo pipefail
bin=$1
work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

sock="$work/kplan.sock"
"$bin/kplan-server" --listen="unix:$sock" --devices=none --exit_timeout=5s \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$work/server.log" >&2; echo "server did not start" >&2; exit 1; }

"$bin/kplan_perf" --server "unix:$sock" --concurrency 256,256,256,256 --tokens 1 \
  --num_experts 16 --hidden 256 --intermediate 128 --top_k 2 --duration_s 3 --warmup_s 1 \
  --server_pid "$server_pid" --json "$work/perf.json" --csv "$work/perf.csv"

/usr/bin/python3 - "$work/perf.json" "$work/perf.csv" <<'PY'
import csv, json, sys
data = json.load(open(sys.argv[1]))
rows = data["rows"]
assert len(rows) == 4, rows
for r in rows:
    assert r["concurrency"] == 256 and r["tokens"] == 1, r
    assert r["errors"] == 0, r
    assert r["requests"] > 0 and r["req_per_s"] > 0, r
    assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"], r
    assert r["server_rss_after"] > 0, r
first, last = rows[1]["server_rss_after"], rows[-1]["server_rss_after"]
growth = last - first
served = rows[2]["requests"] + rows[3]["requests"]
print(f"server RSS after warm-up {first / 2**20:.1f} MiB, after the last step "
      f"{last / 2**20:.1f} MiB ({100 * growth / first:+.1f}%, "
      f"{growth / max(served, 1):.0f} bytes per request over {served} requests)")
assert growth <= max(0.05 * first, 8 << 20), f"server RSS grew {growth / 2**20:.1f} MiB under load"
assert len(list(csv.DictReader(open(sys.argv[2])))) == 4
PY

kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
echo "perf soak ok"
