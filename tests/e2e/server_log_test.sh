#!/usr/bin/env bash
# The server's logs: with --log_format=json every line is one JSON object
# with time, level and message; a failed call is logged at warning with its
# method, gRPC code, error text and field; the text format carries the same
# fields as key=value; gRPC's own lines (a failed TLS handshake) are JSON
# objects too, marked source=grpc. An unknown --log_format exits 2.
set -euo pipefail
bin=$1
work=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
source "$(dirname "$0")/../../scripts/server-port.sh"

# Starts a server with the given log format (and further flags); sets addr
# and server_pid.
start_server() {
  "$bin/kplan-server" --listen=127.0.0.1:0 --exit_timeout=5s --log_format="$@" \
    >"$work/$1.log" 2>&1 &
  server_pid=$!
  local port
  port=$(kplan_server_port "$work/$1.log" "$server_pid" 10)
  addr=127.0.0.1:$port
}
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid"
  server_pid=""
}
# Two failed calls: INVALID_ARGUMENT with a field, NOT_FOUND.
tls=()
fail_calls() {
  ! "$bin/kplan" resolve --server "$addr" "${tls[@]}" --moe-backend triton \
    --all2all-backend passthrough 2>/dev/null
  ! "$bin/kplan" unload --server "$addr" "${tls[@]}" --id no-such-set 2>/dev/null
}

bash "$(dirname "$0")/../rpc/make_test_certs.sh" "$work/pki" >/dev/null
start_server json --tls_cert="$work/pki/server.pem" --tls_key="$work/pki/server.key"
tls=(--tls-ca "$work/pki/ca.pem")
fail_calls
# Plaintext to a TLS port: gRPC itself logs the failed handshake, and the
# CLI's error says that nothing answered over plaintext.
! "$bin/kplan" health --server "$addr" --timeout 1 2>"$work/plain.txt"
grep -q "no kplan-server answered at $addr over plaintext (.*--tls-ca in the CLI)" "$work/plain.txt" ||
  { cat "$work/plain.txt"; exit 1; }
tls=()
stop_server
python3 - "$work/json.log" <<'PY'
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
objs = [json.loads(l) for l in lines]  # every line must be one JSON object
for o in objs:
    assert {"time", "level", "message"} <= o.keys(), o
warnings = [o for o in objs if o["level"] == "warning" and "method" in o]
by_code = {o["code"]: o for o in warnings}
bad = by_code.get("INVALID_ARGUMENT")
assert bad and bad["method"] == "ResolveKernelConfig", warnings
assert bad["field"] == "parallel.all2all_backend", bad
assert "all2all_backend='passthrough'" in bad["error"], bad
missing = by_code.get("NOT_FOUND")
assert missing and missing["method"] == "UnloadExperts", warnings
assert any("server stopped" in o["message"] for o in objs)
grpc = [o for o in objs if o.get("source") == "grpc"]
assert any(o["level"] == "error" and "Handshake failed" in o["message"] and
           re.fullmatch(r"[\w.]+:\d+", o["file"]) for o in grpc), grpc
PY

start_server text
fail_calls
stop_server
grep -q "\[warning\] ResolveKernelConfig failed method=ResolveKernelConfig code=INVALID_ARGUMENT error=.*field=parallel.all2all_backend" "$work/text.log" ||
  { cat "$work/text.log"; exit 1; }
grep -q "\[warning\] UnloadExperts failed method=UnloadExperts code=NOT_FOUND" "$work/text.log"

set +e
"$bin/kplan-server" --log_format=xml 2>"$work/err.txt"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q -- "--log_format: unknown format 'xml'" "$work/err.txt"
echo "server_log_test: ok"
