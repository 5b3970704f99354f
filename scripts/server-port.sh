# Sourced by the check scripts: kplan_server_port LOG PID [SECONDS] prints the
# port a kplan-server started with --listen=HOST:0 reports in its log
# ("listening on ... (port N)" or "(port N, TLS)"), waiting up to SECONDS (default 60) while PID
# lives; on failure prints the log's tail to stderr and returns 1. The log may
# not exist yet when it is first read (the server's shell has not opened it).
kplan_server_port() {
  local log=$1 pid=$2 tries=$((${3:-60} * 10)) port
  for _ in $(seq "$tries"); do
    port=$(sed -n 's/.*listening on .*(port \([0-9]*\)[,)].*/\1/p' "$log" 2>/dev/null || true)
    [ -n "$port" ] && { echo "$port"; return 0; }
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "kplan-server did not start ($log):" >&2
  tail -5 "$log" >&2 2>/dev/null
  return 1
}
